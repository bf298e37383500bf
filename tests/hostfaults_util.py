"""What test_hostfaults_job.py reads of a store on the test bed's S3Proxy, without Spark: Delta logs
replayed in Python (commits with their time and metadata, the live files of a stream table), the
clicks job's windows, and the windows the input itself makes (every record once)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

MINUTE = 60_000
#: The first window's start: examples/clicks_job.py's first file begins 20 s into it, and file N
#: covers the end of window N and the start of window N + 1.
BASE = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE


@dataclass(frozen=True)
class Commit:
    """One Delta commit: version, commit time (ms since the epoch), deltawheel's metadata."""

    version: int
    timestamp_ms: int
    meta: dict[str, Any]


class Store:
    """The tables of one store below ``s3a://BUCKET/PREFIX`` (an S3 endpoint of the bed)."""

    def __init__(self, endpoint: Any, uri: str) -> None:
        from pyarrow import fs

        self.fs = fs.S3FileSystem(access_key=endpoint.access_key, secret_key=endpoint.secret_key,
                                  endpoint_override=endpoint.url, region=endpoint.region,
                                  allow_bucket_creation=False, connect_timeout=5, request_timeout=20)
        self.root = uri.removeprefix("s3a://").rstrip("/")

    def _log(self, table: str) -> list[tuple[int, list[dict[str, Any]]]]:
        from pyarrow import fs

        folder = f"{self.root}/{table}/_delta_log"
        try:
            infos = self.fs.get_file_info(fs.FileSelector(folder, allow_not_found=True))
        except OSError:
            return []
        out = []
        for info in sorted(infos, key=lambda i: i.path):
            name = info.path.rsplit("/", 1)[1]
            if name.endswith(".json") and name[:-5].isdigit():
                with self.fs.open_input_stream(info.path) as f:
                    text = f.read().decode()
                out.append((int(name[:-5]), [json.loads(ln) for ln in text.splitlines() if ln.strip()]))
        return out

    def commits(self, table: str = "rows") -> list[Commit]:
        """Every commit of ``table`` in version order."""
        found = []
        for version, actions in self._log(table):
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            try:
                meta = json.loads(info.get("userMetadata") or "{}")
            except ValueError:
                meta = {}
            ts = int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)
            found.append(Commit(version, ts, meta if isinstance(meta, dict) else {}))
        return found

    def stream(self, name: str) -> list[dict[str, Any]]:
        """The records of stream ``name`` (``record_id``, ``key``, ``value`` decoded)."""
        import pyarrow.parquet as pq
        from deltawheel.statestore.codecs import get_codec

        live: set[str] = set()
        for _v, actions in self._log(f"streams/{name}"):
            for a in actions:
                if "add" in a:
                    live.add(a["add"]["path"])
                elif "remove" in a:
                    live.discard(a["remove"]["path"])
        records = []
        for path in sorted(live):
            from urllib.parse import unquote

            table = pq.read_table(f"{self.root}/streams/{name}/{unquote(path)}", filesystem=self.fs)
            for r in table.to_pylist():
                records.append({"record_id": r["record_id"], "key": r["key"],
                                "value": get_codec(r["codec"] or "json").decode(r["value"])})
        return records


def input_windows(store: Store, input_prefix: str) -> tuple[Counter[tuple[str, int]], dict[int, dict[str, int]]]:
    """The windows the input files make: clicks per (user, minute start), users and clicks per minute."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    per_user: Counter[tuple[str, int]] = Counter()
    seen: set[str] = set()
    folder = input_prefix.removeprefix("s3a://").rstrip("/")
    for info in store.fs.get_file_info(fs.FileSelector(folder)):
        if info.path.endswith(".parquet"):
            for r in pq.read_table(info.path, filesystem=store.fs).to_pylist():
                assert r["id"] not in seen, f"record id {r['id']} twice in the input"
                seen.add(r["id"])
                per_user[(r["user"], r["ts"] - r["ts"] % MINUTE)] += 1
    totals: dict[int, dict[str, int]] = defaultdict(lambda: {"users": 0, "clicks": 0})
    for (_user, start), n in per_user.items():
        totals[start]["users"] += 1
        totals[start]["clicks"] += n
    return per_user, dict(totals)


def output_windows(store: Store) -> tuple[Counter[tuple[str, int]], list[tuple[str, int]], dict[int, dict[str, int]],
                                           list[int]]:
    """The job's windows: clicks per (user, start) of ``user_counts`` and the (user, start) pairs
    produced more than once; the ``totals`` per start and the starts produced more than once."""
    per_user: Counter[tuple[str, int]] = Counter()
    twice_user = []
    for r in store.stream("user_counts"):
        k = (r["value"]["user"], int(r["value"]["start"]))
        if k in per_user:
            twice_user.append(k)
        per_user[k] = int(r["value"]["clicks"])
    totals: dict[int, dict[str, int]] = {}
    twice_total = []
    for r in store.stream("totals"):
        start = int(r["value"]["start"])
        if start in totals:
            twice_total.append(start)
        totals[start] = {"users": int(r["value"]["users"]), "clicks": int(r["value"]["clicks"])}
    return per_user, twice_user, totals, twice_total


def windows_closed(store: Store) -> set[int]:
    """The windows (0 = :data:`BASE`'s minute) ``user_counts`` has a count of: window N closes
    once input file N was processed."""
    return {(int(r["value"]["start"]) - BASE) // MINUTE for r in store.stream("user_counts")}
