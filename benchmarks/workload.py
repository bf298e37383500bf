"""The "zeitgeist-window-count" benchmark workload: input files and reference output.

The reference output is computed in closed form: as the watermark only grows, an event is late iff
its window end is at or below its batch's watermark, and a window is emitted iff at or below the final."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltawheel.statestore.exceptions import ConfigError, FatalError

__all__ = ["WIN_MS", "DELAY_MS", "SIZES", "EXPECTED_SHA256", "EXPECTED", "WorkloadParams", "ExpectedFigures",
           "WorkloadData", "Reference", "OutputCheck", "WorkloadError", "ensure_workload", "find_generator",
           "compute_reference", "content_digest", "normalize_output", "check_output", "default_data_root"]

WIN_MS = 10_000
DELAY_MS = 10_000
OUT_SCHEMA = pa.schema([("key", pa.string()), ("window_start_ms", pa.int64()), ("count", pa.int64())])


class WorkloadError(FatalError):
    """The benchmark input is missing, cannot be generated, or is not the expected one."""


@dataclass(frozen=True)
class WorkloadParams:
    """Generator parameters (``gen.py --n --b --k --rate --seed``)."""

    n: int
    b: int
    k: int
    rate: int
    seed: int = 42

    @property
    def n_files(self) -> int:
        """``n`` records, ``b`` per file."""
        return (self.n + self.b - 1) // self.b

    def dirname(self) -> str:
        """The dataset's folder name."""
        return f"n{self.n}-b{self.b}-k{self.k}-r{self.rate}-s{self.seed}"


@dataclass(frozen=True)
class ExpectedFigures:
    """Section 3's table: what every correct engine emits for a named size."""

    emitted_rows: int
    sum_counts: int
    late_dropped: int
    open_events: int
    open_windows: int


SIZES: Mapping[str, WorkloadParams] = {
    "small": WorkloadParams(n=200_000, b=10_000, k=50_000, rate=1_000),
    "medium": WorkloadParams(n=500_000, b=100_000, k=50_000, rate=10_000),
    "big": WorkloadParams(n=2_000_000, b=100_000, k=50_000, rate=10_000),
    # beyond WORKLOAD.md: ``big`` over 500,000 key ranks
    "big-keys": WorkloadParams(n=2_000_000, b=100_000, k=500_000, rate=10_000),
}

EXPECTED_SHA256: Mapping[str, str] = {
    "small": "c4af42c336ae8a514df32ff00a202335cf61dad8b67f65fee0aa82d12d96ffe7",
    "medium": "b1de28c701469d2e163eda0077f91e3d6990e18996964d1f8117a09ff5714953",
    "big": "ed541e9cca94d3bd00194ec8cd171bc65c1ed192ac1bb1d94bce91264e5b8918",
    "big-keys": "f1fc80bf93e83517e1059ca6a34055ecefda6ccb052fcc7be0d22562c021412c",
}

EXPECTED: Mapping[str, ExpectedFigures] = {
    "small": ExpectedFigures(72_060, 182_331, 188, 17_481, 6_985),
    "medium": ExpectedFigures(66_899, 324_866, 332, 174_802, 36_370),
    "big": ExpectedFigures(363_076, 1_823_419, 1_871, 174_710, 36_221),
    "big-keys": ExpectedFigures(622_471, 1_823_419, 1_871, 174_710, 60_993),
}


@dataclass(frozen=True)
class Reference:
    """Reference output: emitted rows sorted by (key, window_start_ms), plus the counters."""

    table: pa.Table  # OUT_SCHEMA, sorted
    late_dropped: int
    open_events: int
    open_windows: int
    final_watermark_ms: int

    @property
    def emitted_rows(self) -> int:
        """Rows of the reference output."""
        return int(self.table.num_rows)

    @property
    def sum_counts(self) -> int:
        """The sum of the reference output's counts."""
        return int(pc.sum(self.table.column("count")).as_py() or 0)


@dataclass(frozen=True, kw_only=True)
class WorkloadData:
    """One generated dataset: ``data_dir/input/part-*.parquet`` and ``data_dir/manifest.json``."""

    size: str
    params: WorkloadParams
    data_dir: Path
    files: tuple[Path, ...]
    content_sha256: str
    verified: bool  # digest matched a WORKLOAD.md constant

    @property
    def input_dir(self) -> Path:
        """The folder of the input parquet files."""
        return self.data_dir / "input"

    @property
    def n(self) -> int:
        """The number of input records."""
        return self.params.n

    @property
    def expected(self) -> ExpectedFigures | None:
        """The WORKLOAD.md figures every correct engine matches (None: not a verified named size)."""
        return EXPECTED.get(self.size) if self.verified else None

    @cached_property
    def reference(self) -> Reference:
        """The reference output, computed once per object."""
        return compute_reference(self.files)


@dataclass(frozen=True)
class OutputCheck:
    """How an engine's output compares with the reference (``correct``: same multiset of rows)."""
    emitted_rows: int
    sum_counts: int
    correct: bool
    missing: int  # reference rows the engine did not emit (or emitted with another count)
    unexpected: int  # engine rows not in the reference (incl. duplicates)


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_data_root() -> Path:
    """``<repo>/bench-out/data`` (git-ignored)."""
    return _repo_root() / "bench-out" / "data"


def find_generator() -> Path:
    """Locate the reference ``gen.py``.

    Raises:
        WorkloadError: neither ``$DELTAWHEEL_WORKLOAD_DIR`` nor ``<repo>/../shared/workload`` has it.
    """
    env = os.environ.get("DELTAWHEEL_WORKLOAD_DIR")
    shared = _repo_root().parent / "shared" / "workload" / "gen.py"
    candidates = [*([Path(env) / "gen.py"] if env else []), shared]
    if (found := next((c for c in candidates if c.is_file()), None)) is None:
        looked = ", ".join(str(c) for c in candidates)
        raise WorkloadError(f"reference workload generator gen.py not found (looked at {looked}); set "
                            "DELTAWHEEL_WORKLOAD_DIR to the folder holding WORKLOAD.md's gen.py")
    return found


def _generate(gen: Path, params: WorkloadParams, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(gen), "--n", str(params.n), "--b", str(params.b), "--k", str(params.k),
           "--rate", str(params.rate), "--seed", str(params.seed), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise WorkloadError(f"gen.py failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def content_digest(files: tuple[Path, ...] | list[Path]) -> str:
    """SHA-256 of ``"{record_id},{key},1,{event_time_ms}\\n"`` over all rows, as in section 1.4."""
    h = hashlib.sha256()
    for f in files:
        t = pq.read_table(f, columns=["record_id", "key", "value", "event_time"])
        ms = pc.divide(t.column("event_time").cast(pa.int64()), 1000).cast(pa.string())
        vals = t.column("value").cast(pa.string())
        lines = pc.binary_join_element_wise(t.column("record_id"), t.column("key"), vals, ms, ",")
        h.update(("\n".join(lines.to_pylist()) + "\n").encode() if len(lines) else b"")
    return h.hexdigest()


def ensure_workload(size: str, *, root: Path | None = None, params: WorkloadParams | None = None,
                    verify_content: bool = True) -> WorkloadData:
    """The dataset of a named ``size``, or of ``params`` under another name (unchecked), generated
    under ``root`` (default :func:`default_data_root`) if absent; ``verify_content``: recompute its digest.

    Raises:
        WorkloadError: unknown size, generator missing or failing, or digest mismatch.
    """
    root = Path(root) if root is not None else default_data_root()
    named = size in SIZES
    if params is None and not named:
        raise WorkloadError(f"unknown workload size {size!r}: use one of {sorted(SIZES)} or pass params=")
    if params is not None and named and params != SIZES[size]:
        raise WorkloadError(f"size {size!r} is a named size with fixed parameters; use another name")
    params = params or SIZES[size]
    data_dir = root / (f"DATA_{size}" if named else f"DATA_{size}-{params.dirname()}")
    manifest_path = data_dir / "manifest.json"

    def load() -> Mapping[str, Any] | None:
        if not manifest_path.is_file():
            return None
        m = json.loads(manifest_path.read_text())
        files_ok = all((data_dir / "input" / f["file"]).is_file() for f in m.get("files", []))
        p = m["params"]
        got = WorkloadParams(n=p["n"], b=p["b"], k=p["k"], rate=p["rate_per_s"], seed=p["seed"])
        return m if files_ok and got == params else None

    manifest = load()
    if manifest is None:
        _generate(find_generator(), params, data_dir)
        manifest = load()
        if manifest is None:
            raise WorkloadError(f"gen.py ran but {manifest_path} is missing or does not match {params}")
    files = tuple(data_dir / "input" / f["file"] for f in manifest["files"])
    digest = str(manifest["content_sha256"])
    if verify_content and (actual := content_digest(files)) != digest:
        raise WorkloadError(f"{data_dir}: the Parquet files do not match their manifest (content_sha256 "
                            f"{actual} vs {digest}); delete the folder to regenerate it")
    if named and digest != EXPECTED_SHA256[size]:
        raise WorkloadError(
            f"{data_dir}: content_sha256 {digest} differs from WORKLOAD.md's {EXPECTED_SHA256[size]} for "
            f"size {size!r}; the generator or its numpy/pyarrow versions changed. Delete the folder and "
            "regenerate with the reference gen.py")
    return WorkloadData(size=size, params=params, data_dir=data_dir, files=files, content_sha256=digest,
                        verified=named)


def compute_reference(files: tuple[Path, ...] | list[Path]) -> Reference:
    """Section 2's semantics, vectorized per file (the module docstring says why it is exact)."""
    if not files:
        raise ConfigError("compute_reference needs at least one input file")
    parts = []
    wm: int | None = None
    max_et: int | None = None
    late = 0
    for f in files:
        t = pq.read_table(f, columns=["key", "event_time"])
        et = pc.divide(t.column("event_time").cast(pa.int64()), 1000)
        ws = pc.multiply(pc.divide(et, WIN_MS), WIN_MS)  # integer division = floor, times are > 0
        bt = pa.table({"key": t.column("key"), "ws": ws})
        if wm is not None:
            ok = pc.greater(pc.add(ws, WIN_MS), wm)
            late += len(ok) - int(pc.sum(ok.cast(pa.int64())).as_py() or 0)
            bt = bt.filter(ok)
        parts.append(bt)
        bmax = int(pc.max(et).as_py())
        max_et = bmax if max_et is None else max(max_et, bmax)
        wm = max_et - DELAY_MS
    assert wm is not None
    counts = pa.concat_tables(parts).group_by(["key", "ws"]).aggregate([("key", "count")])
    counts = counts.rename_columns([c if c != "key_count" else "count" for c in counts.column_names])
    closed = pc.less_equal(pc.add(counts.column("ws"), WIN_MS), wm)
    emitted = counts.filter(closed)
    still_open = counts.filter(pc.invert(closed))
    table = pa.table({"key": emitted.column("key"), "window_start_ms": emitted.column("ws"),
                      "count": emitted.column("count").cast(pa.int64())}, schema=OUT_SCHEMA)
    table = table.sort_by([("key", "ascending"), ("window_start_ms", "ascending")])
    return Reference(table=table, late_dropped=late,
                     open_events=int(pc.sum(still_open.column("count")).as_py() or 0),
                     open_windows=still_open.num_rows, final_watermark_ms=wm)


def _to_epoch_ms(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_timestamp(col.type):
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[col.type.unit]
        raw = col.cast(pa.int64())
        return pc.multiply(raw, 1000) if per_ms is None else pc.divide(raw, per_ms)
    if pa.types.is_integer(col.type):
        return col.cast(pa.int64())
    raise ConfigError(f"window_start has type {col.type}; expected a timestamp or epoch milliseconds")


def normalize_output(table: pa.Table) -> pa.Table:
    """Engine output (``key``, ``window_start`` or ``window_start_ms``, ``count``) as OUT_SCHEMA, sorted."""
    ws_name = "window_start" if "window_start" in table.column_names else "window_start_ms"
    out = pa.table({"key": table.column("key").cast(pa.string()),
                    "window_start_ms": _to_epoch_ms(table.column(ws_name)),
                    "count": table.column("count").cast(pa.int64())}, schema=OUT_SCHEMA)
    return out.sort_by([("key", "ascending"), ("window_start_ms", "ascending")])


def check_output(table: pa.Table, reference: Reference) -> OutputCheck:
    """Compare an engine's emitted rows with the reference as multisets."""
    got = normalize_output(table)
    emitted_rows = got.num_rows
    sum_counts = int(pc.sum(got.column("count")).as_py() or 0)
    if got.equals(reference.table):
        return OutputCheck(emitted_rows, sum_counts, True, 0, 0)
    g = got.group_by(["key", "window_start_ms", "count"]).aggregate([([], "count_all")])
    r = reference.table.group_by(["key", "window_start_ms", "count"]).aggregate([([], "count_all")])
    j = r.join(g, ["key", "window_start_ms", "count"], join_type="full outer",
               left_suffix="_ref", right_suffix="_got")
    ref_n = pc.fill_null(j.column("count_all_ref"), 0)
    got_n = pc.fill_null(j.column("count_all_got"), 0)
    diff = pc.subtract(ref_n, got_n)
    missing = int(pc.sum(pc.max_element_wise(diff, 0)).as_py() or 0)
    unexpected = int(pc.sum(pc.max_element_wise(pc.negate(diff), 0)).as_py() or 0)
    return OutputCheck(emitted_rows, sum_counts, missing == 0 and unexpected == 0, missing, unexpected)
