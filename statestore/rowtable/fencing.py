"""Sequencer fencing: Delta's own commit protocol as MillWheel's mediator (docs/fencing.md).

Every commit is one ``MERGE`` carrying the fence row (``FENCE_KEY``) of each touched interval,
whose first clause raises ``DELTAWHEEL_STALE_SEQUENCER`` where the stored sequencer is newer."""

from __future__ import annotations

import re
import time
from typing import Callable, Iterable, Mapping, TypeVar

from ..exceptions import CommitConflictError, StaleSequencerError
from .inputfiles import union_sql
from .rows import rows_schema_ddl

__all__ = ["STALE_MARKER", "REPLACE_FILES_OP", "merge_sql", "translate_commit_error", "is_conflict", "on_conflict_again"]

STALE_MARKER = "DELTAWHEEL_STALE_SEQUENCER"
REPLACE_FILES_OP = "replace_files"  # a fence row whose input-file set replaces the stored one

_CONFLICT = re.compile(r"Concurrent(Append|DeleteRead|DeleteDelete|Transaction|Write)Exception|"
                       r"MetadataChangedException|ProtocolChangedException|DELTA_CONCURRENT_|"
                       r"DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED")
_COLUMNS = tuple(c.split()[0] for c in re.split(r",\s*(?![^<]*>)", rows_schema_ddl()))


def is_conflict(exc: BaseException) -> bool:
    """``exc`` is Delta's refusal of a commit that lost to a concurrent one (re-planning may win)."""
    return _CONFLICT.search(f"{type(exc).__name__}: {exc}") is not None


_T = TypeVar("_T")


def on_conflict_again(write: Callable[[], _T], *, attempts: int = 6, first_wait_s: float = 0.2) -> _T:
    """``write()``, again (after 0.2, 0.4, 0.8 ... s) while Delta refuses it for a concurrent commit
    (gc's maintenance writes against a running pipeline); the last attempt's refusal is raised."""
    for attempt in range(attempts):
        try:
            return write()
        except Exception as exc:
            if attempt == attempts - 1 or not is_conflict(exc):
                raise
            time.sleep(first_wait_s * 2 ** attempt)
    raise AssertionError("unreachable")


def merge_sql(table_path: str, source_view: str, *, computation: str, intervals: Iterable[int]) -> str:
    """The fenced MERGE into the rows table of ``source_view`` (its columns plus ``_op``)."""
    ivs = ",".join(str(int(i)) for i in sorted(set(intervals)))
    comp = computation.replace("'", "''")
    path = table_path.replace("`", "``")
    # a fence row's state (its interval's input files, inputfiles.py) is merged, or replaced
    fence_state = (f"CASE WHEN s.key = concat(char(0), 'fence') AND s._op = '{REPLACE_FILES_OP}' THEN s.state "
                   f"WHEN s.key = concat(char(0), 'fence') THEN {union_sql('t.state', 's.state')} "
                   "ELSE s.state END")
    sets = ", ".join(f"t.`{c}` = {fence_state}" if c == "state" else f"t.`{c}` = s.`{c}`" for c in _COLUMNS)
    cols = ", ".join(f"`{c}`" for c in _COLUMNS)
    vals = ", ".join(f"s.`{c}`" for c in _COLUMNS)
    return (
        f"MERGE INTO delta.`{path}` t USING {source_view} s "
        f"ON t.computation = '{comp}' AND t.interval IN ({ivs}) "
        "AND t.computation = s.computation AND t.interval = s.interval AND t.key = s.key "
        "WHEN MATCHED AND t.sequencer > s.sequencer THEN UPDATE SET t.sequencer = "
        f"CAST(raise_error(concat('{STALE_MARKER} computation=', t.computation, ' interval=', "
        "CAST(t.interval AS STRING), ' current=', CAST(t.sequencer AS STRING), "
        "' ours=', CAST(s.sequencer AS STRING))) AS BIGINT) "
        "WHEN MATCHED AND s._op = 'delete' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s._op <> 'delete' THEN INSERT ({cols}) VALUES ({vals})"
    )


_STALE_DETAIL = re.compile(STALE_MARKER + r" computation=(\S+) interval=(\d+) current=(\d+) ours=(\d+)")


def translate_commit_error(exc: BaseException, *, sequencers: Mapping[int, int]) -> Exception | None:
    """Map an exception from a fenced MERGE to a deltawheel error (by its text), or None if unrelated."""
    text = str(exc)
    m = _STALE_DETAIL.search(text)
    if m:  # only the raised error has the numbers: other errors quote the MERGE, marker included
        detail = (f"computation {m.group(1)} interval {m.group(2)} is owned under sequencer {m.group(3)}, "
                  f"this writer has {m.group(4)}")
        return StaleSequencerError(f"commit rejected, stale sequencer: {detail}. A newer owner took over; "
                                   "nothing of this commit landed. Drop the leases and re-acquire them "
                                   "before writing again.")
    conflict = _CONFLICT.search(text)
    if conflict:
        first = text[conflict.start():conflict.start() + 200].splitlines()[0]
        return CommitConflictError(f"a concurrent Delta commit touched the same interval partitions "
                                   f"({first}); nothing landed. Retry: if a newer owner fenced the interval "
                                   "the retry fails with StaleSequencerError.")
    return None
