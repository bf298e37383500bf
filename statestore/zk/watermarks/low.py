"""The low watermark computed from its inputs: pure functions, no ZooKeeper.

MillWheel's rule: the *low watermark* of a computation is the minimum of its intervals' oldest
work and its inputs' low watermarks. ``None`` is *not known yet* and wins over every value;
:data:`END_OF_TIME` is *finished*.

>>> low_watermark([1_000, END_OF_TIME], [900, END_OF_TIME])
900
>>> low_watermark([1_000], [900, None]) is None
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["END_OF_TIME", "gone_holdings", "handing_off", "instances_low", "later", "low_watermark", "lowest", "work_value"]

END_OF_TIME = 2**63 - 1
"""The watermark of a finished input: every event time is behind it."""


def lowest(values: Sequence[int | None]) -> int | None:
    """Min in which ``None`` (unknown) wins over everything; no values at all give END_OF_TIME.

    >>> lowest([5, 3]), lowest([5, None]), lowest([]) == END_OF_TIME
    (3, None, True)
    """
    return None if None in values else min((v for v in values if v is not None), default=END_OF_TIME)


def later(a: int | None, b: int | None) -> int | None:
    """Max in which ``None`` (unknown) loses to any value.

    >>> later(None, 4), later(7, 4), later(None, None)
    (4, 7, None)
    """
    return b if a is None else a if b is None else max(a, b)


def work_value(raw: Mapping[str, Any] | None) -> int | None:
    """What one interval's published oldest work counts with (:data:`END_OF_TIME`: nothing pending).

    >>> work_value(None) is None, work_value({"oldest_work_ms": None}) == END_OF_TIME
    (True, True)
    """
    return None if raw is None else END_OF_TIME if raw["oldest_work_ms"] is None else int(raw["oldest_work_ms"])


def low_watermark(upstream: Iterable[int | None], oldest_work: Iterable[int | None]) -> int | None:
    """The low watermark of a computation from its upstream values and its intervals' oldest work.

    >>> low_watermark([END_OF_TIME], [END_OF_TIME, END_OF_TIME]) == END_OF_TIME
    True
    """
    return lowest([*upstream, *oldest_work])


def handing_off(held: Mapping[str, Mapping[str, int]], caught: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether a gone instance still holds an injector's watermark back (no later owner caught up).

    >>> handing_off({"c": {"3": 7}}, {"c": {3: 7}}), handing_off({"c": {"3": 7}}, {"c": {3: 8}})
    (True, False)
    """
    return any(caught.get(comp, {}).get(int(i), -1) <= int(seq)
               for comp, ivs in held.items() for i, seq in ivs.items())


def gone_holdings(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str]) -> dict[str, Any]:
    """Instance -> the intervals it held, for the instances that are gone and have a stored estimate.

    >>> gone_holdings({"a": {"held": {"c": {"0": 4}}}, "b": {}}, live=["b"])
    {'a': {'c': {'0': 4}}}
    """
    live = set(live)
    return {n: raw.get("held") or {} for n, raw in stored.items() if n not in live and raw is not None}


def instances_low(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str],
                  caught: Mapping[str, Mapping[int, int]]) -> int | None:
    """An injector's watermark: the lowest estimate of the live instances and those :func:`handing_off`.

    >>> instances_low({"a": {"watermark_ms": 5}, "b": {"watermark_ms": 2, "held": {}}}, live=["a"], caught={})
    5
    >>> instances_low({"a": {"watermark_ms": 5}, "b": None}, live=["a", "b"], caught={}) is None
    True
    """
    live = set(live)
    left = gone_holdings(stored, live=live)
    return lowest([None if raw is None or raw.get("watermark_ms") is None else int(raw["watermark_ms"])
                   for n, raw in stored.items() if n in live or handing_off(left[n], caught)])
