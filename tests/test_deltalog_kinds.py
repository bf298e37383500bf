"""Every checkpoint kind Delta writes is replayed by deltawheel's log reader exactly as Delta's own
snapshot reads it: the version, the live files (path, size, deletion vector or not) and the
application versions, locally and on the object store.

One table goes through the kinds (``build_checkpoint_kinds``: no checkpoint, classic, multi-part,
V2 with a JSON and a Parquet top-level file and sidecars, a V2 checkpoint under the classic name,
after a log cleanup), written as deltawheel writes (Parquet files committed through Delta with
application versions) and by Delta's own DELETE (a deletion vector) and OPTIMIZE (removes); a copy
is kept after each stage. VACUUM is left out here (its
commits carry no file action; 20 s of Spark jobs): the benchmark's tables have it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def kinds(spark, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from deltawheel.benchmarks.deltalog_tables import build_checkpoint_kinds

    return build_checkpoint_kinds(spark, str(tmp_path_factory.mktemp("kinds")), vacuum=False)


@pytest.fixture(scope="module")
def reference(spark, kinds: dict[str, str]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Delta's own snapshot of each kind (the session's DeltaLog)."""
    from deltawheel.benchmarks.deltalog_readers import read_with_delta
    from deltawheel.benchmarks.deltalog_tables import APPS

    return {kind: read_with_delta(spark, path, APPS) for kind, path in kinds.items()}


def _replayed(reference: dict[str, object], files: dict[str, object]) -> dict[str, str]:
    from deltawheel.benchmarks.deltalog_readers import compare, read_with_log
    from deltawheel.benchmarks.deltalog_tables import APPS

    return {kind: compare(reference[kind], read_with_log(f, APPS)) for kind, f in files.items()}  # type: ignore[arg-type]


def test_every_checkpoint_kind_is_replayed_as_delta_reads_it(kinds: dict[str, str],
                                                             reference: dict[str, object]) -> None:
    from deltawheel.statestore.delta.storefs import files_for

    assert sorted(kinds) == sorted(["no_checkpoint", "classic", "multi_part", "v2_json", "v2_parquet_sidecars",
                                    "v2_classic_named", "log_cleaned"])
    names = {kind: sorted(p.name for p in Path(path, "_delta_log").iterdir()) for kind, path in kinds.items()}
    assert any(".checkpoint.0000000001." in n for n in names["multi_part"])  # the kinds are what they say
    assert any(n.endswith(".json") and ".checkpoint." in n for n in names["v2_json"])
    assert f"{8:020d}.checkpoint.parquet" in names["v2_classic_named"]
    assert f"{0:020d}.json" not in names["log_cleaned"]
    assert _replayed(reference, {kind: files_for(path) for kind, path in kinds.items()}) == \
        {kind: "exact" for kind in kinds}


@pytest.mark.objectstore
def test_every_checkpoint_kind_is_replayed_from_the_object_store(spark, s3_bucket: str, kinds: dict[str, str],  # type: ignore[no-untyped-def]
                                                                 reference: dict[str, object]) -> None:
    from deltawheel.benchmarks.deltalog_tables import upload
    from deltawheel.statestore.delta.storefs import table_files

    root = f"s3a://{s3_bucket}/kinds-{uuid.uuid4().hex[:8]}"
    files = {}
    for kind, path in kinds.items():
        files[kind] = table_files(spark, f"{root}/{kind}")
        upload(path, files[kind])
    assert _replayed(reference, files) == {kind: "exact" for kind in kinds}
