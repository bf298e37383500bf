"""State that the code's codec does not decode: a computation whose ``codec`` changed without a new
``state_version`` reads its rows as they were written (the row names its codec), and state bytes
that decode under no codec are a typed refusal naming the key (``UserCodeError``, exit 7), or,
under ``ErrorPolicy.DEAD_LETTER``, the key's records become dead letters with the reason and its
row stays as it was. Run through ``run_key``, the one implementation of a key's batch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from deltawheel.executor.tasks.usercode.keyrun import run_key
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import CodecError, exit_code
from hypothesis import given, settings
from hypothesis import strategies as st

from deltawheel import Computation, ErrorPolicy, Record, UserCodeError


class Totals(Computation):
    """The state: ``{"n": count, "seen": [record ids]}``."""

    name = "totals"
    inputs = {"clicks": "user"}
    codec = "json"

    def process_record(self, ctx: Any, record: Any) -> None:
        st = ctx.state or {"n": 0, "seen": []}
        ctx.state = {"n": st["n"] + 1, "seen": [*st["seen"], record.record_id]}


def _with(codec: str, policy: ErrorPolicy = ErrorPolicy.FAIL) -> Computation:
    cls = type(f"Totals_{codec}", (Totals,), {"codec": codec, "error_policy": policy})
    return cls()  # type: ignore[no-any-return]


def _rec(rid: str) -> Record:
    return Record(key="ann", value={"user": "ann"}, timestamp_ms=1, record_id=rid, stream="clicks")


def _run(comp: Computation, row: Any, rids: list[str]) -> Any:
    return run_key(comp, key="ann", interval=0, row=row, records=[_rec(r) for r in rids], input_watermark_ms=None,
                   now_ms=0)


@settings(max_examples=30, deadline=None)
@given(codecs=st.lists(st.sampled_from(["json", "msgpack", "int64map"]), min_size=2, max_size=5))
def test_a_codec_changed_without_a_state_version_reads_the_state_as_written(codecs: list[str]) -> None:
    row, ids = None, []
    for i, codec in enumerate(codecs):
        out = _run(_with(codec), row, [f"r{i}"])
        ids.append(f"r{i}")
        row = out.row
        assert row is not None and row.codec == codec  # written with the code's codec from then on
        assert get_codec(codec).decode(row.state) == {"n": i + 1, "seen": ids}


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_state_no_codec_decodes_is_a_typed_refusal_naming_the_key_or_dead_letters(codec: str) -> None:
    row = _run(_with(codec), None, ["r0"]).row
    assert row is not None
    damaged = dataclasses.replace(row, state=b"\xc1{\"n\":")  # neither JSON nor msgpack
    with pytest.raises(UserCodeError, match=r"^totals: user code failed for key 'ann' on record 'r1' .*"
                                            rf"CodecError: {codec} codec cannot decode 6 bytes") as err:
        _run(_with(codec), damaged, ["r1"])
    assert isinstance(err.value.__cause__, CodecError) and exit_code(err.value) == 7
    out = _run(_with(codec, ErrorPolicy.DEAD_LETTER), damaged, ["r1", "r2"])
    assert [(r.record_id, why.split(":")[0]) for r, why in out.dead_letters] == [("r1", "CodecError"),
                                                                                   ("r2", "CodecError")]
    assert out.row is not None and (out.row.state, out.row.codec) == (damaged.state, codec)  # as it was
