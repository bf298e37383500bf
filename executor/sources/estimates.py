"""MillWheel's injector watermark, from the event times of the input not consumed yet (exact, or a
percentile). docs/injector-watermarks.md."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.watermarks import END_OF_TIME

__all__ = ["PendingPercentile", "check_percentile"]


def check_percentile(percentile: float) -> None:
    """Raise :class:`ConfigError` unless ``percentile`` is in [0, 1)."""
    if not 0.0 <= percentile < 1.0:
        raise ConfigError(f"watermark_percentile must be in [0, 1) (0: the oldest pending event time, "
                          f"exact), got {percentile}")


class PendingPercentile:
    """The ``percentile`` of the pending files' event times (0: their minimum); never moves back.
    ``floor``: the estimate while nothing is pending (``observe``/``finish`` are passed on); ConfigError:
    a percentile outside [0, 1)."""

    def __init__(self, files: TableFiles, event_time_column: str, percentile: float, *, floor: Any) -> None:
        check_percentile(percentile)
        self.files = files
        self.event_time_column = event_time_column
        self.percentile = percentile
        self.floor = floor
        self.consumed: dict[str, frozenset[str]] = {}  # query -> the files it read
        self._times: dict[tuple[str, int, int], Any] = {}  # (name, size, mtime) -> sorted event times (ms)
        self._last: int | None = None
        self.finished = False

    def observe(self, stats: Any, *, query: str = "") -> None:
        """A batch was consumed by ``query``; ``stats.sources``: every file that query has read."""
        self.floor.observe(stats)
        self.consumed[query] = self.consumed.get(query, frozenset()) | frozenset(stats.sources)

    def finish(self) -> None:
        """All input available was consumed: :data:`END_OF_TIME`."""
        self.finished = True
        self.floor.finish()

    def _event_times(self, name: str, size: int, mtime: int) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        key = (name, size, mtime)
        got = self._times.get(key)
        if got is None:
            col = self.files.read_parquet(name, columns=[self.event_time_column]).column(0)
            if pa.types.is_timestamp(col.type):
                col = pc.cast(pc.cast(col, pa.timestamp("ms", tz=col.type.tz)), pa.int64())
            got = np.sort(np.asarray(pc.drop_null(pc.cast(col, pa.int64())), dtype=np.int64))
            self._times[key] = got
        return got

    def pending(self) -> list[tuple[str, int, int]]:
        """The folder's visible files no query has read yet (name, size, mtime)."""
        listed = self.files.list_files() or []
        read = frozenset.intersection(*self.consumed.values()) if self.consumed else frozenset()
        return [(n, s, m) for n, s, m in listed if not n.startswith(("_", ".")) and n not in read]

    def watermark_ms(self) -> int | None:
        """The estimate (epoch ms), or None while neither pending input nor a seen batch gives one."""
        import numpy as np

        if self.finished:
            return int(END_OF_TIME)
        pend = self.pending()
        times = np.concatenate([self._event_times(*f) for f in pend]) if pend else np.zeros(0, np.int64)
        est: int | None = self.floor.watermark_ms()
        if times.size:  # the lower percentile: the k-th smallest, without sorting everything pending
            k = int(self.percentile * (times.size - 1))
            est = int(np.partition(times, k)[k])
        if est is not None and (self._last is None or est > self._last):
            self._last = est
        return self._last
