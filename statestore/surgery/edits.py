"""What a repair statement does to each key (:class:`Edits`), and the pieces the repair modules share."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..codecs import get_codec
from ..exceptions import BadRecordError, CodecError, RepairStatementError
from ..rowtable.rows import KeyRow, interval_of, validate_key

__all__ = ["Edit", "Edits", "encode_state", "set_state", "new_key_row", "check_new_key", "run_sql",
           "check_computation"]

#: a key's row now (None: no row) -> its row after (None: no row)
Edit = Callable[[KeyRow | None], KeyRow | None]


@dataclass(frozen=True)
class Edits:
    """``by_key``: key -> (its interval, its edit); ``skip_delivery``: checkpointed productions dropped."""

    by_key: Mapping[str, tuple[int, Edit]]
    skip_delivery: frozenset[str] = field(default_factory=frozenset)

    @property
    def intervals(self) -> list[int]:
        """The intervals touched, sorted."""
        return sorted({iv for iv, _ in self.by_key.values()})

    def apply(self, rows: tuple[KeyRow, ...]) -> list[KeyRow]:
        """``rows`` (one interval set's rows now) with the edits applied, new keys added."""
        out: list[KeyRow] = []
        seen = set()
        for r in rows:
            seen.add(r.key)
            e = self.by_key.get(r.key)
            after = r if e is None else e[1](r)
            if after is not None:
                out.append(after)
        for k, (_, edit) in sorted(self.by_key.items()):
            if k not in seen and (after := edit(None)) is not None:
                out.append(after)
        return out


def set_state(key: str, text: str | None, *, delete: bool) -> Edit:
    """The edit that sets ``key``'s state to ``text`` (JSON) in its row's codec, or deletes the row."""
    def edit(row: KeyRow | None) -> KeyRow | None:
        if row is None or delete:
            return None
        return row.with_(state=encode_state(key, text, row.codec))
    return edit


def encode_state(key: str, text: str | None, codec: str) -> bytes | None:
    """The bytes of the new state ``text`` (JSON; None: no state) of ``key`` in ``codec``.

    Raises:
        RepairStatementError: not JSON; a pickled codec; a value the codec cannot encode or would
            not give back as it is.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise RepairStatementError(f"the new state of key {key!r} is not JSON ({text[:80]!r}): the expression "
                                   "must give JSON text") from exc
    if codec.split("@")[0] == "pickle":
        raise RepairStatementError(f"key {key!r} holds pickled state: a repair cannot re-encode it from JSON "
                                   "(pickle is Python's own); change it with the computation's code")
    try:
        c = get_codec(codec)
        data = c.encode(value)
        back = c.decode(data)
    except CodecError as exc:
        raise RepairStatementError(f"the new state of key {key!r} cannot be encoded with its codec "
                                   f"{codec!r}: {exc}") from exc
    if back != value:
        raise RepairStatementError(f"the new state of key {key!r} would not decode as given with codec "
                                   f"{codec!r} ({json.dumps(value)[:80]} -> {back!r:.80}); refused")
    return data


def new_key_row(computation: str, key: str, *, num_intervals: int, state: bytes | None, codec: str) -> KeyRow:
    """A key a repair inserts; timer numbers start at a fresh 40-bit range (no production id repeats)."""
    seq = int.from_bytes(uuid.uuid4().bytes[:5], "big") << 23
    return KeyRow(computation=computation, key=key, interval=interval_of(key, num_intervals), state=state,
                  codec=codec, timer_seq=seq)


def check_new_key(key: Any) -> str:
    """``key`` if a repair may insert it.

    Raises:
        RepairStatementError: NULL, empty, starting with NUL (deltawheel's own rows), too long.
    """
    if key is None:
        raise RepairStatementError("the statement inserts a NULL key: every inserted row needs a key")
    try:
        return validate_key(key)
    except BadRecordError as exc:
        raise RepairStatementError(f"the statement inserts key {key!r}, which is not a usable key: {exc}") from exc


def check_computation(text: str, computation: str) -> None:
    """Refuse (RepairStatementError) a statement whose text names another computation's rows."""
    import re

    others = sorted({c for c in re.findall(r"computation\s*(?:=|==)\s*'([^']*)'", text, re.IGNORECASE)
                     if c != computation})
    if others:
        raise RepairStatementError(f"the statement names rows of computation {', '.join(map(repr, others))}, and "
                                   f"this repair is of {computation!r} (--computation): a repair changes one "
                                   "computation's rows")


def run_sql(spark: Any, query: str, *, what: str) -> list[Any]:
    """``spark.sql(query).collect()``, the user's SQL errors as :class:`RepairStatementError`.

    Raises:
        RepairStatementError: Spark's AnalysisException / ParseException on the user's SQL.
    """
    try:
        return list(spark.sql(query).collect())
    except Exception as exc:
        if type(exc).__name__ not in ("AnalysisException", "ParseException", "IllegalArgumentException",
                                      "PythonException", "SparkRuntimeException", "NumberFormatException"):
            raise
        raise RepairStatementError(f"the statement is not valid on {what}: "
                                   f"{str(exc).strip().splitlines()[0][:300]}") from exc
