"""Some of a computation's declarations (``num_intervals``, ``inputs``, the state TTLs) are read from
its class: one set on the instance, as a user might in ``__init__``, is refused when the pipeline
is built, naming the attribute, rather than half the framework using each value."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation, check_instance
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError


class Totals(Computation):
    name = "totals"
    inputs = {"events": RECORD_KEY}
    num_intervals = 4

    def __init__(self, **settings) -> None:  # type: ignore[no-untyped-def]
        for k, v in settings.items():
            setattr(self, k, v)

    def process_record(self, ctx, record) -> None:  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def _pipeline(tmp_path: Path, comp: Computation) -> Pipeline:
    inj = ParquetInjector("events", str(tmp_path), key_column="key", event_time_column="t", watermark_delay_ms=0)
    return Pipeline("p", (inj,), (comp,))


@pytest.mark.parametrize("attr,value,shown", [
    ("num_intervals", 8, r"num_intervals is set on the instance \(8\), the class declares 4"),
    ("inputs", {"other": RECORD_KEY}, r"inputs is set on the instance \(\{'other': '@key'\}\), the class "
                                      r"declares \{'events': '@key'\}"),
    ("state_ttl", timedelta(hours=1), r"state_ttl is set on the instance \(datetime.timedelta\(seconds=3600\)\), "
                                      r"the class declares None"),
])
def test_a_declaration_set_on_the_instance_is_refused_naming_it(tmp_path: Path, attr: str, value, shown: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=rf"Totals: {shown}; declarations are read from the class"):
        _pipeline(tmp_path, Totals(**{attr: value}))


def test_the_same_value_on_the_instance_and_a_subclass_per_value_are_accepted(tmp_path: Path) -> None:
    assert _pipeline(tmp_path, Totals(num_intervals=4)).computations[0].num_intervals == 4
    eight = type("Totals8", (Totals,), {"num_intervals": 8})()
    assert _pipeline(tmp_path, eight).computations[0].num_intervals == type(eight).num_intervals == 8
    check_instance(Totals(unrelated=1))  # an attribute of the user's own is none of the framework's
    # declarations read from the instance may be set there (a test's shorter delivery timeout)
    assert _pipeline(tmp_path, Totals(delivery_timeout_s=1.0, codec="msgpack")).computations[0].codec == "msgpack"
