"""The image path's Bloom filter of record ids (``IdBloom``): no false negatives, and its answer
is that of its definition (every one of an id's k bits set), whatever its fill."""

from __future__ import annotations

import numpy as np
import pytest
from deltawheel.statestore.rowtable.bloom import IdBloom


def _by_definition(bloom: IdBloom, ids: list[str]) -> np.ndarray:
    """Maybe added iff each of the id's k bit positions (those ``add_many`` sets) is set."""
    pos = bloom._positions(ids)
    bits = np.unpackbits(bloom._bits, bitorder="little")
    return bits[pos.astype(np.int64)].astype(bool).all(axis=1)


@pytest.mark.parametrize("added", [0, 1, 500, 5_000, 40_000])
def test_answers_are_the_definitions_and_never_miss_an_added_id(added: int) -> None:
    bloom = IdBloom(4_096, error_rate=0.01)  # 40,000 ids: ten times over capacity, most bits set
    ids = [f"r{i}" for i in range(added)]
    bloom.add_many(ids)
    probe = ids[::7] + [f"new{i}" for i in range(20_000)]
    got = bloom.might_contain_many(probe)
    assert got.dtype == bool and len(got) == len(probe)
    assert got[: len(ids[::7])].all()  # an added id is always "maybe"
    assert (got == _by_definition(bloom, probe)).all()
    fp = got[len(ids[::7]):].mean()
    if added <= 4_096:
        assert fp <= 0.02  # at or under capacity: about the error rate
    if added == 40_000:
        assert 0.3 < fp < 1.0  # far over it: many false "maybe"s, so many ids pass several probes


def test_no_ids_no_answers() -> None:
    assert IdBloom(10).might_contain_many([]).tolist() == []


def test_hashes_computed_once_give_the_same_filter_and_answers() -> None:
    ids = [f"r{i}" for i in range(3_000)]
    probe = ids[::5] + [f"new{i}" for i in range(3_000)]
    a, b = IdBloom(8_192), IdBloom(8_192)
    a.add_many(ids)
    b.add_many(ids, hashes=IdBloom.hashes(ids))
    assert (a._bits == b._bits).all() and a.count == b.count == 3_000
    assert a._bits.any()
    got = b.might_contain_many(probe, hashes=IdBloom.hashes(probe))
    assert (got == a.might_contain_many(probe)).all() and got[:600].all()


@pytest.mark.parametrize("m", [64, 959, 19_170_117, 2**30 - 3, 2**30 + 7, 2**40 + 1])
def test_bit_positions_are_the_double_hashing_formula(m: int) -> None:
    """Probe i of an id is (h1 + i * h2) % m (h1, h2: the hash's low and high halves, h2 made odd),
    in the int32 and the int64 range of m alike (a filter's bits are not needed: none allocated)."""
    bloom = object.__new__(IdBloom)
    bloom.m, bloom.k = m, 9
    hashes = np.array([0, 1, 2**32 - 1, 2**32, 2**63 + 12_345, 2**64 - 1, 0x9E3779B97F4A7C15], dtype=np.uint64)
    want = [[((h & 0xFFFFFFFF) + i * ((h >> 32) | 1)) % m for i in range(9)] for h in map(int, hashes)]
    assert bloom._positions([""] * len(hashes), hashes).tolist() == want


@pytest.mark.parametrize("seed", [1, 2])
def test_ids_added_at_once_or_a_few_at_a_time_set_the_same_bits(seed: int) -> None:
    """A filter built from an image's ids (many at once, a byte per bit) equals one grown a batch at a
    time (a few ids per call, bit by bit), whatever the cut."""
    rng = np.random.default_rng(seed)
    ids = [f"r{i}-{rng.integers(1 << 40)}" for i in range(20_000)]
    whole, pieces = IdBloom(50_000), IdBloom(50_000)
    whole.add_many(ids[:15_000])
    cuts = np.sort(rng.choice(np.arange(1, 5_000), 400, replace=False))
    for part in np.split(np.array(ids[15_000:]), cuts):
        whole.add_many(part.tolist())  # a few at a time into a filter already holding many
    for part in np.split(np.array(ids), np.sort(rng.choice(np.arange(1, 20_000), 4_000, replace=False))):
        pieces.add_many(part.tolist())
    assert whole.count == pieces.count == len(ids)
    assert np.array_equal(whole._bits, pieces._bits)
    assert whole.might_contain_many(ids).all()
