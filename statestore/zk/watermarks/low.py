"""The low watermark computed from its inputs (MillWheel's rule: the minimum of the intervals'
oldest work and the inputs' low watermarks); pure functions. ``None``, *not known yet*, wins
over every value; :data:`END_OF_TIME` is *finished*.

>>> low_watermark([1_000, END_OF_TIME], [900, END_OF_TIME])
900
>>> low_watermark([1_000], [900, None]) is None
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["END_OF_TIME", "handing_off", "holds_back", "instances_low", "later", "low_watermark", "lowest", "releasing",
           "watched", "work_value"]

END_OF_TIME = 2**63 - 1  #: the watermark of a finished input: every event time is behind it


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


def releasing(released: Mapping[str, Mapping[str, Mapping[str, Any]]],
              caught: Mapping[str, Mapping[int, int]]) -> list[int | None]:
    """The positions at which an instance let go of intervals no later owner caught up on yet.

    ``released``: computation -> interval -> {sequencer, watermark_ms} (``codec.instance_update``).

    >>> rel = {"c": {"0": {"sequencer": 4, "watermark_ms": 900}, "1": {"sequencer": 4, "watermark_ms": 900}}}
    >>> releasing(rel, {"c": {0: 5}}), releasing(rel, {"c": {0: 5, 1: 6}})
    ([900], [])
    """
    return [None if r.get("watermark_ms") is None else int(r["watermark_ms"])
            for comp, ivs in released.items() for i, r in ivs.items()
            if caught.get(comp, {}).get(int(i), -1) <= int(r["sequencer"])]


def watched(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str]) -> set[str]:
    """The computations whose caught-up records :func:`instances_low` needs: those of the intervals
    gone instances held and of the intervals any instance released.

    >>> sorted(watched({"a": {"held": {"c": {}}}, "b": {"held": {"d": {}}, "released": {"e": {}}}}, live=["b"]))
    ['c', 'e']
    """
    live = set(live)
    return {c for n, raw in stored.items() if raw is not None
            for c in [*(raw.get("held") or {} if n not in live else ()), *(raw.get("released") or {})]}


def holds_back(raw: Mapping[str, Any], caught: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether a gone instance's stored estimate ``raw`` still holds its injector's watermark back.

    >>> holds_back({"held": {}, "released": {"c": {"0": {"sequencer": 4, "watermark_ms": 9}}}}, {})
    True
    """
    return handing_off(raw.get("held") or {}, caught) or bool(releasing(raw.get("released") or {}, caught))


def instances_low(stored: Mapping[str, Mapping[str, Any] | None], *, live: Iterable[str],
                  caught: Mapping[str, Mapping[int, int]]) -> int | None:
    """An injector's watermark: the lowest estimate of the live instances and those :func:`handing_off`,
    and the positions of the intervals instances released and no later owner caught up on (a taker
    that dies in its catch-up records none, so the release holds until a later one does).

    >>> instances_low({"a": {"watermark_ms": 5}, "b": {"watermark_ms": 2, "held": {}}}, live=["a"], caught={})
    5
    >>> instances_low({"a": {"watermark_ms": 5}, "b": None}, live=["a", "b"], caught={}) is None
    True
    >>> instances_low({"a": {"watermark_ms": 5, "released": {"c": {"0": {"sequencer": 1, "watermark_ms": 3}}}}},
    ...               live=["a"], caught={"c": {0: 1}})
    3
    """
    live = set(live)
    values: list[int | None] = []
    for n, raw in stored.items():
        if raw is None:
            if n in live:
                values.append(None)  # a live member that has published nothing yet holds it
            continue
        if n in live or handing_off(raw.get("held") or {}, caught):
            values.append(None if raw.get("watermark_ms") is None else int(raw["watermark_ms"]))
        values += releasing(raw.get("released") or {}, caught)
    return lowest(values)
