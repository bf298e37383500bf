"""The Python worker's cache of interval images: bounded by memory, furthest next use evicted first."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Hashable

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.writepath.image.files import read_rows_file

from .spec import ImageSpec

__all__ = ["ImageCache", "DEFAULT_MAX_BYTES", "MAX_BYTES_ENV", "TRACE_ENV", "image_facts", "max_bytes_from_env",
           "trace", "load_image", "keep_image", "holds"]

DEFAULT_MAX_BYTES = 2 * 2**30  # per Python worker, unless DELTAWHEEL_IMAGE_CACHE_BYTES says otherwise
MAX_BYTES_ENV = "DELTAWHEEL_IMAGE_CACHE_BYTES"
#: A folder: each worker appends its lookups there (one JSON line per lookup), for the cache benchmark.
TRACE_ENV = "DELTAWHEEL_IMAGE_CACHE_TRACE"
_NEVER = math.inf
_ALPHA = 0.5  # weight of the newest observation in the moving averages


def image_facts(table: Any) -> int | None:
    """The image's earliest event-time timer (None: it has none)."""
    import pyarrow.compute as pc

    if "next_event_timer_ms" not in table.column_names or not table.num_rows:
        return None
    got = pc.min(table.column("next_event_timer_ms")).as_py()
    return None if got is None else int(got)


@dataclass(slots=True)
class _Entry:
    value: Any
    nbytes: int
    next_ev: int | None
    last: int
    group: Hashable
    slot: Hashable | None


class ImageCache:
    """Interval images by key, at most ``max_bytes`` of them; ``group``: an entry's computation."""

    def __init__(self, max_bytes: int, *, policy: str = "window") -> None:
        if policy not in ("window", "lru"):
            raise ConfigError(f"unknown image cache policy {policy!r}; use 'window' or 'lru'")
        self.max_bytes = max_bytes
        self.policy = policy
        self._entries: dict[Hashable, _Entry] = {}
        self._slot: dict[Hashable, Hashable] = {}  # slot (computation, interval) -> its entry's key
        self._uses: dict[Hashable, tuple[int, float | None]] = {}  # slot -> (last use, mean gap)
        self.tick = 0  # uses so far (the clock of "batches from now": a use per interval and batch)
        self._wm: dict[Hashable, tuple[int, float | None]] = {}  # group -> (watermark, advance per use)
        self.bytes = 0
        self.lookups = self.hits = self.evictions = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def observe(self, group: Hashable, wm: int | None) -> None:
        """The input low watermark of ``group``'s batch now running (None: none yet)."""
        old = self._wm.get(group)
        if wm is not None and (old is None or wm > old[0]):
            self._wm[group] = _advanced(old, wm)

    def get(self, key: Hashable, *, slot: Hashable | None = None, count: bool = True) -> Any:
        """The cached value of ``key`` (None: not cached); ``slot``'s other images are dropped now."""
        self.tick += 1
        if count:
            self.lookups += 1
        if slot is not None:
            self._uses[slot] = _advanced(self._uses.get(slot), self.tick)
            self._keep_only(slot, key)
        e = self._entries.get(key)
        if e is None:
            return None
        if count:
            self.hits += 1
        e.last = self.tick
        return e.value

    def put(self, key: Hashable, value: Any, *, nbytes: int, next_ev: int | None = None,
            slot: Hashable | None = None, group: Hashable = None) -> None:
        """Keep ``value`` as ``slot``'s current image, then evict until the cache fits ``max_bytes``."""
        if slot is not None:
            prev = self._slot.get(slot)
            self._slot[slot] = key
            if prev is not None and prev != key:
                for old in [k for k, e in self._entries.items() if e.slot == slot and k not in (key, prev)]:
                    self._drop(old)
        if key in self._entries:
            self._drop(key)
        e = _Entry(value, nbytes, next_ev, self.tick, group, slot)
        self._entries[key] = e
        self.bytes += nbytes
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            self._drop(self._victim(keep=key))
            self.evictions += 1
        if self.bytes > self.max_bytes and key in self._entries:  # the one image alone is over the bound
            self._drop(key)
            self.evictions += 1

    def _keep_only(self, slot: Hashable, key: Hashable) -> None:
        for old in [k for k, e in self._entries.items() if e.slot == slot and k != key]:
            self._drop(old)
        if self._slot.get(slot) not in self._entries:
            self._slot.pop(slot, None)
        if key in self._entries:
            self._slot[slot] = key

    def clear(self) -> None:
        """Drop every image (the counters stay)."""
        self._entries.clear()
        self._slot.clear()
        self.bytes = 0

    def _drop(self, key: Hashable) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            self.bytes -= e.nbytes

    def next_use(self, key: Hashable) -> float:
        """Uses from now until ``key`` is expected again (inf: no expectation)."""
        e = self._entries[key]
        best = _NEVER
        slot = e.slot
        per_batch = 1.0
        if slot is not None:
            if self._slot.get(slot) != key:  # an interval's earlier image: a retry's only
                return _NEVER
            last, gap = self._uses.get(slot, (e.last, None))
            if gap is not None:
                due = last + gap - self.tick
                # a use missed by a whole rhythm: another worker runs the interval now (or nobody)
                best = max(0.0, due) if due > -gap else _NEVER
                per_batch = gap
        wm = self._wm.get(e.group)
        if e.next_ev is not None and wm is not None:
            if e.next_ev < wm[0]:
                best = 0.0
            elif wm[1]:
                best = min(best, (e.next_ev - wm[0]) / wm[1] * per_batch)
        return best

    def _victim(self, *, keep: Hashable) -> Hashable:
        cands = [k for k in self._entries if k != keep]
        if self.policy == "lru":
            return min(cands, key=lambda k: self._entries[k].last)
        if keep in self._entries and self.next_use(keep) < _NEVER:
            # the new image itself, when its next use is known and further than every other's: not kept
            # (else a cycle over more intervals than fit evicts each image before its use, as LRU does)
            cands.append(keep)
        # furthest next use first; among equals (none expected), least recently used first
        return max(cands, key=lambda k: (self.next_use(k), -self._entries[k].last))


def _advanced(old: tuple[int, float | None] | None, now: int) -> tuple[int, float | None]:
    """(``now``, the moving average of the steps between) after ``old`` = (last, average)."""
    if old is None:
        return now, None
    step = float(now - old[0])
    return now, step if old[1] is None else _ALPHA * step + (1 - _ALPHA) * old[1]


def max_bytes_from_env() -> int:
    """``DELTAWHEEL_IMAGE_CACHE_BYTES`` (``k``/``m``/``g`` suffixes), else :data:`DEFAULT_MAX_BYTES`."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip().lower()
    if not raw:
        return DEFAULT_MAX_BYTES
    mult = {"k": 2**10, "m": 2**20, "g": 2**30}.get(raw[-1], 1)
    try:
        got = int(float(raw[:-1] if mult != 1 else raw) * mult)
    except ValueError:
        got = -1
    if got <= 0:
        raise ConfigError(f"{MAX_BYTES_ENV}={raw!r} is not a size: give a positive number of bytes, or one with a "
                          f"k, m or g suffix (e.g. 512m)")
    return got


def trace(event: dict[str, Any], *, traced: str | None) -> None:
    """Append one event to this worker's trace file in ``traced`` (None: nothing)."""
    if traced is None:
        return
    event = {"t": time.time(), "pid": os.getpid(), **event}
    with open(os.path.join(traced, f"images-{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


_IMAGES = ImageCache(max_bytes_from_env())
_TRACED = os.environ.get(TRACE_ENV) or None  # record the lookups (``deltawheel bench cache --trace``)


def holds(spec: ImageSpec, iv: int) -> bool:
    """Whether this worker holds interval ``iv``'s current image (no read from the store)."""
    return spec.state_files(iv) in _IMAGES


def load_image(spec: ImageSpec, iv: int) -> tuple[Any, bool]:
    """(interval ``iv``'s image, whether it was read from the store): this worker's copy, else read."""
    import pyarrow as pa

    paths = spec.state_files(iv)
    name = spec.comp.name
    _IMAGES.observe(name, spec.wm)
    table = _IMAGES.get(paths, slot=(name, iv), count=bool(paths))
    hit = table is not None
    if table is None:
        parts = [read_rows_file(spec.rows_root, p, spec.rows_schema) for p in paths]
        table = pa.concat_tables(parts) if parts else spec.rows_schema.empty_table()
        keep_image(paths, table, name, iv)
    if _TRACED:
        trace({"op": "get", "comp": name, "iv": iv, "paths": list(paths), "hit": hit, "wm": spec.wm,
               "bytes": table.nbytes, "next_ev": image_facts(table)}, traced=_TRACED)
    return table, not hit and bool(paths)


def keep_image(paths: tuple[str, ...], table: Any, comp: str, iv: int, *, written: bool = False) -> None:
    """Keep ``table`` as interval ``iv``'s image of the files ``paths``."""
    next_ev = image_facts(table)
    _IMAGES.put(paths, table, nbytes=table.nbytes, next_ev=next_ev, slot=(comp, iv), group=comp)
    if written:
        trace({"op": "put", "comp": comp, "iv": iv, "paths": list(paths), "bytes": table.nbytes, "next_ev": next_ev},
              traced=_TRACED)
