"""The image task's dedup: only a Bloom filter's "maybe" looks at the interval's stored record ids."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.rowtable.bloom import IdBloom
from deltawheel.statestore.writepath.image.idhash import id_hashes
from deltawheel.statestore.writepath.image.idsfiles import IdsFile, apart_held, pick_ids, within

from ..usercode.columns import Input
from .ids import HeldIds, already_seen
from .spec import ImageSpec

__all__ = ["BLOOMS_MAX", "BLOOM_BUILD_SHARE", "BloomCounts", "bloom_paths", "bloom_for", "cached_bloom", "carry_bloom", "dedup",
           "remember_bloom"]

BLOOMS_MAX = 64  # Bloom filters kept
# the interval images' Bloom filters of record ids, by the image's file paths (as the image cache)
_BLOOMS: "OrderedDict[tuple[str, ...], IdBloom]" = OrderedDict()
BLOOM_ERROR_RATE = 0.01  # at the filter's capacity
BLOOM_MIN_CAPACITY = 4_096  # ids; a filter is sized for twice its image's ids, at least this
BLOOM_BATCHES = 32  # ... and for at least this many batches of the size of the one that built it
BLOOM_BUILD_SHARE = 64  # no filter is built for a batch with fewer records than 1/this of the stored ids


@dataclass(frozen=True)
class BloomCounts:
    """One interval's filter check: records checked, "maybe" answers, of which not seen, memory."""

    checked: int = 0
    maybe: int = 0
    false_pos: int = 0
    nbytes: int = 0


def dedup(spec: ImageSpec, iv: int, image: Any, inp: Input, ids: HeldIds,
          live: list[IdsFile], legacy: Any) -> tuple[IdBloom | None, list[bool] | None, BloomCounts]:
    """(the Bloom filter, per record whether its row holds its id, the counts) for this interval's ids."""
    import numpy as np
    import pyarrow as pa

    if not spec.comp.exactly_once or not inp.n:
        return None, None, BloomCounts()
    paths = bloom_paths(spec, iv)
    n_apart = sum(f.flat.num_rows for f in live) + legacy.num_rows
    bloom: IdBloom | None = None
    apart = None
    if paths not in _BLOOMS and inp.n * BLOOM_BUILD_SHARE < n_apart:
        # no filter, and few records against many stored ids (a restart's first batch): looking the
        # candidates up costs less than hashing and adding every stored id; no filter is kept
        flags = np.ones(inp.n, dtype=bool)
    else:
        apart = None if paths in _BLOOMS else apart_held(live, legacy)  # all the ids: to build the filter
        bloom = bloom_for(paths, image, apart, inp.n)
        # the filters hash ids with ``id_hashes`` (from the column's buffers, no Python string per id)
        flags = bloom.might_contain_many(inp.hashes, hashes=inp.hashes)
    maybe = int(flags.sum())
    if not maybe:  # certain: none of them was seen; the stored ids are not looked at
        return bloom, None, BloomCounts(inp.n, 0, 0, bloom.nbytes if bloom is not None else 0)
    if n_apart:
        if maybe * 8 < n_apart:
            # few candidates: pick the stored ids equal to one of them first (pick_ids)
            at = np.flatnonzero(flags)
            cand = inp.table.column("record_id").combine_chunks().take(pa.array(at))
            apart = pick_ids(live, cand, inp.hashes[at], legacy)
        elif apart is None:
            apart = apart_held(live, legacy)
        held = within(apart, spec.horizon_ms)
        ids = HeldIds(ids.held, pa.concat_tables([ids.table, held]))
    seen = already_seen(spec.comp, inp, ids, maybe=flags)
    if bloom is None:  # the filter was not asked
        return None, seen, BloomCounts()
    return bloom, seen, BloomCounts(inp.n, maybe, maybe - (sum(seen) if seen else 0), bloom.nbytes)


def bloom_for(paths: tuple[str, ...], image: Any, apart: Any, batch: int) -> IdBloom:
    """The interval's filter: cached by ``paths``, else built and sized for many batches more."""
    import pyarrow.compute as pc

    hit = _BLOOMS.get(paths)
    if hit is not None:
        _BLOOMS.move_to_end(paths)
        return hit
    import numpy as np

    hashes: Any = np.concatenate([id_hashes(pc.struct_field(pc.list_flatten(image.column("record_ids")), "record_id")),
                             id_hashes(apart.column("record_id"))])
    bloom = IdBloom(max(2 * len(hashes), BLOOM_MIN_CAPACITY, BLOOM_BATCHES * batch), error_rate=BLOOM_ERROR_RATE)
    bloom.add_many(hashes, hashes=hashes)
    remember_bloom(paths, bloom)
    return bloom


def bloom_paths(spec: ImageSpec, iv: int) -> tuple[str, ...]:
    """What interval ``iv``'s Bloom filter is cached by: its state files and its ids files."""
    return tuple(sorted((*spec.state_files(iv), *spec.ids_files(iv))))


def carry_bloom(bloom: IdBloom | None, old_paths: tuple[str, ...], new_paths: tuple[str, ...],
                new_hashes: Any) -> None:
    """Keep the filter of ``old_paths`` as that of ``new_paths``, extended by ``new_hashes``."""
    if bloom is None:
        bloom = cached_bloom(old_paths)
    if bloom is None:
        return
    if new_hashes is not None:
        bloom.add_many(new_hashes, hashes=new_hashes)
    if not bloom.full():
        remember_bloom(new_paths, bloom)


def cached_bloom(paths: tuple[str, ...], *, forget: bool = False) -> IdBloom | None:
    """The filter this worker holds for ``paths``, if any (``forget``: and drop it)."""
    return _BLOOMS.pop(paths, None) if forget else _BLOOMS.get(paths)


def remember_bloom(paths: tuple[str, ...], bloom: IdBloom) -> None:
    """Keep ``bloom`` as the filter of the files ``paths`` (the oldest beyond ``BLOOMS_MAX`` leave)."""
    _BLOOMS[paths] = bloom
    _BLOOMS.move_to_end(paths)
    while len(_BLOOMS) > BLOOMS_MAX:
        _BLOOMS.popitem(last=False)
