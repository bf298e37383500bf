"""The executors' figures for Prometheus, one endpoint per process (docs/watching.md)."""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

__all__ = ["MetricsExporter", "start_metrics_server", "active_exporter", "COUNTED"]

#: the table's columns summed into counters (``deltawheel_<column>_total``)
COUNTED = ("records_in", "processed", "duplicates", "late", "dead_letters", "timers_fired", "productions",
           "keys_written")
_GAUGES = (("low_watermark_ms", "the low watermark the computation last published (ms since the epoch)"),
           ("input_watermark_ms", "the input watermark of the computation's last batch (ms since the epoch)"),
           ("pending_productions", "productions of the last batch still being delivered"),
           ("state_rows", "rows of state the instance holds"), ("state_bytes", "bytes of state the instance holds"),
           ("batch_id", "the last committed batch's id"))
_LABELS = ("pipeline", "computation", "instance")


@dataclass
class _Series:
    """What the exporter adds up for one (pipeline, computation, instance)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    batches: int = 0
    wall_sum: float = 0.0
    commit_sum: float = 0.0
    last: Mapping[str, Any] = field(default_factory=dict)


class MetricsExporter:
    """Observes the executors' batch rows (:meth:`observe`) and serves them (:meth:`collect`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._executors: weakref.WeakSet[Any] = weakref.WeakSet()
        self._server: Any = None
        self.port: int | None = None

    def observe(self, row: Mapping[str, Any], executor: Any = None) -> None:
        """Count one committed batch's row; ``executor`` is asked for its leases at scrape time."""
        key = tuple(str(row.get(k) or "") for k in _LABELS)
        with self._lock:
            s = self._series.setdefault(key, _Series())  # type: ignore[arg-type]
            for c in COUNTED:
                s.counts[c] += int(row.get(c) or 0)
            s.batches += 1
            s.wall_sum += float(row.get("wall_s") or 0.0)
            s.commit_sum += float(row.get("commit_s") or 0.0)
            s.last = dict(row)
            if executor is not None:
                self._executors.add(executor)

    def collect(self) -> Iterator[Any]:
        """The metric families (``prometheus_client``'s custom collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        with self._lock:
            series = {k: (dict(s.counts), s.batches, s.wall_sum, s.commit_sum, dict(s.last))
                      for k, s in self._series.items()}
        labels = list(_LABELS)
        batches = CounterMetricFamily("deltawheel_batches", "batches committed", labels=labels)
        counters = {c: CounterMetricFamily(f"deltawheel_{c}", f"{c.replace('_', ' ')} over the committed batches",
                                           labels=labels) for c in COUNTED}
        wall = SummaryMetricFamily("deltawheel_batch_seconds", "wall time of a batch", labels=labels)
        commit = SummaryMetricFamily("deltawheel_commit_seconds", "time of a batch's commit", labels=labels)
        last_wall = GaugeMetricFamily("deltawheel_last_batch_seconds", "wall time of the last batch", labels=labels)
        gauges = {g: GaugeMetricFamily(f"deltawheel_{'last_batch_id' if g == 'batch_id' else g}", text,
                                       labels=labels) for g, text in _GAUGES}
        lag = GaugeMetricFamily("deltawheel_watermark_lag_seconds", "now minus the published low watermark",
                                labels=labels)
        now_ms = time.time() * 1000
        for key, (counts, n, wall_sum, commit_sum, last) in sorted(series.items()):
            values = list(key)
            batches.add_metric(values, n)
            for c in COUNTED:
                counters[c].add_metric(values, counts[c])
            wall.add_metric(values, n, wall_sum)
            commit.add_metric(values, n, commit_sum)
            last_wall.add_metric(values, float(last.get("wall_s") or 0.0))
            for g, _ in _GAUGES:
                if last.get(g) is not None:
                    gauges[g].add_metric(values, float(last[g]))
            if last.get("low_watermark_ms") is not None:
                lag.add_metric(values, max(0.0, (now_ms - float(last["low_watermark_ms"])) / 1000))
        yield from (batches, *counters.values(), wall, commit, last_wall, *gauges.values(), lag)
        yield from self._leases()

    def _leases(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        held = GaugeMetricFamily("deltawheel_intervals_held", "key intervals this process holds leases on",
                                 labels=list(_LABELS))
        seq = GaugeMetricFamily("deltawheel_lease_sequencer", "the sequencer of each held lease",
                                labels=[*_LABELS, "interval"])
        for ex in list(self._executors):
            try:
                leases = ex.owner.leases
                values = [str(getattr(leases, "pipeline", "") or ""), ex.comp.name,
                          str(getattr(leases, "owner", "") or "")]
                sequencers = dict(ex.owner.sequencers)
            except Exception:  # an executor stopping while scraped: its leases are gone
                continue
            held.add_metric(values, len(sequencers))
            for interval, s in sorted(sequencers.items()):
                seq.add_metric([*values, str(interval)], s)
        yield held
        yield seq

    def start(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``port`` (0: a free one); returns the port."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        server, _thread = start_http_server(port, addr=addr, registry=registry)
        self._server = server
        self.port = int(server.server_port)
        return self.port

    def stop(self) -> None:
        """Stop serving (the counters stay with this object)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


_ACTIVE: MetricsExporter | None = None
_ACTIVE_LOCK = threading.Lock()


def active_exporter() -> MetricsExporter | None:
    """The process's exporter, if :func:`start_metrics_server` started one."""
    return _ACTIVE


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> MetricsExporter:
    """Start (or return) the process's Prometheus endpoint on ``port`` (0: any free); OSError: port taken."""
    global _ACTIVE
    with _ACTIVE_LOCK:
        if _ACTIVE is not None:
            return _ACTIVE
        exporter = MetricsExporter()
        try:
            exporter.start(port, addr)
        except OSError as exc:
            raise OSError(exc.errno, f"the metrics endpoint cannot listen on {addr}:{port} ({exc.strerror}); "
                          "give another --metrics-port (0 picks a free one)") from exc
        _ACTIVE = exporter
        return exporter


def stop_metrics_server() -> None:
    """Stop the process's endpoint (tests; a driver ending)."""
    global _ACTIVE
    with _ACTIVE_LOCK:
        if _ACTIVE is not None:
            _ACTIVE.stop()
            _ACTIVE = None
