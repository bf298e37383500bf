"""The ``state_history`` view's rows: a Python data source over :func:`.history.walk_history`, one task."""

from __future__ import annotations

import json
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ..delta.storefs import S3Settings, TableFiles, files_for
from .history import HISTORY_COLUMNS, history_tuple, walk_history

__all__ = ["StateHistorySource", "SOURCE_NAME", "source_options"]

SOURCE_NAME = "deltawheel_state_history"


def source_options(files: TableFiles, *, to_version: int | None) -> dict[str, str]:
    """The options naming ``files`` (the rows table) and the last version to read."""
    opts = {"path": files.root if files.s3 is None else f"s3a://{files.root}"}
    if files.s3 is not None:
        opts["s3"] = json.dumps(files.s3.__dict__)
    if to_version is not None:
        opts["to_version"] = str(to_version)
    return opts


def _structs(t: tuple[Any, ...]) -> tuple[Any, ...]:
    """A history row with its timers and pending productions as tuples in the schema's field order."""
    out = list(t)
    names = [n for n, _ in HISTORY_COLUMNS]
    for col, fields in (("timers", ("tag", "domain", "time_ms")),
                        ("pending", ("production_id", "stream", "key", "codec", "value", "timestamp_ms"))):
        i = names.index(col)
        if out[i] is not None:
            out[i] = [tuple(d[f] for f in fields) for d in out[i]]
    return tuple(out)


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.s3 = options.get("s3")
        self.to_version = int(options["to_version"]) if options.get("to_version") else None

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        s3 = None if self.s3 is None else S3Settings(**json.loads(self.s3))
        files = files_for(self.path, s3)
        if files is None:
            raise ValueError(f"state_history reads local folders, file: and s3a:// stores only, not {self.path}")
        for change in walk_history(files, to_version=self.to_version):
            yield _structs(history_tuple(change))


class StateHistorySource(DataSource):
    """Every change of every key of a rows table (:data:`~.history.HISTORY_COLUMNS`)."""

    @classmethod
    def name(cls) -> str:
        """The format name Spark knows it by."""
        return SOURCE_NAME

    def schema(self) -> str:
        """The history columns as Spark DDL."""
        return ", ".join(f"`{n}` {t}" for n, t in HISTORY_COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        """The reader of the table and version the options name."""
        return _Reader(dict(self.options))
