"""The write paths an executor can take: each a WritePath and its UserJob, registered in one table."""

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
    """Builds one write path and its user job for an executor of ``comp`` over ``owner``'s intervals."""

    def __call__(self, spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *,
                 partitions: int, event_ahead_ms: Mapping[str, int],
                 watermarks: bool) -> tuple[WritePath[Any], UserJob[Any]]:
        """(the write path, the user job feeding it)."""


def image_path(spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *, partitions: int,
               event_ahead_ms: Mapping[str, int], watermarks: bool) -> tuple[ImagePath, ImageTasks]:
    """The image path: tasks write new interval images, one Delta transaction per batch."""
    path = ImagePath(spark, layout, owner, name=comp.name, outputs=comp.outputs,
                     retention_ms=comp.dedup_retention_ms() if comp.exactly_once else None)
    return path, ImageTasks(comp, layout, path, partitions=partitions, event_ahead_ms=event_ahead_ms)


def merge_path(spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner, *, partitions: int,
               event_ahead_ms: Mapping[str, int], watermarks: bool) -> tuple[MergePath, MergeTasks]:
    """The fenced MERGE path: one Delta MERGE per batch (any store)."""
    path = MergePath(spark, layout, owner, name=comp.name, outputs=comp.outputs, track_oldest=watermarks,
                     dedup=comp.exactly_once)
    return path, MergeTasks(spark, comp, layout, path, partitions=partitions, event_ahead_ms=event_ahead_ms)


#: write path name -> how to build it for an executor
PATHS: Mapping[str, PathKind] = MappingProxyType({"image": image_path, "merge": merge_path})
WRITE_PATHS = ("auto", *PATHS)  # "auto": choose_write_path picks one


def choose_write_path(requested: str, root: str) -> tuple[str, str]:
    """(the write path, why) for ``write_path=requested`` on the store at ``root``; ConfigError: an
    unknown path, or ``"image"`` on a store the image path cannot reach.

    >>> choose_write_path("auto", "s3a://bucket/store")[0], choose_write_path("auto", "abfss://c@a/s")
    ('image', ('merge', 'auto: the image path reads and writes files with pyarrow on local, file: and s3a:// stores only; abfss://c@a/s is none of those, so batches take the fenced MERGE path (slower)'))
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
