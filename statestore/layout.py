"""Where a store keeps its tables: one folder (or object-store prefix) of Delta tables, each a
property of :class:`StoreLayout`. docs/tables.md describes every table."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .exceptions import ConfigError

__all__ = ["StoreLayout", "validate_name"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def validate_name(kind: str, name: str) -> str:
    """Names of computations and streams: SQL identifiers (letters, digits, _)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{kind} name {name!r} is not valid: use 1-64 letters, digits or '_', "
                          "starting with a letter or '_' (it becomes a table and view name)")
    return name


@dataclass(frozen=True)
class StoreLayout:
    """Paths of a store's tables, below ``root`` (a local path or a URI)."""

    root: str

    def __post_init__(self) -> None:
        root = str(self.root)
        if "://" not in root and not root.startswith("file:"):
            root = os.path.abspath(root)  # Delta's delta.`path` syntax needs an absolute path
        object.__setattr__(self, "root", root.rstrip("/") or "/")

    @property
    def is_local(self) -> bool:
        """True when ``root`` is on the local file system (a path or a ``file://`` URI)."""
        return "://" not in self.root or self.root.startswith("file://")

    @property
    def meta(self) -> str:
        """The ``_meta`` table: the migrations applied."""
        return f"{self.root}/_meta"

    @property
    def rows(self) -> str:
        """The store's first rows table: its Delta id is the store's identity. Since migration 8 it
        holds no rows; each computation's are in :meth:`rows_of`."""
        return f"{self.root}/rows"

    @property
    def computations_root(self) -> str:
        """The folder holding one rows table per computation."""
        return f"{self.root}/computations"

    @property
    def computations_made(self) -> str:
        """The folder recording each computation whose rows table the store made (outside
        :attr:`computations_root`, so that losing a table does not lose its record)."""
        return f"{self.root}/_computations"

    def rows_of(self, computation: str) -> str:
        """The rows table of ``computation``: one row per key (checked as a SQL identifier)."""
        return f"{self.computations_root}/{validate_name('computation', computation)}/rows"

    @property
    def dead_letters(self) -> str:
        """The ``dead_letters`` table: records that could not be processed."""
        return f"{self.root}/dead_letters"

    @property
    def late_data(self) -> str:
        """The ``late_data`` table: records behind the watermark, when routed there."""
        return f"{self.root}/late_data"

    @property
    def metrics_batches(self) -> str:
        """The store-wide ``_metrics/batches`` table older deltawheels appended to (still read and
        collected); each computation's batches go to :meth:`metrics_of`."""
        return f"{self.root}/_metrics/batches"

    @property
    def metrics_root(self) -> str:
        """The folder holding one metrics table per computation."""
        return f"{self.root}/_metrics/computations"

    def metrics_of(self, computation: str) -> str:
        """The metrics table of ``computation``: one row of figures per batch (its own, so that the
        computations of a store do not race for one table's next version)."""
        return f"{self.metrics_root}/{validate_name('computation', computation)}"

    @property
    def audit(self) -> str:
        """The ``_audit`` table: one row per change a tool made under the leases (promote, repair)."""
        return f"{self.root}/_audit"

    @property
    def streams_root(self) -> str:
        """The folder holding one table per stream."""
        return f"{self.root}/streams"

    @property
    def zk_data(self) -> str:
        """The data folder of the embedded ZooKeeper (local stores)."""
        return f"{self.root}/_zk"

    def stream(self, name: str) -> str:
        """The table of stream ``name`` (checked as a SQL identifier)."""
        return f"{self.streams_root}/{validate_name('stream', name)}"
