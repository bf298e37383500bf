"""Computations of the state TTL and state version tests (importable by the Spark workers)."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

from pyspark import cloudpickle

from deltawheel import Computation, ErrorPolicy

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Visits(Computation):
    """Counts each user's clicks; a user idle for a minute of event time is forgotten."""

    name = "visits"
    inputs = {"clicks": "user"}
    outputs = ("counts",)
    state_ttl = timedelta(minutes=1)

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"user": ctx.key, "n": ctx.state})


class IdleVisits(Visits):
    """:class:`Visits` forgetting users idle for ten minutes of processing time instead."""

    state_ttl = None
    state_ttl_processing = timedelta(minutes=10)


class TotalsV1(Computation):
    """Version 1: the state is the user's click count."""

    name = "totals"
    inputs = {"clicks": "user"}
    outputs = ("totals",)

    def process_record(self, ctx: Any, record: Any) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("totals", {"user": ctx.key, "n": ctx.state})


class TotalsV2(Computation):
    """Version 2: the state is ``{"n": count, "last": latest event time}``; v1 counts are upgraded."""

    name = "totals"
    inputs = {"clicks": "user"}
    outputs = ("totals",)
    state_version = 2

    def upgrade_state(self, state: Any, from_version: int) -> Any:
        assert from_version == 1
        return {"n": state, "last": None}

    def process_record(self, ctx: Any, record: Any) -> None:
        st = ctx.state or {"n": 0, "last": None}
        st["n"] += 1
        st["last"] = record.timestamp_ms
        ctx.state = st
        ctx.produce("totals", {"user": ctx.key, "n": st["n"]})


class TotalsV2Broken(TotalsV2):
    """Version 2 whose upgrade fails for one user (the batch fails, by the default error policy)."""

    def upgrade_state(self, state: Any, from_version: int) -> Any:
        if state == 2:
            raise ValueError("cannot upgrade a count of 2")
        return super().upgrade_state(state, from_version)


class TotalsV2BrokenDeadLetter(TotalsV2Broken):
    """:class:`TotalsV2Broken` sending the records of the key it cannot upgrade to dead letters."""

    error_policy = ErrorPolicy.DEAD_LETTER
