"""The fast path's file operations on an object store: pyarrow's S3 file system vs Hadoop's S3A.

Times what the image path and the direct read do to an ``s3a://`` store from Python (write an
image, read a file whole, list ``_delta_log``, read a JSON commit) through pyarrow's
``S3FileSystem`` (``pyarrow``, what deltawheel uses) and through Hadoop's ``S3AFileSystem`` in the
driver JVM over py4j (``hadoop``): the median of ``--repeat`` runs each. Needs
``$DELTAWHEEL_S3_ENDPOINT`` and its keys (``deltawheel objectstore status``); docs/objectstore-fastpath.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from typing import Any, Callable, Sequence

__all__ = ["run", "main"]


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def _image(rows: int) -> Any:
    """A table shaped like an interval image (key, state bytes, a few longs) of ``rows`` rows."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    return pa.table({"key": pa.array([f"key-{i:08d}" for i in range(rows)]),
                     "state": pa.array([rng.bytes(40) for _ in range(rows)], pa.binary()),
                     "sequencer": pa.array(np.full(rows, 3, dtype=np.int64)),
                     "next_event_timer_ms": pa.array(rng.integers(0, 10**12, rows)),
                     "updated_ms": pa.array(rng.integers(0, 10**12, rows))})


def run(spark: Any, uri: str, *, rows: Sequence[int], log_files: int, repeat: int) -> dict[str, Any]:
    """Time each operation both ways below ``uri`` (a fresh folder per call); returns the figures."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.statestore.delta.jvm import jsession, jvm
    from deltawheel.statestore.delta.storefs import table_files

    base = f"{uri.rstrip('/')}/{uuid.uuid4().hex}"
    files = table_files(spark, base)
    if files is None or files.is_local:
        raise SystemExit(f"{uri} is not an s3a:// folder")
    j = jvm(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    hpath = j.org.apache.hadoop.fs.Path
    hfs = hpath(base).getFileSystem(conf)
    io_utils = j.org.apache.commons.io.IOUtils

    def h_write(rel: str, data: bytes) -> None:
        out = hfs.create(hpath(f"{base}/{rel}"), True)
        out.write(bytearray(data))
        out.close()

    def h_read(rel: str) -> bytes:
        stream = hfs.open(hpath(f"{base}/{rel}"))
        try:
            return bytes(io_utils.toByteArray(stream))
        finally:
            stream.close()

    out: dict[str, Any] = {"uri": base, "repeat": repeat, "operations": []}

    def record(op: str, size: int, pa_ms: float, h_ms: float) -> None:
        out["operations"].append({"operation": op, "bytes": size, "pyarrow_ms": pa_ms, "hadoop_ms": h_ms,
                                  "hadoop_over_pyarrow": round(h_ms / pa_ms, 2) if pa_ms else None})

    def images(n: int) -> None:
        table = _image(n)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="snappy")
        size = sink.getvalue().size
        rel = f"img-{n}.parquet"

        def hadoop_write() -> None:
            buf = pa.BufferOutputStream()
            pq.write_table(table, buf, compression="snappy")
            h_write(f"h-{rel}", buf.getvalue().to_pybytes())

        record(f"write image ({n:,} rows)", size,
               _median_ms(lambda: files.write_parquet(table, f"pa-{rel}", compression="snappy"), repeat),
               _median_ms(hadoop_write, repeat))
        record(f"read image ({n:,} rows)", size, _median_ms(lambda: files.read_parquet(f"pa-{rel}"), repeat),
               _median_ms(lambda: pq.read_table(pa.BufferReader(h_read(f"h-{rel}"))), repeat))

    for n in rows:
        images(n)
    commit = (json.dumps({"commitInfo": {"timestamp": 0, "operation": "WRITE", "userMetadata": "x" * 200}}) + "\n"
              + "\n".join(json.dumps({"add": {"path": f"computation=c/interval={i}/part-{uuid.uuid4().hex}.parquet",
                                              "size": 1000, "dataChange": True}}) for i in range(4))).encode()
    log = files.sub("_delta_log")
    for v in range(log_files):
        with log.fs.open_output_stream(log.path(f"{v:020d}.json")) as fh:
            fh.write(commit)
    record(f"list _delta_log ({log_files} files)", 0,
           _median_ms(lambda: log.listdir(), repeat),
           _median_ms(lambda: [str(s.getPath().getName()) for s in hfs.listStatus(hpath(f"{base}/_delta_log"))],
                      repeat))
    record("read a JSON commit", len(commit),
           _median_ms(lambda: log.read_text(f"{0:020d}.json"), repeat),
           _median_ms(lambda: h_read(f"_delta_log/{0:020d}.json").decode(), repeat))
    return out


def _table(report: dict[str, Any]) -> str:
    lines = [f"{'operation':34} {'bytes':>9} {'pyarrow ms':>11} {'hadoop ms':>10} {'hadoop/pyarrow':>15}"]
    for op in report["operations"]:
        lines.append(f"{op['operation']:34} {op['bytes']:>9,} {op['pyarrow_ms']:>11.2f} {op['hadoop_ms']:>10.2f} "
                     f"{op['hadoop_over_pyarrow']:>15}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, build a session, run, print and save."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--uri", required=True, help="an s3a:// folder to work in (a fresh subfolder is made)")
    p.add_argument("--out", required=True, help="JSON file for the figures")
    p.add_argument("--rows", default="1000,20000,100000", help="image sizes in rows, comma-separated")
    p.add_argument("--log-files", type=int, default=200, help="JSON commits in the listed _delta_log")
    p.add_argument("--repeat", type=int, default=15, help="timed runs per operation (median reported)")
    args = p.parse_args(argv)
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    spark = build_spark(SparkSettings(app_name="deltawheel-objectstore-io", object_store=True))
    report = run(spark, args.uri, rows=[int(r) for r in args.rows.split(",")], log_files=args.log_files,
                 repeat=args.repeat)
    print(_table(report))
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
