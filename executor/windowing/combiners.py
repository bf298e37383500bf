"""What is computed: combining functions, so windowed state holds accumulators, not elements;
accumulators and pane values must be values the computation's codec encodes.

>>> fn = Mean()
>>> fn.extract(fn.merge([fn.add(fn.create(), 2), fn.add(fn.create(), 4)]))
3.0
"""

from __future__ import annotations

from typing import Any, Sequence

from deltawheel.statestore.codecs import Codec
from deltawheel.statestore.exceptions import CodecError

from .windows import WindowingError

__all__ = ["CombineFn", "Sum", "Count", "Min", "Max", "Mean", "combine_fn_from_spec", "check_encodable", "negate"]


class CombineFn:
    """A user combiner: override ``create``, ``add``, ``merge``, maybe ``extract`` (docs/windowing.md)."""

    def create(self) -> Any:
        """A new, empty accumulator."""
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        """``acc`` with ``value`` folded in (may mutate and return ``acc``)."""
        raise NotImplementedError

    def merge(self, accs: Sequence[Any]) -> Any:
        """One accumulator combining ``accs``."""
        raise NotImplementedError

    def extract(self, acc: Any) -> Any:
        """The output value of a pane from its accumulator."""
        return acc


class Sum(CombineFn):
    """Sum of the values (an empty pane sums to 0)."""

    def create(self) -> Any:
        """0."""
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        """``acc + value``."""
        return acc + value

    def merge(self, accs: Sequence[Any]) -> Any:
        """The sum of the partial sums."""
        return sum(accs, 0)


class Count(Sum):
    """Number of elements."""

    def add(self, acc: Any, value: Any) -> Any:
        """``acc + 1`` (the value is not looked at)."""
        return acc + 1


class _Extreme(CombineFn):
    _pick: Any = staticmethod(min)

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self._pick(acc, value)

    def merge(self, accs: Sequence[Any]) -> Any:
        present = [a for a in accs if a is not None]
        return self._pick(present) if present else None


class Min(_Extreme):
    """Smallest value (None for an empty pane)."""


class Max(_Extreme):
    """Largest value (None for an empty pane)."""

    _pick = staticmethod(max)


class Mean(CombineFn):
    """Arithmetic mean (None for an empty pane); accumulator ``[sum, count]``."""

    def create(self) -> Any:
        """``[0, 0]``: sum and count."""
        return [0, 0]

    def add(self, acc: Any, value: Any) -> Any:
        """``[sum + value, count + 1]`` (a new list)."""
        return [acc[0] + value, acc[1] + 1]

    def merge(self, accs: Sequence[Any]) -> Any:
        """The sums and the counts added up."""
        return [sum(a[0] for a in accs), sum(a[1] for a in accs)]

    def extract(self, acc: Any) -> Any:
        """``sum / count``; None for an empty pane."""
        return acc[0] / acc[1] if acc[1] else None


_BUILTIN: dict[str, type[CombineFn]] = {"sum": Sum, "count": Count, "min": Min, "max": Max, "mean": Mean}


def combine_fn_from_spec(spec: str | CombineFn) -> CombineFn:
    """A built-in combiner by name (WindowingError if unknown), or ``spec`` itself if a :class:`CombineFn`."""
    if isinstance(spec, CombineFn):
        return spec
    if spec not in _BUILTIN:
        raise WindowingError(f"unknown combine {spec!r}; use one of {', '.join(_BUILTIN)} or a CombineFn")
    return _BUILTIN[spec]()


def negate(value: Any) -> Any:
    """The value of a retraction pane: the withdrawn value negated if a number (not a bool), else unchanged.

    >>> negate(7), negate(2.5), negate(True), negate({"n": 1}), negate(None)
    (-7, -2.5, True, {'n': 1}, None)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return -value
    return value


def check_encodable(fn: CombineFn, method: str, value: Any, codec: Codec) -> None:
    """WindowingError (naming the combiner, method, type and fix) if ``codec`` cannot encode ``value``,
    returned by ``fn``'s ``method``.

    >>> from deltawheel.statestore.codecs import get_codec
    >>> check_encodable(Sum(), "add", 3, get_codec("json"))
    """
    try:
        codec.encode(value)
    except CodecError as exc:
        why = exc.__cause__ if exc.__cause__ is not None else exc
        raise WindowingError(
            f"combiner {type(fn).__name__}: {method}() returned a {type(value).__name__}, which the computation's "
            f"codec {codec.name!r} cannot encode ({why}). Accumulators and pane values are kept in the key's state "
            "and produced through the codec: return lists, dicts with string keys, str, int, float, bool or None "
            "(e.g. a sorted list instead of a set), or build the computation with codec='pickle', "
            "allow_pickle=True") from None
