"""The watermark znodes: where each payload lives, its format, how a new one replaces the stored one.

ZooKeeper SUSPENDED / LOST: only :func:`read_injector_watermark` calls ZooKeeper, once. Injector
watermarks, instance estimates and published low watermarks never move back; oldest work may. A
payload of a newer format is refused, one of a newer sequencer never overwritten."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ...clock import Clock
from ...exceptions import CodecError, StaleSequencerError
from ...layout import validate_name
from ..grants import decode_lease, interval_path
from .low import END_OF_TIME, later

__all__ = ["WATERMARK_FORMAT_VERSION", "Raw", "Znodes", "caught_up_payload", "check_ms", "decode", "encode",
           "injector_payload", "instance_update", "low_payload", "oldest_work_payload", "read_injector_watermark",
           "stale"]

WATERMARK_FORMAT_VERSION = 1
Raw = dict[str, Any]
_FOLDERS = {"topology": "topology", "injectors": "watermarks/injectors", "low": "watermarks/low",
            "computations": "watermarks/computations", "instances": "watermarks/instances",
            "caught_up": "watermarks/caught_up"}


@dataclass(frozen=True)
class Znodes:
    """The znodes of one pipeline's watermarks (the package docstring's layout); names are validated.

    >>> z = Znodes("p")
    >>> z.interval("c", 3), z.low("c")
    ('/pipelines/p/watermarks/computations/c/00003', '/pipelines/p/watermarks/low/c')
    """

    pipeline: str

    def folder(self, kind: str) -> str:
        """The folder of one kind of znode (a key of ``_FOLDERS``)."""
        return f"/pipelines/{self.pipeline}/{_FOLDERS[kind]}"

    def topology(self, computation: str) -> str:
        """The topology znode of a computation."""
        return f"{self.folder('topology')}/{validate_name('computation', computation)}"

    def injector(self, injector: str) -> str:
        """The watermark znode of an injector."""
        return f"{self.folder('injectors')}/{validate_name('injector', injector)}"

    def low(self, computation: str) -> str:
        """The published low watermark znode of a computation."""
        return f"{self.folder('low')}/{validate_name('computation', computation)}"

    def computation(self, computation: str) -> str:
        """The folder of a computation's per-interval oldest work."""
        return f"{self.folder('computations')}/{validate_name('computation', computation)}"

    def interval(self, computation: str, interval: int) -> str:
        """The oldest-work znode of one interval of a computation."""
        return f"{self.computation(computation)}/{interval:05d}"

    def instances(self, injector: str) -> str:
        """The folder of the instances' estimates of ``injector``."""
        return f"{self.folder('instances')}/{validate_name('injector', injector)}"

    def caught_up(self, computation: str) -> str:
        """The folder of a computation's caught-up sequencers (by interval)."""
        return f"{self.folder('caught_up')}/{validate_name('computation', computation)}"

    def owner(self, computation: str, interval: int) -> str:
        """The lease owner znode of an interval (``grants.py``); checks the interval's range."""
        return f"{interval_path(self.pipeline, computation, interval)}/owner"


def encode(fields: Raw) -> bytes:
    """A payload: ``fields`` with the format version, as JSON."""
    return json.dumps({"format_version": WATERMARK_FORMAT_VERSION, **fields}, sort_keys=True).encode()


def decode(data: bytes, what: str) -> Raw:
    """The fields of a payload. Raises CodecError: not a JSON object, or another format version."""
    raw = decode_lease(data, what)
    if raw.get("format_version") != WATERMARK_FORMAT_VERSION:
        raise CodecError(f"{what} payload has format_version {raw.get('format_version')!r}, this "
                         f"deltawheel reads {WATERMARK_FORMAT_VERSION}; upgrade deltawheel")
    return raw


def check_ms(name: str, value: int | None, *, optional: bool) -> None:
    """Raise :class:`CodecError` unless ``value`` is epoch milliseconds (or None, if optional)."""
    if (value is not None or not optional) and (not isinstance(value, int) or isinstance(value, bool)
                                                or not -END_OF_TIME <= value <= END_OF_TIME):
        raise CodecError(f"{name} must be epoch milliseconds (an int up to END_OF_TIME), got {value!r}")


def read_injector_watermark(client: KazooClient, *, pipeline: str, injector: str) -> int | None:
    """The stored watermark of ``injector`` (None: never published), read once, for read-only tools."""
    path = Znodes(validate_name("pipeline", pipeline)).injector(injector)
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return None
    return int(decode(data, "injector watermark")["watermark_ms"])


def stale(what: str, ours: int, theirs: object, where: str) -> StaleSequencerError:
    """The error of a writer whose sequencer ``ours`` is older than ``theirs`` found at ``where``."""
    return StaleSequencerError(f"{what}: {where} has sequencer {theirs}, newer than ours ({ours}); drop the "
                               "interval and re-acquire its lease")


def oldest_work_payload(what: str, old: Raw | None, oldest: int | None, sequencer: int, *, clock: Clock) -> bytes:
    """The new oldest-work payload over ``old``; a newer sequencer there raises StaleSequencerError."""
    if old is not None and int(old["sequencer"]) > sequencer:
        raise stale(what, sequencer, old["sequencer"], "the published oldest work")
    return encode({"sequencer": sequencer, "oldest_work_ms": oldest, "published_ms": clock.now_ms()})


def low_payload(old: Raw | None, computed: int | None, *, clock: Clock) -> tuple[int | None, bytes | None]:
    """(max(stored, computed), the new low-watermark payload; None when it does not move)."""
    before = None if old is None else old["low_watermark_ms"]
    low = later(before, computed)
    if low == before:
        return low, None
    return low, encode({"low_watermark_ms": low, "computed_ms": computed,
                        "revision": 0 if old is None else int(old["revision"]) + 1,
                        "published_ms": clock.now_ms()})


def injector_payload(what: str, old: Raw | None, watermark_ms: int, sequencer: int, *,
                     clock: Clock) -> tuple[int, bytes | None]:
    """(the value stored after publishing ``watermark_ms`` over ``old``, the new payload or None)."""
    before = None if old is None else int(old["watermark_ms"])
    if old is not None and int(old["sequencer"]) > sequencer:
        raise StaleSequencerError(f"{what}: stored sequencer {old['sequencer']} is newer than ours "
                                  f"({sequencer}); another instance runs this source, stop this one")
    value = max(watermark_ms, before if before is not None else watermark_ms)
    if old is not None and before == value and int(old["sequencer"]) == sequencer:
        return value, None
    return value, encode({"sequencer": sequencer, "watermark_ms": value, "published_ms": clock.now_ms()})


def instance_update(what: str, instance: str, watermark_ms: int | None, *, sequencer: int,
                    held: Mapping[str, Mapping[int, int]] | None, clock: Clock) -> Callable[[Raw | None], bytes | None]:
    """The compare-and-set update of an instance's estimate and held intervals (``None`` keeps either).
    An interval ``held`` no longer lists under its stored sequencer is *released*: kept with that
    sequencer and the estimate stored before (where the instance stopped processing it) until it is
    held again under a newer sequencer (:func:`.low.releasing`)."""
    def update(old: Raw | None) -> bytes | None:
        if old is not None and int(old["sequencer"]) > sequencer:
            raise StaleSequencerError(f"{what}: stored sequencer {old['sequencer']} is newer than ours "
                                      f"({sequencer}); another run of instance {instance} reads this source, "
                                      "stop this one")
        before = None if old is None else old.get("watermark_ms")
        value = later(None if before is None else int(before), watermark_ms)
        old_held: Raw = dict(old.get("held") or {}) if old is not None else {}
        old_released: Raw = dict(old.get("released") or {}) if old is not None else {}
        now_held, released = dict(old_held), dict(old_released)
        if held is not None:
            for comp, ivs in held.items():
                now = now_held[comp] = {str(i): int(s) for i, s in ivs.items()}
                released[comp] = _released(old_held.get(comp) or {}, old_released.get(comp) or {}, now,
                                           None if before is None else int(before))
            released = {c: r for c, r in released.items() if r}
        if old is not None and (value, sequencer, now_held, released) == (
                before, int(old["sequencer"]), old_held, old_released):
            return None
        fields: Raw = {"sequencer": sequencer, "watermark_ms": value, "published_ms": clock.now_ms(), "held": now_held}
        if released:  # absent: none
            fields["released"] = released
        return encode(fields)
    return update


def _released(old: Mapping[str, int], released: Mapping[str, Raw], now: Mapping[str, int],
              position: int | None) -> dict[str, Raw]:
    """One computation's released intervals after ``old`` held ones became ``now``.

    >>> _released({"0": 4, "1": 4}, {}, {"1": 6}, 900)
    {'0': {'sequencer': 4, 'watermark_ms': 900}}
    >>> _released({"1": 6}, {"0": {"sequencer": 4, "watermark_ms": 900}}, {"0": 7, "1": 6}, 950)
    {}
    >>> _released({"0": 4}, {}, {"0": 7}, 950)  # held again under a newer sequencer: not released
    {}
    """
    out = {i: dict(r) for i, r in released.items()}
    out.update({i: {"sequencer": int(seq), "watermark_ms": position} for i, seq in old.items() if now.get(i) != int(seq)})
    return {i: r for i, r in out.items() if not (i in now and int(now[i]) > int(r["sequencer"]))}


def caught_up_payload(old: Raw | None, sequencer: int, *, clock: Clock) -> bytes | None:
    """The caught-up record of an interval's owner with ``sequencer``; None when the stored one is as new."""
    if old is not None and int(old["sequencer"]) >= sequencer:
        return None
    return encode({"sequencer": sequencer, "published_ms": clock.now_ms()})
