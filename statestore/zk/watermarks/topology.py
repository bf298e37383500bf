"""Who feeds whom: a computation's declared inputs and number of key intervals (no ZooKeeper calls).

An upstream is ``'injector:NAME'`` or ``'computation:NAME'``; the graph must have no cycle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...exceptions import CodecError, ConfigError
from ...layout import validate_name
from ..grants import MAX_INTERVAL, ZNODE_DAMAGED_HINT
from .codec import Raw, decode, encode

__all__ = ["Topology", "declare_update", "declared", "parse_upstream"]

_KINDS = ("computation", "injector")


def parse_upstream(text: str) -> tuple[str, str]:
    """Split ``'computation:NAME'`` / ``'injector:NAME'`` into (kind, name).
    Raises ConfigError: no known prefix, or an invalid name.

    >>> parse_upstream("injector:clicks")
    ('injector', 'clicks')
    """
    kind, sep, name = text.partition(":")
    if not sep or kind not in _KINDS:
        raise ConfigError(f"upstream {text!r} must be 'computation:NAME' or 'injector:NAME'")
    return kind, validate_name(kind, name)


@dataclass(frozen=True)
class Topology:
    """The declared inputs (``'kind:name'`` strings) and key-interval count of a computation.

    >>> t = Topology(("injector:src",), 2)
    >>> Topology.from_payload(t.to_payload()) == t
    True
    """

    upstream: tuple[str, ...]
    num_intervals: int

    def to_payload(self) -> bytes:
        """JSON for the topology znode (carries ``format_version``)."""
        return encode({"upstream": list(self.upstream), "num_intervals": self.num_intervals})

    @classmethod
    def from_payload(cls, data: bytes) -> Topology:
        """Decode :meth:`to_payload` output. Raises CodecError: damaged, or written by a newer deltawheel."""
        raw = decode(data, "topology")
        try:
            return cls(tuple(str(u) for u in raw["upstream"]), int(raw["num_intervals"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"topology payload is damaged: {raw}{ZNODE_DAMAGED_HINT}") from exc


def declared(computation: str, *, upstream: Sequence[str], num_intervals: int) -> Topology:
    """The topology a declaration asks for: upstream names parsed, repeats dropped (first kept).
    Raises ConfigError: bad names or count, or a self-loop.

    >>> declared("c", upstream=["injector:a", "injector:a"], num_intervals=2)
    Topology(upstream=('injector:a',), num_intervals=2)
    """
    if not 1 <= num_intervals <= MAX_INTERVAL + 1:
        raise ConfigError(f"num_intervals of {computation} must be 1..{MAX_INTERVAL + 1}, got {num_intervals}")
    ups = tuple(dict.fromkeys(":".join(parse_upstream(u)) for u in upstream))
    if f"computation:{computation}" in ups:
        raise ConfigError(f"{computation} cannot be its own upstream")
    return Topology(ups, num_intervals)


def declare_update(computation: str, topo: Topology, *, replace: bool) -> Callable[[Raw | None], bytes | None]:
    """The compare-and-set update that declares ``topo`` (a different one only with ``replace``)."""
    def update(old: Raw | None) -> bytes | None:
        have = None if old is None else Topology.from_payload(encode(old))
        if have == topo:
            return None
        if have is not None and not replace:
            raise ConfigError(f"{computation} is already declared with upstream {list(have.upstream)} "
                              f"and {have.num_intervals} intervals; pass replace=True to change it")
        return topo.to_payload()
    return update
