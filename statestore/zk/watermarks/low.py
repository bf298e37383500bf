"""The low watermark computed from its inputs: pure functions, no ZooKeeper.

ZooKeeper SUSPENDED / LOST: nothing here calls ZooKeeper; the inputs are read (and a paused or
expired connection handled) by ``reading.py``, ``publish.py`` and ``instances.py``.

MillWheel's rule (sections 3.3 and 5.4): the *low watermark* of a computation is the minimum of
the oldest work of each of its key intervals and the low watermarks of its upstream computations
and injectors. ``None`` is *not known yet* (an interval or input never published, an upstream
not declared yet) and wins over every value: no event-time timer may fire on a guess.
:data:`END_OF_TIME` is *finished*: an interval with nothing pending, a drained source; a
computation with no inputs at all has it too.

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
    """What one interval's published oldest work counts with: ``None`` never published (unknown),
    :data:`END_OF_TIME` nothing pending, else its oldest work.

    >>> work_value(None) is None, work_value({"oldest_work_ms": None}) == END_OF_TIME
    (True, True)
    """
    return None if raw is None else END_OF_TIME if raw["oldest_work_ms"] is None else int(raw["oldest_work_ms"])


def low_watermark(upstream: Iterable[int | None], oldest_work: Iterable[int | None]) -> int | None:
    """The low watermark of a computation from the values of its upstream (injectors and
    computations, in declared order) and of its intervals' oldest work (:func:`work_value`).

    >>> low_watermark([END_OF_TIME], [END_OF_TIME, END_OF_TIME]) == END_OF_TIME
    True
    """
    return lowest([*upstream, *oldest_work])


def handing_off(held: Mapping[str, Mapping[str, int]], caught: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether an instance that is gone still holds an injector's watermark back: an interval it
    held has no later owner that caught up on it (a caught-up sequencer above the one it held).

    >>> handing_off({"c": {"3": 7}}, {"c": {3: 7}}), handing_off({"c": {"3": 7}}, {"c": {3: 8}})
    (True, False)
    """
    return any(caught.get(comp, {}).get(int(i), -1) <= int(seq)
               for comp, ivs in held.items() for i, seq in ivs.items())


def gone_holdings(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str]) -> dict[str, Any]:
    """Instance -> the intervals it held (computation -> interval -> sequencer), for the
    instances that are not live and have a stored estimate.

    >>> gone_holdings({"a": {"held": {"c": {"0": 4}}}, "b": {}}, live=["b"])
    {'a': {'c': {'0': 4}}}
    """
    live = set(live)
    return {n: raw.get("held") or {} for n, raw in stored.items() if n not in live and raw is not None}


def instances_low(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str],
                  caught: Mapping[str, Mapping[int, int]]) -> int | None:
    """An injector's watermark from its instances' estimates (name -> stored payload, ``None``:
    none yet): the lowest estimate of the instances that count, the live ones and those gone
    while :func:`handing_off`. A counting instance with no estimate yet makes it unknown.

    >>> instances_low({"a": {"watermark_ms": 5}, "b": {"watermark_ms": 2, "held": {}}}, live=["a"], caught={})
    5
    >>> instances_low({"a": {"watermark_ms": 5}, "b": None}, live=["a", "b"], caught={}) is None
    True
    """
    live = set(live)
    left = gone_holdings(stored, live=live)
    return lowest([None if raw is None or raw.get("watermark_ms") is None else int(raw["watermark_ms"])
                   for n, raw in stored.items() if n in live or handing_off(left[n], caught)])
