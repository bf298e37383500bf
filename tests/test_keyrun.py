"""The per-key runner: dedup, event-time order, timers in order, productions, errors (no Spark)."""

from __future__ import annotations

import pytest
from deltawheel.executor.computation import Computation, ErrorPolicy, Record
from deltawheel.executor.tasks.usercode.keyrun import UserCodeError, run_key
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import BadRecordError, ConfigError
from deltawheel.statestore.rowtable.rows import KeyRow, SeenId, TimeDomain, Timer, make_row

J = get_codec("json")


class Window(Computation):
    """Counts per 10 s bucket, emits each bucket when the watermark passes its end."""

    name = "window"
    inputs = {"events": "k"}
    outputs = ("counts",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if record.value.get("boom"):
            raise ValueError("boom")
        start = record.timestamp_ms - record.timestamp_ms % 10_000
        st = ctx.state or {}
        st[str(start)] = st.get(str(start), 0) + 1
        ctx.state = st
        ctx.set_timer(str(start), start + 10_000 - 1)
        ctx.set_timer("tick", ctx.now_ms + 5, domain=TimeDomain.PROCESSING_TIME)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        if timer.domain is TimeDomain.PROCESSING_TIME:
            ctx.produce("counts", {"tick": timer.time_ms})
            return
        st = dict(ctx.state)
        n = st.pop(timer.tag)
        ctx.produce("counts", {"start": int(timer.tag), "n": n}, timestamp_ms=int(timer.tag))
        ctx.state = st or None


def rec(rid: str, ts: int, **v: object) -> Record:
    return Record("a", {"k": "a", **v}, ts, rid)


def test_records_in_event_time_order_timers_in_time_order() -> None:
    out = run_key(Window(), key="a", interval=0, row=None,
                  records=[rec("r3", 25_000), rec("r1", 1_000), rec("r2", 12_000), rec("r1", 1_000)],
                  input_watermark_ms=20_000, now_ms=100)
    assert out.processed == 3 and out.duplicates == 1
    # buckets 0 and 10000 end before the watermark and fire in order; 20000 stays
    assert [J.decode(p.value) for p in out.productions] == [{"start": 0, "n": 1}, {"start": 10_000, "n": 1}]
    assert [p.timestamp_ms for p in out.productions] == [0, 10_000]
    assert out.timers_fired == 2
    assert out.row is not None and J.decode(out.row.state) == {"20000": 1}
    assert {t.tag for t in out.row.timers} == {"20000", "tick"}
    assert [s.record_id for s in out.row.record_ids] == ["r1", "r2", "r3"]
    assert out.row.pending == out.productions  # strong productions are checkpointed in the row
    # production ids are deterministic: a replay of the same input gives the same ids
    again = run_key(Window(), key="a", interval=0, row=None,
                    records=[rec("r2", 12_000), rec("r1", 1_000), rec("r3", 25_000)],
                    input_watermark_ms=20_000, now_ms=100)
    assert [p.production_id for p in again.productions] == [p.production_id for p in out.productions]


def test_replayed_records_are_dropped_and_processing_timers_fire() -> None:
    first = run_key(Window(), key="a", interval=0, row=None, records=[rec("r1", 1_000)],
                    input_watermark_ms=None, now_ms=100)
    assert first.productions == ()  # no watermark yet: event-time timers wait
    row = first.row.with_(pending=())  # type: ignore[union-attr]
    second = run_key(Window(), key="a", interval=0, row=row, records=[rec("r1", 1_000)],
                     input_watermark_ms=None, now_ms=105)
    assert second.processed == 0 and second.duplicates == 1
    assert [J.decode(p.value) for p in second.productions] == [{"tick": 105}]


def test_key_with_nothing_left_is_deleted() -> None:
    out = run_key(Window(), key="a", interval=0, row=None, records=[rec("r1", 1_000)],
                  input_watermark_ms=50_000, now_ms=0)
    # state emptied by the timer, tick timer at 5 fired (now=0 → not yet): still a timer left
    assert out.row is not None and out.row.state is None
    Window.exactly_once = False
    Window.strong_productions = False
    try:
        row = KeyRow(computation="window", key="a", interval=0,
                     timers=(Timer(5, "tick", TimeDomain.PROCESSING_TIME),))
        out2 = run_key(Window(), key="a", interval=0, row=row, records=[], input_watermark_ms=None, now_ms=10)
        assert out2.row is None and out2.changed and len(out2.productions) == 1
    finally:
        Window.exactly_once = True
        Window.strong_productions = True


def test_dedup_horizon_drops_old_ids() -> None:
    row = KeyRow(computation="window", key="a", interval=0,
                 record_ids=(SeenId("old", 10), SeenId("new", 1000)), state=J.encode({}))
    out = run_key(Window(), key="a", interval=0, row=row, records=[], input_watermark_ms=None, now_ms=2000,
                  dedup_horizon_ms=500)
    assert [s.record_id for s in out.row.record_ids] == ["new"]  # type: ignore[union-attr]


def test_user_errors_fail_naming_key_and_record_or_go_to_dead_letters() -> None:
    with pytest.raises(UserCodeError, match=r"key 'a' on record 'r2' \(event time 2000\): ValueError: boom"):
        run_key(Window(), key="a", interval=0, row=None, records=[rec("r1", 1_000), rec("r2", 2_000, boom=1)],
                input_watermark_ms=None, now_ms=0)

    class Tolerant(Window):
        error_policy = ErrorPolicy.DEAD_LETTER

    out = run_key(Tolerant(), key="a", interval=0, row=None,
                  records=[rec("r1", 1_000), rec("r2", 2_000, boom=1)], input_watermark_ms=None, now_ms=0)
    assert out.processed == 2 and [(r.record_id, e) for r, e in out.dead_letters] == [("r2", "ValueError: boom")]
    assert J.decode(out.row.state) == {"0": 1}  # type: ignore[union-attr]
    assert "r2" in {s.record_id for s in out.row.record_ids}  # type: ignore[union-attr]  # not retried


def test_context_rejects_bad_use() -> None:
    class Bad(Computation):
        name = "bad"
        inputs = {"s": "k"}
        outputs = ("o",)

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            if record.value["what"] == "stream":
                ctx.produce("elsewhere", 1)
            elif record.value["what"] == "key":
                ctx.produce("o", 1, key="")
            else:
                ctx.set_timer("t", 1.5)

    for what, err, msg in [("stream", ConfigError, "not among its outputs"),
                           ("key", BadRecordError, "non-empty str"),
                           ("timer", BadRecordError, "timer time must be an int")]:
        with pytest.raises(UserCodeError, match=msg) as info:
            run_key(Bad(), key="a", interval=0, row=None, records=[Record("a", {"what": what}, 1, "r")],
                    input_watermark_ms=None, now_ms=0)
        assert isinstance(info.value.__cause__, err)


def test_computation_declaration_is_validated() -> None:
    class NoInputs(Computation):
        name = "x"

    with pytest.raises(ConfigError, match="declares no input streams"):
        NoInputs.validate()

    class BadName(Computation):
        name = "has space"
        inputs = {"s": "k"}

    with pytest.raises(ConfigError, match="computation name 'has space'"):
        BadName.validate()


def test_spark_zip_finders_skip_invalidation_other_zips_do_not(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """freeze_spark_zips: Spark's own archives are no longer re-read by importlib.invalidate_caches
    (PySpark calls it before every task); other zips still are, imports keep working."""
    import importlib
    import sys
    import zipfile
    import zipimport

    import pyspark
    from deltawheel.executor.tasks import worker as _worker

    core_jar = f"spark-core_2.13-{pyspark.__version__}.jar"  # the jar the workers run from
    paths = {}
    for name, mod in (("pyspark.zip", "dw_frozen_probe"), (core_jar, "dw_jar_probe"),
                      ("user-deps.zip", "dw_user_probe")):
        p = tmp_path / name
        with zipfile.ZipFile(p, "w") as z:
            z.writestr(f"{mod}.py", "VALUE = 1\n")
        paths[name] = str(p)
        monkeypatch.syspath_prepend(str(p))
    importlib.invalidate_caches()
    reads: list[str] = []
    real = zipimport.zipimporter.invalidate_caches

    def counting(self):  # type: ignore[no-untyped-def]
        reads.append(self.archive)
        return real(self)

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", counting)
    import dw_frozen_probe  # noqa: F401  (creates the finders)
    import dw_jar_probe  # noqa: F401  (Spark puts the jar it runs from on the workers' path)
    import dw_user_probe  # noqa: F401

    assert _worker.freeze_spark_zips() >= 2
    assert _worker.freeze_spark_zips() == 0  # already wrapped
    reads.clear()
    importlib.invalidate_caches()
    assert paths["user-deps.zip"] in reads
    assert paths["pyspark.zip"] not in reads and paths[core_jar] not in reads
    frozen = sys.path_importer_cache[paths["pyspark.zip"]]
    assert frozen.find_spec("dw_frozen_probe") is not None and frozen.archive == paths["pyspark.zip"]
    for m in ("dw_frozen_probe", "dw_jar_probe", "dw_user_probe"):
        sys.modules.pop(m, None)
    for p in paths.values():
        sys.path_importer_cache.pop(p, None)


class InPlace(Computation):
    """Changes its state in place without assigning it back (a dict's counter, a list's append)."""

    name = "inplace"
    inputs = {"events": "k"}
    outputs = ()

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if ctx.state is None:
            ctx.state = {"n": 0, "ids": []}
        ctx.state["n"] += 1
        ctx.state["ids"].append(record.record_id)


def test_a_state_changed_in_place_is_kept() -> None:
    first = run_key(InPlace(), key="a", interval=0, row=None, records=[rec("r1", 1), rec("r2", 2)],
                    input_watermark_ms=None, now_ms=1)
    assert first.row is not None and J.decode(first.row.state) == {"n": 2, "ids": ["r1", "r2"]}
    # the next batch reads the stored state and changes it in place only: still kept
    second = run_key(InPlace(), key="a", interval=0, row=first.row, records=[rec("r3", 3)],
                     input_watermark_ms=None, now_ms=2)
    assert second.changed and second.row is not None
    assert J.decode(second.row.state) == {"n": 3, "ids": ["r1", "r2", "r3"]}


class WindowBatch(Window):
    """Window with the per-key batch hook: the same counts from one call per key and batch."""

    calls: list[list[str]] = []

    def process_records(self, ctx, records):  # type: ignore[no-untyped-def]
        WindowBatch.calls.append([r.record_id for r in records])
        st = ctx.state or {}
        for r in records:
            if r.value.get("boom"):
                raise ValueError("boom")
            start = r.timestamp_ms - r.timestamp_ms % 10_000
            st[str(start)] = st.get(str(start), 0) + 1
            ctx.set_timer(str(start), start + 10_000 - 1)
            if r.value.get("emit"):
                ctx.produce("counts", {"seen": r.record_id})
        ctx.state = st
        records.clear()  # user code may change its list: the framework's counts come first


def test_process_records_gets_a_keys_new_records_at_once_in_order() -> None:
    WindowBatch.calls = []
    recs = [rec("r3", 25_000), rec("r1", 1_000), rec("r2", 12_000, emit=1), rec("r1", 1_000)]
    out = run_key(WindowBatch(), key="a", interval=0, row=None, records=recs, input_watermark_ms=20_000, now_ms=100)
    assert WindowBatch.calls == [["r1", "r2", "r3"]]  # once, deduplicated, in event-time order
    assert out.processed == 3 and out.duplicates == 1 and out.timers_fired == 2
    # the same windows as record by record
    per_record = run_key(Window(), key="a", interval=0, row=None, records=recs, input_watermark_ms=20_000, now_ms=100)
    windows = [J.decode(p.value) for p in out.productions if "start" in J.decode(p.value)]
    assert windows == [J.decode(p.value) for p in per_record.productions if "start" in J.decode(p.value)]
    assert J.decode(out.row.state) == J.decode(per_record.row.state) == {"20000": 1}  # type: ignore[union-attr]
    # a production of the call: id from the call's first record, timestamp from its last
    made = [p for p in out.productions if "seen" in J.decode(p.value)]
    assert [(p.production_id, p.timestamp_ms) for p in made] == [(f"{WindowBatch.name}:r1#1", 25_000)]
    # replayed: nothing new, no call
    WindowBatch.calls = []
    again = run_key(WindowBatch(), key="a", interval=0, row=out.row.with_(pending=()),  # type: ignore[union-attr]
                    records=recs, input_watermark_ms=20_000, now_ms=100)
    assert WindowBatch.calls == [] and again.processed == 0 and again.duplicates == 4


def test_process_records_errors_name_the_records_or_dead_letter_the_call() -> None:
    recs = [rec("r1", 1_000, emit=1), rec("r2", 2_000, boom=1)]
    with pytest.raises(UserCodeError, match=r"key 'a' on 2 records 'r1'\.\.'r2' \(event time 1000\.\.2000\): "
                                            r"ValueError: boom"):
        run_key(WindowBatch(), key="a", interval=0, row=None, records=recs, input_watermark_ms=None, now_ms=0)

    class Tolerant(WindowBatch):
        error_policy = ErrorPolicy.DEAD_LETTER

    out = run_key(Tolerant(), key="a", interval=0, row=None, records=recs, input_watermark_ms=None, now_ms=0)
    assert [r.record_id for r, _e in out.dead_letters] == ["r1", "r2"]  # the whole call
    assert all(e.startswith("ValueError: boom (process_records over 2 records") for _r, e in out.dead_letters)
    assert out.productions == ()  # what the call produced before raising is dropped
    assert {s.record_id for s in out.row.record_ids} == {"r1", "r2"}  # type: ignore[union-attr]  # not retried
    assert Tolerant.batches_records() and not Window.batches_records()


class FiringOrder(Computation):
    """Produces each timer it is given; the event-time timer "b" sets two more while it fires."""

    name = "firing_order"
    inputs = {"events": "k"}
    outputs = ("fired",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        pass

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        ctx.produce("fired", [timer.time_ms, timer.tag, timer.domain.value])
        if timer.tag == "b":
            ctx.set_timer("c", 4)  # behind the watermark: due, fires next
            ctx.set_timer("z", 50)  # ahead of it: stays


def test_due_timers_of_both_domains_fire_by_time_tag_and_domain() -> None:
    ev, proc = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME
    timers = tuple(sorted([Timer(5, "a", proc), Timer(5, "a", ev), Timer(3, "b", ev), Timer(7, "p", proc),
                           Timer(9, "d", ev), Timer(10, "e", ev)]))
    row = make_row("firing_order", "a", 0, None, "json", timers, None, timer_seq=1)
    out = run_key(FiringOrder(), key="a", interval=0, row=row, records=[], input_watermark_ms=10, now_ms=6)
    # event-time timers before the watermark (10), processing-time ones at or before now (6), in
    # (time, tag, domain) order; one set while firing that is due fires in its place
    assert [J.decode(p.value) for p in out.productions] == [
        [3, "b", "event_time"], [4, "c", "event_time"], [5, "a", "event_time"], [5, "a", "processing_time"],
        [9, "d", "event_time"]]
    assert out.timers_fired == 5
    assert out.row is not None and out.row.timers == (Timer(7, "p", proc), Timer(10, "e", ev), Timer(50, "z", ev))
