"""Run windowing scenarios through Apache Beam's Python DirectRunner with TestStream; print their panes.

Run by the Beam virtual environment's python (``.venv-beam``, see
``tests/test_beam_differential.py``), never imported by deltawheel's own
interpreter: ``python tests/beam_driver.py < scenarios.json`` reads a JSON
list of scenarios (SCENARIO_FORMAT, seconds) and prints one JSON list with,
per scenario, ``{"panes": [...]}`` (key, window bounds, summed value, timing,
pane index, first/last) or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _trigger(spec: dict[str, Any]) -> Any:
    from apache_beam.transforms import trigger as t

    kind = spec["type"]
    if kind == "default":
        return t.DefaultTrigger()
    if kind == "after_watermark":
        return t.AfterWatermark(early=_trigger(spec["early"]) if "early" in spec else None,
                                late=_trigger(spec["late"]) if "late" in spec else None)
    if kind == "after_count":
        return t.AfterCount(spec["count"])
    if kind == "after_processing_time":
        return t.AfterProcessingTime(spec["delay"])
    if kind == "repeatedly":
        return t.Repeatedly(_trigger(spec["trigger"]))
    if kind in ("after_any", "after_all", "after_each"):
        cls = {"after_any": t.AfterAny, "after_all": t.AfterAll, "after_each": t.AfterEach}[kind]
        return cls(*[_trigger(s) for s in spec["triggers"]])
    if kind == "or_finally":
        return t.OrFinally(_trigger(spec["trigger"]), _trigger(spec["finally"]))
    if kind == "always":
        return t.Always()
    if kind == "never":
        return t._Never()
    raise ValueError(f"unknown trigger {kind!r}")


def _window_fn(spec: dict[str, Any]) -> Any:
    from apache_beam.transforms import window as w

    kind = spec["type"]
    if kind == "global":
        return w.GlobalWindows()
    if kind == "fixed":
        return w.FixedWindows(spec["size"], spec.get("offset", 0))
    if kind == "sliding":
        return w.SlidingWindows(spec["size"], spec["period"], spec.get("offset", 0))
    if kind == "sessions":
        return w.Sessions(spec["gap"])
    raise ValueError(f"unknown windowing {kind!r}")


def run_one(sc: dict[str, Any], sink: str) -> list[dict[str, Any]]:
    """The panes Beam emits for scenario ``sc`` (written to the file ``sink`` by the pipeline)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import trigger as t
    from apache_beam.transforms.window import GlobalWindow, TimestampedValue

    stream = TestStream()
    now = 0
    for step in sc["steps"]:
        if "key" in step:
            stream.add_elements([TimestampedValue((str(step["key"]), step["value"]), step["event_time"])])
        elif "watermark" in step:
            stream.advance_watermark_to(step["watermark"])
        else:
            stream.advance_processing_time(step["processing_time"] - now)
            now = step["processing_time"]
    stream.advance_watermark_to_infinity()
    mode = {"discarding": t.AccumulationMode.DISCARDING,
            "accumulating": t.AccumulationMode.ACCUMULATING}[sc.get("accumulation_mode", "discarding")]

    class Record(beam.DoFn):  # type: ignore[misc]
        def process(self, kv: Any, window: Any = beam.DoFn.WindowParam, pane: Any = beam.DoFn.PaneInfoParam) -> Any:
            glob = isinstance(window, GlobalWindow)
            pane_dict = {
                "key": kv[0], "window_start": None if glob else int(window.start),
                "window_end": None if glob else int(window.end), "value": sum(kv[1]),
                "timing": {0: "EARLY", 1: "ON_TIME", 2: "LATE"}.get(pane.timing, "UNKNOWN"),
                "pane_index": pane.index, "is_first": pane.is_first, "is_last": pane.is_last}
            with open(sink, "a") as f:  # the DoFn is pickled: a file, not a list, collects the panes
                f.write(json.dumps(pane_dict) + "\n")
            return []

    open(sink, "w").close()
    opts = PipelineOptions(["--allow_unsafe_triggers"])
    opts.view_as(StandardOptions).streaming = True
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=opts) as p:
        _ = (p | stream
             | beam.WindowInto(_window_fn(sc["windowing"]), trigger=_trigger(sc.get("trigger", {"type": "default"})),
                               accumulation_mode=mode, allowed_lateness=sc.get("allowed_lateness", 0))
             | beam.GroupByKey() | beam.ParDo(Record()))
    with open(sink) as f:
        panes = [json.loads(line) for line in f]
    return sorted(panes, key=lambda q: q["key"])  # stable: emission order within a key


def main() -> int:
    """Read scenarios from stdin, print their Beam panes as one JSON list."""
    import logging
    import os
    import signal
    import tempfile

    def timeout(signum: int, frame: Any) -> None:
        raise TimeoutError("the pipeline did not finish in 30 s (a processing-time timer still pending?)")

    logging.disable(logging.WARNING)
    signal.signal(signal.SIGALRM, timeout)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        sink = os.path.join(tmp, "panes.jsonl")
        for sc in json.load(sys.stdin):
            signal.alarm(30)
            try:
                out.append({"panes": run_one(sc, sink)})
            except Exception as e:  # reported per scenario; the comparison counts it
                out.append({"error": f"{type(e).__name__}: {e}"})
            finally:
                signal.alarm(0)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
