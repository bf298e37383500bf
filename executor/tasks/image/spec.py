"""What an image task gets from the driver: :class:`ImageSpec`, plain values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.writepath.image.files import is_ids_path

from ...computation import Computation
from ..usercode.keyrun import AS_INPUT, SameAsInput

__all__ = ["ImageSpec"]


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """Everything a task needs, as plain values (pickled to the workers)."""

    comp: Computation
    rows_root: TableFiles  # the rows table's folder
    images: Mapping[int, tuple[str, ...]]  # interval -> relative (decoded) paths of its live files
    sequencers: Mapping[int, int]
    stream_roots: Mapping[str, TableFiles]
    wm: int | None  # the timers' watermark
    now_ms: int
    horizon_ms: int | None
    commit_id: str
    rows_schema: Any  # pyarrow schema of the rows files (no partition columns)
    stream_schema: Any
    stream_format_version: int
    route_late: bool
    summary_schema: Any  # pyarrow schema of the summaries (``SUMMARY_DDL``)
    strong: bool  # checkpoint the productions in the rows (strong, or a weak batch's straggler re-run)
    input_files: tuple[str, ...] = ()  # the batch's input files: added to each rewritten fence row's set
    # the records' watermark: the one before the batch's input (lateness; ``keyrun.UserCode``)
    wm_late: int | None | SameAsInput = AS_INPUT
    late_raised: Mapping[int, int] = field(default_factory=dict)  # intervals judged against a higher line

    def state_files(self, iv: int) -> tuple[str, ...]:
        """Interval ``iv``'s live files but its ids files, sorted: its state image."""
        return tuple(sorted(p for p in self.images.get(iv, ()) if not is_ids_path(p)))

    def ids_files(self, iv: int) -> tuple[str, ...]:
        """Interval ``iv``'s live record-ids files, sorted."""
        return tuple(sorted(p for p in self.images.get(iv, ()) if is_ids_path(p)))

    def records_watermark(self, iv: int | None = None) -> int | None:
        """The watermark interval ``iv``'s records' lateness is judged against (:attr:`late_raised`,
        :attr:`wm_late`, or :attr:`wm`)."""
        if iv is not None and iv in self.late_raised:
            return self.late_raised[iv]
        return self.wm if isinstance(self.wm_late, SameAsInput) else self.wm_late
