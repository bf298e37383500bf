"""What the image path's tasks hand to the driver: one summary per interval they ran (:data:`SUMMARY_DDL`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

from ...rowtable.frames import local_frame

__all__ = ["SUMMARY_DDL", "ImageFile", "ProductionFile", "SideRecord", "Fenced", "IntervalSummary", "BatchOutput",
           "side_frame"]

_SIDE = ("STRUCT<kind: STRING, record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, "
         "stream: STRING, position: STRING, error: STRING>")
#: The Arrow rows the tasks return (:meth:`IntervalSummary.to_row`)
SUMMARY_DDL = ("interval INT, new_path STRING, new_size BIGINT, new_rows BIGINT, "
               "ids_path STRING, ids_size BIGINT, ids_rows BIGINT, ids_removed ARRAY<STRING>, "
               "merged_path STRING, merged_size BIGINT, merged_rows BIGINT, "
               "prod_files ARRAY<STRUCT<stream: STRING, path: STRING, size: BIGINT, num_rows: BIGINT, min_ts: BIGINT>>, "
               f"side ARRAY<{_SIDE}>, records_in BIGINT, processed BIGINT, duplicates BIGINT, fired BIGINT, "
               "late BIGINT, n_prods BIGINT, n_dead BIGINT, keys_written BIGINT, ids_expired BIGINT, "
               "keys_expired BIGINT, oldest_ms BIGINT, next_proc_ms BIGINT, bloom_checked BIGINT, "
               "bloom_maybe BIGINT, bloom_false_pos BIGINT, bloom_bytes BIGINT, images_read BIGINT, "
               "obs_min BIGINT, obs_max BIGINT, pending_rows BIGINT, "
               "fenced STRUCT<computation: STRING, sequencer: BIGINT, ours: BIGINT>")


@dataclass(frozen=True)
class ImageFile:
    """An interval's new image: a Parquet file in its partition folder, not yet in the log."""

    path: str
    size: int
    rows: int


@dataclass(frozen=True)
class ProductionFile:
    """One stream-table Parquet file of productions, not yet in the stream's log (``min_ts``: earliest)."""

    stream: str
    path: str
    size: int
    num_rows: int
    min_ts: int | None

    def to_row(self) -> dict[str, Any]:
        """The file as a ``prod_files`` element of a summary row."""
        return asdict(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ProductionFile:
        """A ``prod_files`` element of a summary row."""
        return cls(row["stream"], row["path"], int(row["size"]), int(row["num_rows"]), row.get("min_ts"))


@dataclass(frozen=True, kw_only=True)
class SideRecord:
    """An input record not run: ``kind`` "dead" (with ``error``) or "late"; ``position`` None: looked up."""

    kind: str
    record_id: str | None
    key: str | None
    value: bytes | None
    codec: str | None
    timestamp_ms: int | None
    stream: str | None
    position: str | None
    error: str | None

    @classmethod
    def of_input(cls, kind: str, x: Mapping[str, Any], key: str | None, error: str | None) -> SideRecord:
        """The side record of ``kind`` for the input record ``x`` (a prepared row) of ``key``."""
        return cls(kind=kind, record_id=x.get("record_id"), key=key, value=x.get("value"), codec=x.get("codec"),
                   timestamp_ms=x.get("timestamp_ms"), stream=x.get("stream"), position=x.get("position"),
                   error=error)

    def to_row(self) -> dict[str, Any]:
        """The record as a ``side`` element of a summary row."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SideRecord:
        """A ``side`` element of a summary row."""
        return cls(kind=row["kind"], **{f.name: row.get(f.name) for f in fields(cls) if f.name != "kind"})


@dataclass(frozen=True)
class Fenced:
    """A task found another writer's ``sequencer`` (None: no fence row) on the fence row; wrote nothing."""

    computation: str
    sequencer: int | None
    ours: int

    def message(self, interval: int) -> str:
        """What :class:`~deltawheel.statestore.exceptions.StaleViewError` says for ``interval``."""
        return (f"interval {interval} of {self.computation} is fenced by sequencer {self.sequencer} "
                f"(ours: {self.ours}): another writer took it over; nothing of this batch was committed")


_COUNTS = ("records_in", "processed", "duplicates", "fired", "late", "n_prods", "n_dead", "keys_written",
           "ids_expired", "keys_expired", "bloom_checked", "bloom_maybe", "bloom_false_pos", "bloom_bytes", "images_read")
_OPTIONAL = ("oldest_ms", "next_proc_ms", "obs_min", "obs_max", "pending_rows")  # None: not known


@dataclass(frozen=True, kw_only=True)
class IntervalSummary:
    """What a task did with one interval (``interval`` None: a task that ran none); ``image`` None:
    unchanged. A task's input counts (``records_in``, ``obs_min`` / ``obs_max``) ride on its first summary."""

    interval: int | None
    image: ImageFile | None = None
    ids_file: ImageFile | None = None
    ids_removed: tuple[str, ...] = ()
    ids_merged: ImageFile | None = None
    prod_files: tuple[ProductionFile, ...] = ()
    side: tuple[SideRecord, ...] = ()
    records_in: int = 0
    processed: int = 0
    duplicates: int = 0
    fired: int = 0
    late: int = 0
    n_prods: int = 0
    n_dead: int = 0
    keys_written: int = 0
    ids_expired: int = 0
    keys_expired: int = 0  # keys the state TTL dropped
    oldest_ms: int | None = None
    next_proc_ms: int | None = None
    bloom_checked: int = 0
    bloom_maybe: int = 0
    bloom_false_pos: int = 0
    bloom_bytes: int = 0
    images_read: int = 0
    obs_min: int | None = None
    obs_max: int | None = None
    pending_rows: int | None = None  # 1: the interval's image holds checkpointed productions (None: not known)
    fenced: Fenced | None = None

    def to_row(self) -> dict[str, Any]:
        """The summary as a row of :data:`SUMMARY_DDL`."""
        row: dict[str, Any] = {"interval": self.interval, "ids_removed": list(self.ids_removed),
                               "prod_files": [p.to_row() for p in self.prod_files],
                               "side": [s.to_row() for s in self.side]}
        for prefix, img in (("new", self.image), ("ids", self.ids_file), ("merged", self.ids_merged)):
            row.update({f"{prefix}_path": img and img.path, f"{prefix}_size": img and img.size,
                        f"{prefix}_rows": img and img.rows})
        row.update((c, getattr(self, c)) for c in (*_COUNTS, *_OPTIONAL))
        row["fenced"] = None if self.fenced is None else asdict(self.fenced)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> IntervalSummary:
        """A row of :data:`SUMMARY_DDL` (a missing or null count: 0)."""
        path, ids = row.get("new_path"), row.get("ids_path")
        f = row.get("fenced")
        return cls(
            interval=row.get("interval"),
            image=ImageFile(path, int(row["new_size"]), int(row["new_rows"])) if path else None,
            ids_file=ImageFile(ids, int(row["ids_size"]), int(row["ids_rows"])) if ids else None,
            ids_removed=tuple(row.get("ids_removed") or ()),
            ids_merged=ImageFile(row["merged_path"], int(row["merged_size"]), int(row["merged_rows"]))
            if row.get("merged_path") else None,
            prod_files=tuple(ProductionFile.from_row(p) for p in row.get("prod_files") or ()),
            side=tuple(SideRecord.from_row(s) for s in row.get("side") or ()),
            fenced=None if f is None else Fenced(f["computation"], f.get("sequencer"), int(f["ours"])),
            **{c: row[c] for c in _OPTIONAL if c in row}, **{c: int(row.get(c) or 0) for c in _COUNTS})


@dataclass
class BatchOutput:
    """A batch's tasks' summaries on the image path (one per interval run, one per task that ran none)."""

    summaries: list[IntervalSummary]
    version: int | None = None  # the rows commit that checkpointed the productions (set by commit)

    def fenced(self) -> tuple[int, Fenced] | None:
        """(interval, what its task found) of the lowest interval a task found fenced, or None."""
        return min(((s.interval, s.fenced) for s in self.summaries if s.fenced is not None and s.interval is not None),
                   key=lambda x: x[0], default=None)

    def intervals(self) -> list[tuple[int, IntervalSummary]]:
        """(interval, its summary) for each summary of an interval."""
        return [(s.interval, s) for s in self.summaries if s.interval is not None]

    def changed(self) -> list[tuple[int, IntervalSummary]]:
        """(interval, its summary) for each interval with files to commit or drop."""
        return [(iv, s) for iv, s in self.intervals()
                if s.image is not None or s.ids_file is not None or s.ids_merged is not None or s.ids_removed]

    def side(self, kind: str) -> list[SideRecord]:
        """The side records of ``kind`` (dead, late) of every summary."""
        return [x for s in self.summaries for x in s.side if x.kind == kind]

    def prod_min_ts(self) -> int | None:
        """The oldest timestamp among the production files (holds the low watermark)."""
        return min((p.min_ts for s in self.summaries for p in s.prod_files if p.min_ts is not None), default=None)


def side_frame(session: Any, records: Sequence[SideRecord], *, dead: bool) -> Any:
    """Dead letters / late records as a frame for ``writepath/delivery.py``."""
    if dead:
        return local_frame(
            session,
            [(r.record_id, r.key, r.value, r.error, r.position, r.timestamp_ms, r.stream) for r in records],
            "record_id STRING, key STRING, raw_value BINARY, error STRING, position STRING, "
            "event_time_ms BIGINT, stream STRING")
    return local_frame(
        session, [(r.stream, r.record_id, r.key, r.value, r.codec, r.timestamp_ms) for r in records],
        "stream STRING, record_id STRING, key STRING, value BINARY, codec STRING, timestamp_ms BIGINT")
