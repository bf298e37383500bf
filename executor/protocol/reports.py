"""What a micro-batch did: :class:`BatchReport` and its progress line."""

from __future__ import annotations

import time
from dataclasses import dataclass

from deltawheel.statestore.zk.watermarks import END_OF_TIME

__all__ = ["BatchReport", "UNKNOWN", "format_report", "format_watermark", "describe_watermark", "watermark_known"]


@dataclass(frozen=True, kw_only=True)
class BatchReport:
    """What one micro-batch did: counts, watermarks and times; built by keywords only."""

    batch_id: int
    records_in: int
    processed: int
    duplicates: int
    late: int
    late_routed: int
    dead_letters: int
    timers_fired: int
    productions: int
    keys_written: int
    input_watermark_ms: int | None
    low_watermark_ms: int | None
    commit_s: float
    wall_s: float
    steps_s: tuple[tuple[str, float], ...] = ()  # seconds per protocol step, in order
    straggled: bool = False  # weak delivery outlived straggler_timeout_s: productions checkpointed
    direct: bool = False  # the tasks read the input files themselves (executor/tasks/image/direct.py)
    direct_ranges: bool = False  # ... a Kafka batch's offset ranges (executor/tasks/image/kafkaread.py)
    ids_expired: int = 0  # record ids dropped from the rows: seen before the dedup horizon
    keys_expired: int = 0  # keys the state TTL dropped (state, timers and record ids)
    bloom_checked: int = 0  # image path: the dedup Bloom filters' first check
    bloom_maybe: int = 0
    bloom_false_pos: int = 0
    bloom_bytes: int = 0
    intervals_run: int = 0  # image path, with images_read: images a task read from the store
    images_read: int = 0
    skipped_moved: int = 0  # records of a moved interval an earlier owner processed
    timers_only: bool = False  # a batch without input (a flush): its line names no batch id

    @property
    def image_cache_hit_rate(self) -> float | None:
        """The share of the intervals run whose image the worker held (None: none ran)."""
        return 1.0 - self.images_read / self.intervals_run if self.intervals_run else None

    @classmethod
    def empty(cls, batch_id: int, *, input_watermark_ms: int | None, low_watermark_ms: int | None, wall_s: float,
              steps_s: tuple[tuple[str, float], ...] = (), timers_only: bool = False) -> BatchReport:
        """The report of batch ``batch_id`` that read, ran and wrote nothing (every count 0)."""
        return cls(batch_id=batch_id, records_in=0, processed=0, duplicates=0, late=0, late_routed=0,
                   dead_letters=0, timers_fired=0, productions=0, keys_written=0,
                   input_watermark_ms=input_watermark_ms, low_watermark_ms=low_watermark_ms, commit_s=0.0,
                   wall_s=wall_s, steps_s=steps_s, timers_only=timers_only)


#: how every line shows a watermark that is not known
UNKNOWN = "unknown"


def watermark_known(ms: int | None) -> bool:
    """Whether ``ms`` is a watermark: None and values at or before the epoch are "unknown".

    >>> [watermark_known(v) for v in (None, 0, -5_000, 1)]
    [False, False, False, True]
    """
    return ms is not None and ms > 0


def format_watermark(ms: int | None, *, now_ms: int | None = None) -> str:
    """A watermark in a progress line: ``unknown``, ``end``, or UTC time (with the date off ``now_ms``'s day).

    >>> format_watermark(None), format_watermark(0), format_watermark(1_764_633_600_000)
    ('unknown', 'unknown', '2025-12-02 00:00:00')
    """
    if ms is None or not watermark_known(ms):
        return UNKNOWN
    if ms >= END_OF_TIME:
        return "end"
    t = time.gmtime(ms / 1000)
    today = None if now_ms is None else time.gmtime(now_ms / 1000)[:3]
    return time.strftime("%H:%M:%S" if t[:3] == today else "%Y-%m-%d %H:%M:%S", t)


def describe_watermark(ms: int | None) -> str:
    """A watermark in a plan or report line: ``unknown``, ``end of time``, or UTC time with epoch ms.

    >>> describe_watermark(None), describe_watermark(0)
    ('unknown', 'unknown (0 ms)')
    """
    if ms is None:
        return UNKNOWN
    shown = format_watermark(ms)
    if shown == UNKNOWN:
        return f"{UNKNOWN} ({ms} ms)"
    return "end of time" if shown == "end" else f"{shown} UTC ({ms} ms)"


def format_report(name: str, r: BatchReport, *, now_ms: int | None = None) -> str:
    """The batch's progress line; a ``timers_only`` batch names no id."""

    def ts(ms: int | None) -> str:
        return format_watermark(ms, now_ms=now_ms)

    what = f"{name} timers (no input)" if r.timers_only else f"{name} batch {r.batch_id}"
    return (f"{what}: {r.records_in} in, {r.processed} processed, {r.duplicates} dup, "
            f"{r.late} late, {r.dead_letters} dead, {r.timers_fired} timers, {r.productions} produced"
            + (" (straggler: checkpointed)" if r.straggled else "") + (
                (" (offset ranges read by the tasks)" if r.direct_ranges else " (files read by the tasks)")
                if r.direct else "")
            + (f"; {r.ids_expired} ids expired" if r.ids_expired else "")
            + (f"; {r.keys_expired} keys expired (state TTL)" if r.keys_expired else "")
            + (f"; {r.skipped_moved} skipped (processed by an earlier owner)" if r.skipped_moved else "")
            + (f"; bloom {r.bloom_maybe}/{r.bloom_checked} maybe ({r.bloom_false_pos} false), "
               f"{r.bloom_bytes / 1e6:.1f} MB" if r.bloom_checked else "")
            + (f"; {r.images_read}/{r.intervals_run} images read (cache hit {100 * (r.image_cache_hit_rate or 0):.0f} %)"
               if r.intervals_run else "") +
            f"; {r.keys_written} keys written; wm in {ts(r.input_watermark_ms)} low {ts(r.low_watermark_ms)}; "
            f"took {r.wall_s:.1f}s (" + ", ".join(f"{k} {v:.1f}" for k, v in r.steps_s) + ")")
