"""On paper: what a deployment asks of Delta, S3 and ZooKeeper (docs/scale.md, "On paper").

Per-batch costs counted from the code, the commit ceiling from ``bench commits``, published limits."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["Deployment", "TODAY", "model", "markdown", "main", "touched", "rows_tables"]

# --- per-batch costs, counted from the code (image write path, s3a://) -----------------------
FILES_PER_INTERVAL = 1.0  # writepath/image/files.py write_interval_image: the interval's image, whole
IDS_FILES_PER_INTERVAL = 1.0  # writepath/image/idsfiles.py: one ids file per batch that ran records
IDS_MERGED_PER_INTERVAL = 1 / 8  # idsmerge.py: a merged ids file at most once per 8 of a level
GETS_PER_IMAGE_READ = 2.0  # delta/storefs.py TableFiles._source: open_input_stream (a HEAD) + one GET
CHECKPOINT_FILES_PER_BATCH = 2.0  # Spark's offsets/N and commits/N (DirectCheckpointFileManager: PUT each)
CHECKPOINT_PROBES_PER_BATCH = 2.0  # ... and one existence probe (HEAD) each (docs/objectstore.md)
PUTS_PER_VERSION = 2.0  # ZkS3LogStore.write: N.json; Delta's post-commit N.crc (one PUT each)
CKPT_PUTS_PER_VERSION = 2 / 100  # delta/maintenance.py CHECKPOINT_EVERY=100: checkpoint + _last_checkpoint
SHARED_LISTS_PER_VERSION = 1.0  # delta/txn.py TableLog.commit: JVM snapshot not the writer's -> LIST
SHARED_HEADS_PER_VERSION = 1.0  # ZkS3LogStore step 1: N-1 not this JVM's -> HEAD of N.json
DELIVERY_LISTS = 2.0  # image/path.py _deliver_strong: commit_infos (rows log) + txn_versions (stream log)
METRICS_INTERVAL_S = 5.0  # executor/protocol/metrics.py BatchMetrics.interval_s: one append per 5 s
ZK_WRITES_PER_BATCH = 1.0  # zk/watermarks/publish.py Publisher._write: one multi per batch
ZK_WRITES_PER_VERSION = 3.0  # ZkS3LogStore: create entry, set complete, delete after expiry
ZK_READS_PER_BATCH_FIXED = 3.0  # publish.py Publisher._read: topology, injector, low (+ intervals, owners)
ZNODES_PER_INTERVAL = 5.0  # zk/grants.py interval folder, owner, grants/, one g-; watermarks oldest work
LOG_ENTRY_EXPIRY_S = 86_400  # ZkS3LogStore EXPIRATION default (deltawheel.logstore.expirationDelaySeconds)
LOG_ENTRY_NAME_BYTES = 25 + 4  # "%020d.json" + jute's length prefix, per child in getChildren's reply
CHECK_OP_BYTES = 9 + 4 + 69 + 4  # multi header + CheckVersionRequest of /deltawheel/pipelines/p/.../00003

# --- limits -----------------------------------------------------------------------------------
# Delta commits/s of one table on s3a:// at 50 ms, by writers (docs/scale.md "Measured"); N > 16: N = 16's
MEASURED_50MS = {1: 1.1, 2: 1.5, 4: 0.3, 8: 0.3, 16: 0.1}
S3_PUT_PER_PREFIX = 3_500.0  # PUT/COPY/POST/DELETE per second per partitioned prefix (AWS)
S3_GET_PER_PREFIX = 5_500.0  # GET/HEAD per second per partitioned prefix (AWS)
S3_PUT_PRICE = 0.005 / 1000  # USD per PUT/COPY/POST/LIST, S3 Standard, us-east-1
S3_GET_PRICE = 0.0004 / 1000  # USD per GET/HEAD/SELECT
ZK_WRITES_PER_S = 21_000.0  # 3 servers, 100 % writes: Hunt et al., USENIX ATC 2010, Table 1
ZK_READS_PER_S = 100_000.0  # "tens to hundreds of thousands" read-dominated (same paper): low end
JUTE_MAXBUFFER = 0xFFFFF  # ZooKeeper's default packet limit, client and server (1 MiB - 1)


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """The deployment and the layout and settings under test (defaults: docs/scale.md's)."""

    instances: int = 100  # job instances; each runs every computation on its share of intervals
    records_per_s: float = 1_000_000.0  # into each computation
    keys: float = 100_000_000.0  # per computation
    computations: int = 4
    intervals: int = 2_000  # per computation
    batch_s: float = 10.0
    bytes_per_key: float = 200.0  # key + state + row columns in the image, compressed
    streams: int = 1  # output streams per computation (one production file per interval each)
    image_cache_miss: float = 0.0  # touched intervals whose image is read from the store
    layout: str = "computation"  # rows tables: "single" (before migration 8), "computation" (today), "group"
    groups: int = 10  # interval groups per computation (layout "group")
    group_commit: bool = True
    log_expiry_s: float = 3_600  # deltawheel.logstore.expirationDelaySeconds (today: LOG_ENTRY_EXPIRY_S)


#: today's layout and settings: a rows table per computation, no group commit, entries kept a day; 1 s, 1,000 intervals
TODAY = Deployment(layout="computation", group_commit=False, batch_s=1.0, intervals=1_000, log_expiry_s=LOG_ENTRY_EXPIRY_S)


def _ceiling(writers: float, group_commit: bool) -> float:
    """Measured commits/s of one table at 50 ms for ``writers`` (group commit: one committer)."""
    if group_commit or writers <= 1:
        return MEASURED_50MS[1]
    return MEASURED_50MS[max(n for n in MEASURED_50MS if n <= writers)]


def _table(writers: float, batches_per_s: float, group_commit: bool, batch_s: float) -> dict[str, float]:
    """One table's commits against its ceiling: a version per batch, or with group commit at most one
    per half batch interval (docs/scale.md, "Raising it")."""
    ceiling = _ceiling(writers, group_commit)
    versions = min(batches_per_s, ceiling) if group_commit else batches_per_s
    needed = min(batches_per_s, 2 / batch_s) if group_commit else batches_per_s
    return {"writers": writers, "batches_per_s": batches_per_s, "commits_per_s": versions,
            "batches_per_version": batches_per_s / versions if versions else 0.0, "needed_per_s": needed,
            "ceiling": ceiling, "headroom": ceiling / needed if needed else float("inf")}


def rows_tables(d: Deployment) -> tuple[int, dict[str, float]]:
    """(number of rows tables, the busiest one's commits) under ``d.layout``."""
    executors = d.instances * d.computations
    if d.layout == "single":
        return 1, _table(executors, executors / d.batch_s, d.group_commit, d.batch_s)
    if d.layout == "computation":
        return d.computations, _table(d.instances, d.instances / d.batch_s, d.group_commit, d.batch_s)
    if d.layout == "group":  # an instance's intervals in one group (else a batch spans tables)
        per = max(1.0, d.instances / d.groups)
        return d.computations * d.groups, _table(per, per / d.batch_s, d.group_commit, d.batch_s)
    raise ValueError(f"layout {d.layout!r}: single, computation or group")


def touched(d: Deployment) -> float:
    """Intervals one executor's batch touches: its held intervals hit by its records (uniform keys)."""
    held = d.intervals / d.instances
    records = d.records_per_s * d.batch_s / d.instances
    return held * (1 - (1 - 1 / held) ** records) if held > 1 else min(held, records)


def model(d: Deployment) -> dict[str, Any]:
    """Every figure of the model for ``d``."""
    executors = d.instances * d.computations
    batches = executors / d.batch_s  # all executors' batches per second
    per_comp = d.instances / d.batch_s  # one computation's batches per second
    t = touched(d)
    n_rows, rows = rows_tables(d)
    stream = _table(d.instances, per_comp, d.group_commit, d.batch_s)  # every instance delivers to it
    metrics = _table(rows["writers"], rows["writers"] / max(d.batch_s, METRICS_INTERVAL_S), d.group_commit,
                     d.batch_s)
    tables = {"rows": (n_rows, rows), "stream": (d.computations * d.streams, stream), "metrics": (n_rows, metrics)}
    commits = {"layouts": [
        {"layout": lay, "group_commit": gc, "tables": n, **tb}
        for lay in ("single", "computation", "group") for gc in (False, True)
        for n, tb in [rows_tables(replace(d, layout=lay, group_commit=gc))]]}

    def log_prefix(tb: dict[str, float], lists: float) -> dict[str, float]:
        shared = tb["writers"] > 1 and not d.group_commit
        v = tb["commits_per_s"]
        return {"put": v * (PUTS_PER_VERSION + CKPT_PUTS_PER_VERSION),
                "get": v * ((SHARED_HEADS_PER_VERSION + tb["writers"] - 1) if shared else 0.0),
                "list": v * (SHARED_LISTS_PER_VERSION if shared else 0.0) + lists}

    data_files = FILES_PER_INTERVAL + IDS_FILES_PER_INTERVAL + IDS_MERGED_PER_INTERVAL
    prefixes = {  # name -> (how many such prefixes, requests/s of each)
        "rows/<computation>/ (images, ids files)": (d.computations, {
            "put": per_comp * t * data_files, "get": per_comp * t * d.image_cache_miss * GETS_PER_IMAGE_READ,
            "list": 0.0}),
        "rows table _delta_log/": (n_rows, log_prefix(rows, 0.0)),
        "streams/<stream>/ (production files)": (d.computations * d.streams, {
            "put": per_comp * t, "get": 0.0, "list": 0.0}),
        "streams/<stream>/_delta_log/": (d.computations * d.streams, log_prefix(stream, per_comp * DELIVERY_LISTS)),
        "_metrics/batches _delta_log/": (n_rows, log_prefix(metrics, 0.0)),
        "query checkpoint (offsets, commits)": (executors, {
            "put": CHECKPOINT_FILES_PER_BATCH / d.batch_s, "get": CHECKPOINT_PROBES_PER_BATCH / d.batch_s,
            "list": 0.0}),
    }
    put_s = sum(n * (p["put"] + p["list"]) for n, p in prefixes.values())
    get_s = sum(n * p["get"] for n, p in prefixes.values())
    versions = sum(n * tb["commits_per_s"] for n, tb in tables.values())
    log_entries = max(tb["commits_per_s"] for _, tb in tables.values()) * d.log_expiry_s
    held = d.intervals / d.instances
    zk = {"writes_per_s": batches * ZK_WRITES_PER_BATCH + versions * ZK_WRITES_PER_VERSION,
          "reads_per_s": batches * (ZK_READS_PER_BATCH_FIXED + d.intervals + held),
          "znodes": d.computations * d.intervals * ZNODES_PER_INTERVAL + versions * d.log_expiry_s,
          "log_entries_busiest_table": log_entries,
          "publish_multi_bytes": d.intervals * CHECK_OP_BYTES}
    worst_put = max(p["put"] for _, p in prefixes.values())
    worst_get = max(p["get"] for _, p in prefixes.values())
    limits = [  # (what, used, capacity)
        ("Delta commits/s, busiest rows table", rows["needed_per_s"], rows["ceiling"]),
        ("Delta commits/s, a stream table", stream["needed_per_s"], stream["ceiling"]),
        ("Delta commits/s, a metrics table", metrics["needed_per_s"], metrics["ceiling"]),
        ("S3 PUT/s, busiest prefix", worst_put, S3_PUT_PER_PREFIX),
        ("S3 GET+HEAD/s, busiest prefix", worst_get, S3_GET_PER_PREFIX),
        ("ZooKeeper writes/s", zk["writes_per_s"], ZK_WRITES_PER_S),
        ("ZooKeeper reads/s", zk["reads_per_s"], ZK_READS_PER_S),
        ("log-store entries of one table (getChildren <= jute.maxbuffer)", log_entries,
         JUTE_MAXBUFFER / LOG_ENTRY_NAME_BYTES),
        ("watermark multi bytes (<= jute.maxbuffer)", zk["publish_multi_bytes"], JUTE_MAXBUFFER),
    ]
    checks: list[dict[str, Any]] = sorted(
        ({"limit": w, "used": u, "capacity": c, "headroom": c / u if u else float("inf")} for w, u, c in limits),
        key=lambda x: float(x["headroom"]))
    return {"deployment": asdict(d), "touched_per_batch": t, "batches_per_s": batches, **commits,
            "tables": {k: {"count": n, **tb} for k, (n, tb) in tables.items()},
            "prefixes": {k: {"count": n, **p} for k, (n, p) in prefixes.items()},
            "s3": {"put_list_per_s": put_s, "get_head_per_s": get_s,
                   "usd_per_hour": 3600 * (put_s * S3_PUT_PRICE + get_s * S3_GET_PRICE),
                   "image_bytes_per_s": d.computations * per_comp * t * d.keys / d.intervals * d.bytes_per_key},
            "zookeeper": zk, "limits": checks,
            "breaks_first": next((c["limit"] for c in checks if c["headroom"] < 1), None)}


def _n(x: float) -> str:
    if x == float("inf"):
        return "inf"
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.2f}"


def markdown(m: dict[str, Any]) -> str:
    """The model's tables as Markdown (docs/scale.md carries this text)."""
    d = m["deployment"]
    out = [f"Deployment: {d['instances']} instances, {_n(d['records_per_s'])} records/s and {_n(d['keys'])} keys "
           f"per computation, {d['computations']} computations of {_n(d['intervals'])} intervals, batches every "
           f"{_n(d['batch_s'])} s; layout `{d['layout']}`, group commit {'on' if d['group_commit'] else 'off'}. "
           f"Intervals touched per batch of one instance's computation: {_n(m['touched_per_batch'])}.", "",
           "| rows tables | group commit | tables | writers / table | batches/s / table | commits/s / table "
           "| batches / version | commits/s needed | measured ceiling (s3a, 50 ms) | headroom |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['layout']} | {'yes' if r['group_commit'] else 'no'} | {r['tables']} | {_n(r['writers'])} | "
            f"{_n(r['batches_per_s'])} | {_n(r['commits_per_s'])} | {_n(r['batches_per_version'])} | "
            f"{_n(r['needed_per_s'])} | {_n(r['ceiling'])} | {_n(r['headroom'])} |" for r in m["layouts"]]
    out += ["", "| prefix | prefixes | PUT/s each | GET+HEAD/s each | LIST/s each |", "|---|---|---|---|---|"]
    out += [f"| {k} | {_n(p['count'])} | {_n(p['put'])} | {_n(p['get'])} | {_n(p['list'])} |"
            for k, p in m["prefixes"].items()]
    s3, zk = m["s3"], m["zookeeper"]
    out += ["", f"S3, all prefixes: {_n(s3['put_list_per_s'])} PUT+LIST/s and {_n(s3['get_head_per_s'])} GET+HEAD/s, "
            f"{s3['usd_per_hour']:,.2f} USD per hour in requests; images written: "
            f"{s3['image_bytes_per_s'] / 1e9:,.2f} GB/s. ZooKeeper: {_n(zk['writes_per_s'])} writes/s, "
            f"{_n(zk['reads_per_s'])} reads/s, {_n(zk['znodes'])} znodes.", "",
            "| limit | used | capacity | headroom |", "|---|---|---|---|"]
    out += [f"| {c['limit']} | {_n(c['used'])} | {_n(c['capacity'])} | {_n(c['headroom'])} |" for c in m["limits"]]
    out += ["", f"Breaks first: {m['breaks_first'] or 'nothing (every headroom at least 1)'}."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the model for the default deployment (``--today``: today's layout and settings)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="every figure as JSON instead of Markdown")
    p.add_argument("--today", action="store_true", help="one rows table, no group commit, 1 s batches, 1,000 intervals")
    args = p.parse_args(argv)
    d = TODAY if args.today else Deployment()
    m = model(d)
    print(json.dumps(m, indent=1) if args.json else markdown(m))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
