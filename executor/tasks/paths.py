"""The write paths an executor can take, registered in one table.

A write path has two halves, each in a folder of its own: its writes of the rows and stream
tables (a :class:`~deltawheel.statestore.writepath.WritePath`, ``statestore/writepath/<name>/``)
and the Spark job whose output those writes commit and deliver (a :class:`~.job.UserJob`,
``executor/tasks/<name>/``). :data:`PATHS` builds both halves of each path for an executor,
which takes one by name (``write_path``, as :func:`choose_write_path` resolves it) and holds no
branch per path. A new path adds its two folders and one entry here (and a rule in
:func:`choose_write_path` if ``"auto"`` may pick it).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Protocol

from deltawheel.statestore.delta.storefs import supports
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.writepath import WritePath
from deltawheel.statestore.writepath.image.path import ImagePath
from deltawheel.statestore.writepath.merge.path import MergePath

from ..computation import Computation
from .image.job import ImageTasks
from .job import UserJob
from .merge.job import MergeTasks

__all__ = ["PATHS", "WRITE_PATHS", "PathKind", "choose_write_path", "image_path", "merge_path"]


class PathKind(Protocol):
    """Builds one write path and its user job for an executor of ``comp`` over ``owner``'s
    intervals. ``partitions``: tasks per batch; ``event_ahead_ms``: per input stream, how far a
    record's event time may be ahead of the clock; ``watermarks``: the executor publishes
    watermarks (from the oldest work the path reports)."""

    def __call__(self, spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *,
                 partitions: int, event_ahead_ms: Mapping[str, int],
                 watermarks: bool) -> tuple[WritePath[Any], UserJob[Any]]:
        """(the write path, the user job feeding it)."""


def image_path(spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *, partitions: int,
               event_ahead_ms: Mapping[str, int], watermarks: bool) -> tuple[ImagePath, ImageTasks]:
    """The image path: each task turns an interval's image into a new one, the driver commits all
    of them in one Delta transaction (local, ``file:`` and ``s3a://`` stores). Its oldest work
    comes from the images either way."""
    path = ImagePath(spark, layout, owner, name=comp.name, outputs=comp.outputs,
                     retention_ms=comp.dedup_retention_ms() if comp.exactly_once else None)
    return path, ImageTasks(comp, layout, path, partitions=partitions, event_ahead_ms=event_ahead_ms)


def merge_path(spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *, partitions: int,
               event_ahead_ms: Mapping[str, int], watermarks: bool) -> tuple[MergePath, MergeTasks]:
    """The fenced MERGE path: one Delta MERGE per batch (any store); it tracks its intervals'
    oldest work only for an executor that publishes watermarks."""
    path = MergePath(spark, layout, owner, name=comp.name, outputs=comp.outputs, track_oldest=watermarks,
                     dedup=comp.exactly_once)
    return path, MergeTasks(spark, comp, layout, path, partitions=partitions, event_ahead_ms=event_ahead_ms)


#: write path name -> how to build it for an executor
PATHS: Mapping[str, PathKind] = MappingProxyType({"image": image_path, "merge": merge_path})
WRITE_PATHS = ("auto", *PATHS)  # "auto": choose_write_path picks one


def choose_write_path(requested: str, root: str) -> tuple[str, str]:
    """(the write path, why) for ``write_path=requested`` on the store at ``root``.

    ``"auto"`` takes the image path wherever Python reaches the store's files (a local folder,
    ``file:`` or ``s3a://``: ``statestore/delta/storefs.py``) and the MERGE path elsewhere.

    >>> choose_write_path("auto", "s3a://bucket/store")[0], choose_write_path("auto", "abfss://c@a/s")
    ('image', ('merge', 'auto: the image path reads and writes files with pyarrow on local, file: and s3a:// stores only; abfss://c@a/s is none of those, so batches take the fenced MERGE path (slower)'))

    Raises:
        ConfigError: an unknown path, or ``"image"`` on a store the image path cannot reach.
    """
    if requested not in WRITE_PATHS:
        raise ConfigError(f"write_path must be one of {', '.join(WRITE_PATHS)}, not {requested!r}")
    fast = supports(root)
    if requested == "image" and not fast:
        raise ConfigError(f"write_path='image' reads and writes the interval images with pyarrow and supports "
                          f"local, file: and s3a:// stores only; {root} is none of those: use write_path='merge' "
                          f"or 'auto'")
    if requested != "auto":
        return requested, f"{requested}: as asked"
    if fast:
        return "image", "auto: the store's files are reachable from Python"
    return "merge", (f"auto: the image path reads and writes files with pyarrow on local, file: and s3a:// stores "
                     f"only; {root} is none of those, so batches take the fenced MERGE path (slower)")
