"""A computation's declarations (``num_intervals``, ``codec`` ...) are read from its class: one set
on the instance, as a user might in ``__init__``, is refused when the pipeline is built, naming
the attribute, rather than half the framework using each value."""

from __future__ import annotations

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
    ("codec", "msgpack", r"codec is set on the instance \('msgpack'\), the class declares 'json'"),
    ("exactly_once", False, r"exactly_once is set on the instance \(False\), the class declares True"),
])
def test_a_declaration_set_on_the_instance_is_refused_naming_it(tmp_path: Path, attr: str, value, shown: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=rf"Totals: {shown}; declarations are read from the class"):
        _pipeline(tmp_path, Totals(**{attr: value}))


def test_the_same_value_on_the_instance_and_a_subclass_per_value_are_accepted(tmp_path: Path) -> None:
    assert _pipeline(tmp_path, Totals(num_intervals=4)).computations[0].num_intervals == 4
    eight = type("Totals8", (Totals,), {"num_intervals": 8})()
    assert _pipeline(tmp_path, eight).computations[0].num_intervals == type(eight).num_intervals == 8
    check_instance(Totals(unrelated=1))  # an attribute of the user's own is none of the framework's
