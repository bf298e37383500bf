"""Intervals moving between job instances: exact input positions, skip rule, catch-up (docs/rescaling.md)."""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from deltawheel.statestore.delta.sourceoffsets import (
    Where,
    add_file_name,
    batch_adds,
    kafka_ranges,
)
from deltawheel.statestore.delta.storefs import TableFiles, local_path
from deltawheel.statestore.exceptions import ConfigError, InputGoneError

from ..computation import Computation
from ..sources.injector import Injector
from ..sources.kafka import KafkaInjector
from ..sources.parquet import ParquetInjector
from ..tasks.input import interval_of_key, key_expression
from .querylog import (
    POSITIONS_DIR,
    files_read,
    local_folder,
    positions_log,
    query_batch_files,
    source_batch_files,
    source_log_files,
)

__all__ = ["SharedInput", "kafka_input", "CATCH_UP_BATCH", "POSITIONS_DIR", "files_read", "source_log_files", "positions_log",
           "shared_input", "source_batch_files", "query_batch_files"]

_LOG = logging.getLogger(__name__)

CATCH_UP_BATCH = -1  # the batch id of a catch-up batch (reports, commit ids)
_POSITION = "_dw_position"


def _parquet_of(inj: Injector) -> ParquetInjector:
    if isinstance(inj, ParquetInjector):
        return inj
    made = inj.parquet_injector()  # type: ignore[attr-defined]
    if not isinstance(made, ParquetInjector):
        raise ConfigError(f"injector {inj.name}: parquet_injector() gave a {type(made).__name__}, not a "
                          "ParquetInjector")
    return made


def shared_input(comp: Computation, injectors: Mapping[str, Injector], *, table_of: Callable[[str], str],
                 checkpoint: str, files_of: Callable[[str], TableFiles | None] | None = None) -> SharedInput:
    """What the executor of ``comp`` needs when instances share its intervals (ConfigError: no positions)."""
    parquet, tables = _file_inputs(comp, injectors, comp.inputs, table_of=table_of)
    return SharedInput(comp=comp, parquet=parquet, tables=tables, checkpoint=checkpoint, files_of=files_of)


def _file_inputs(comp: Computation, injectors: Mapping[str, Injector], streams: Iterable[str], *,
                 table_of: Callable[[str], str]) -> tuple[dict[str, Injector], dict[str, str]]:
    """(Parquet injector by stream, stream table by stream); ConfigError if one gives no positions."""
    parquet: dict[str, Injector] = {}
    tables: dict[str, str] = {}
    for stream in streams:
        if stream not in injectors:
            tables[stream] = table_of(stream)
            continue
        inj = injectors[stream]  # a Parquet injector, or one reading through one (``parquet_injector()``)
        if not (isinstance(inj, ParquetInjector) or callable(getattr(inj, "parquet_injector", None))):
            raise ConfigError(
                f"{comp.name}: instances can share a computation's intervals only when its inputs give file "
                f"positions: Parquet (or generator) injectors and stream tables; {stream!r} is a "
                f"{type(injectors[stream]).__name__}. Run it as one instance (no instance name), or feed it "
                "from a Parquet injector")
        parquet[stream] = inj
    if len(parquet) > 1:
        raise ConfigError(f"{comp.name}: instances can share a computation's intervals when it reads at most one "
                          f"Parquet injector (it reads {sorted(parquet)}); run it as one instance (no instance "
                          "name), or merge the injectors' folders into one")
    return parquet, tables


def kafka_input(comp: Computation, injectors: Mapping[str, Injector], *, checkpoint: str,
                table_of: Callable[[str], str] | None = None) -> SharedInput | None:
    """The positions of a Kafka-fed computation; None when it reads no Kafka injector or lacks positions."""
    kafka = {s: inj for s in comp.inputs if isinstance(inj := injectors.get(s), KafkaInjector)}
    if not kafka:
        return None
    rest = [s for s in comp.inputs if s not in kafka]
    if rest and table_of is None:
        return None
    try:  # (no other input: no table looked up)
        parquet, tables = _file_inputs(comp, injectors, rest, table_of=table_of or str)
    except ConfigError:
        return None
    return SharedInput(comp=comp, parquet=parquet, tables=tables, checkpoint=checkpoint, kafka=kafka)


@dataclass(kw_only=True)
class SharedInput:
    """One computation's input when instances share its intervals; ``done``: per interval, its positions."""

    comp: Computation
    parquet: dict[str, Injector]
    tables: dict[str, str]
    checkpoint: str
    done: dict[int, frozenset[str]] = field(default_factory=dict)
    recorded: frozenset[str] = frozenset()  # the positions in any interval's set (held or not)
    kafka: dict[str, KafkaInjector] = field(default_factory=dict)  # a computation's Kafka injectors (replay only)
    # how a remote checkpoint's or table's files are reached (``storefs.files_resolver``; None: local only)
    files_of: Callable[[str], TableFiles | None] | None = None
    unknown: set[int] = field(default_factory=set)  # batches whose positions could not be read (record())
    num_intervals: int = field(init=False)
    file_source: int = field(init=False)  # the Parquet injector's source index in the query (``sources/<i>``)

    def __post_init__(self) -> None:
        self.num_intervals = type(self.comp).num_intervals
        self.file_source = next((i for i, s in enumerate(self.comp.inputs) if s in self.parquet), 0)

    def _where(self, uri: str) -> Where:
        """A checkpoint or table as the readers take it: a local path, or a remote one's files."""
        if local_path(uri) is not None or self.files_of is None:
            return uri
        return self.files_of(uri) or uri

    def position(self) -> Any:
        """A record's position as a column of the query's frame (``input_file_name()``)."""
        from pyspark.sql import functions as F

        pos = None
        for stream in self.comp.inputs:
            if stream in self.parquet:  # a Parquet injector's commit_id: file={name}#row={n}
                e = F.regexp_extract(F.col("commit_id"), r"^file=(.*)#row=[0-9]+$", 1)
            else:
                e = F.concat(F.lit(f"{stream}/"), F.regexp_extract(F.input_file_name(), r"([^/]*)$", 1))
            cond = F.col("stream") == F.lit(stream)
            pos = F.when(cond, e) if pos is None else pos.when(cond, e)
        assert pos is not None
        return pos

    def apply(self, df: Any, batch_id: int, intervals: Sequence[int],
              positions: Sequence[str] | None = None) -> tuple[Any, "SkipCount", tuple[str, ...]]:
        """(``df`` after the skip rule, how many were dropped, the batch's positions)."""
        df = df.withColumn(_POSITION, self.position())
        if positions is None:
            positions = self.batch_positions(df, batch_id)
            self._log_batch(batch_id, positions)
        kept, skipped = self.skip(df, positions, intervals)
        return kept.drop(_POSITION), skipped, tuple(positions)

    def record(self, df: Any, batch_id: int) -> tuple[str, ...]:
        """Micro-batch ``batch_id``'s positions for the commit's record (unknown ones: :attr:`unknown`)."""
        self.unknown.discard(batch_id)
        if self.kafka and not self.parquet and not self.tables:
            return ()
        try:
            if self.tables:
                logged = self.table_positions(batch_id)
                return tuple(logged if logged is not None else self._distinct(df))
            files = self._query_files(batch_id)
            if files is not None:
                return tuple(files)
            why = f"the offsets or file source log of micro-batch {batch_id} are not in {self.checkpoint}"
        except OSError as exc:
            why = f"reading the query checkpoint {self.checkpoint} failed ({type(exc).__name__}: {exc})"
        self._unknown(batch_id, why)
        return ()

    def _unknown(self, batch_id: int, why: str) -> None:
        self.unknown.add(batch_id)
        _LOG.warning("%s: the input positions of micro-batch %d are not recorded (a replay cannot start before "
                     "its commit): %s", self.comp.name, batch_id, why)

    def _query_files(self, batch_id: int) -> list[str] | None:
        """The files micro-batch ``batch_id`` read through the file source; None: not known."""
        where = self._where(self.checkpoint)
        if isinstance(where, str) and local_path(where) is None:
            return None
        return query_batch_files(where, batch_id, source=self.file_source)

    def kafka_ranges(self, batch_id: int) -> dict[str, dict[str, list[int]]] | None:
        """``{topic: {partition: [start, end]}}`` micro-batch ``batch_id`` read; None: not known."""
        if not self.kafka or batch_id < 0:
            return None
        out: dict[str, dict[str, list[int]]] = {}
        for inj in self.kafka.values():
            try:
                got = kafka_ranges(self._where(self.checkpoint), batch_id, inj.topic,
                                   new_partition_start=0 if inj.fails_on_data_loss else None)
            except OSError as exc:
                self._unknown(batch_id, f"reading the query checkpoint {self.checkpoint} failed "
                                        f"({type(exc).__name__}: {exc})")
                return None
            if got is None:  # e.g. a partition added during the run to a source that may skip its head
                self._unknown(batch_id, f"the offset log of {self.checkpoint} does not give the offset ranges of "
                                        f"topic {inj.topic} (a partition added during the run has no start there, "
                                        "and with failOnDataLoss=false Spark may have started it past offset 0)")
                return None
            out.update(got)
        return out

    def batch_positions(self, df: Any, batch_id: int) -> list[str]:
        """Micro-batch ``batch_id``'s positions: from the checkpoint's logs when known, else a Spark job."""
        if not self.tables:
            files = self._query_files(batch_id)
            if files is None:
                raise ConfigError(f"micro-batch {batch_id} is not in the file source log of {self.checkpoint}: this "
                                  "executor's batches must come from the query whose checkpoint that is")
            return files
        logged = self.table_positions(batch_id)
        return logged if logged is not None else self._distinct(df)

    def _distinct(self, df: Any) -> list[str]:
        if _POSITION not in df.columns:
            df = df.withColumn(_POSITION, self.position())
        return sorted(r[0] for r in df.select(_POSITION).distinct().collect() if r[0])

    def table_positions(self, batch_id: int) -> list[str] | None:
        """Micro-batch ``batch_id``'s positions from the logs if every input is a stream table, else None."""
        if self.parquet or batch_id < 0:
            return None
        out: set[str] = set()
        for stream, path in self.tables.items():
            adds = batch_adds(self._where(self.checkpoint), batch_id, self._where(path))
            if adds is None:
                return None
            out.update(f"{stream}/{add_file_name(a)}" for a in adds)
        return sorted(out)

    def _log_batch(self, batch_id: int, positions: Sequence[str]) -> None:
        if batch_id < 0 or not self.tables:
            return  # the file source log is enough
        text = json.dumps({"format_version": 1, "positions": sorted(positions)})
        remote = self._where(self.checkpoint)
        if isinstance(remote, TableFiles) and not remote.is_local:  # one PUT: the object is replaced whole
            with remote.fs.open_output_stream(remote.path(f"{POSITIONS_DIR}/{batch_id}")) as fh:
                fh.write(text.encode("utf-8"))
            return
        logdir = os.path.join(local_folder(self.checkpoint), POSITIONS_DIR)
        os.makedirs(logdir, exist_ok=True)
        staged = os.path.join(logdir, f".{batch_id}.tmp")
        with open(staged, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(staged, os.path.join(logdir, str(batch_id)))

    def skip(self, df: Any, positions: Iterable[str], intervals: Sequence[int]) -> tuple[Any, "SkipCount"]:
        """(``df`` without the records already in their interval's set, how many were dropped: counted by
        the job that runs the frame, not by a Spark job before it)."""
        from pyspark.sql import functions as F

        positions = set(positions)
        interval = interval_of_key(self.num_intervals, key_expression(self.comp))
        cond = None
        for iv in intervals:
            seen = sorted(self.done.get(iv, frozenset()) & positions)
            if seen:
                c = (interval == F.lit(iv)) & F.col(_POSITION).isin(seen)
                cond = c if cond is None else cond | c
        if cond is None:
            return df, SkipCount.none()
        count = SkipCount(df, F.coalesce(cond, F.lit(False)))
        return count.kept, count

    def skip_frame(self, df: Any, positions: Iterable[str], intervals: Sequence[int]) -> tuple[Any, "SkipCount"]:
        """:meth:`skip` on a frame of the query's schema (replay); nothing logged."""
        kept, skipped = self.skip(df.withColumn(_POSITION, self.position()), positions, intervals)
        return kept.drop(_POSITION), skipped

    def committed(self, positions: Iterable[str], intervals: Iterable[int]) -> None:
        """A batch of ``positions`` committed for ``intervals``."""
        positions = frozenset(positions)
        for iv in intervals:
            self.done[iv] = self.done.get(iv, frozenset()) | positions
        self.recorded |= positions

    def consumed(self) -> set[str]:
        """The positions this instance's query consumed (its committed batches)."""
        chk = self._where(self.checkpoint)
        out: set[str] = set().union(*positions_log(chk).values())
        if not self.tables:
            out |= set().union(*source_log_files(chk, source=self.file_source).values())
        return out

    def missing(self, intervals: Iterable[int]) -> list[str]:
        """The positions this instance consumed that some of ``intervals`` has not processed."""
        consumed = self.consumed()
        out = set().union(*(consumed - self.done.get(iv, frozenset()) for iv in intervals))
        return sorted(p for p in out if p in self.recorded or not self.gone(p))

    def folder_of(self, position: str) -> tuple[str | None, str]:
        """(the folder or stream table holding ``position``, its name there); None: none."""
        if "/" in position:
            stream, name = position.split("/", 1)
            return self.tables.get(stream), name
        return next((_parquet_of(inj).folder for inj in self.parquet.values()), None), position

    def gone(self, position: str) -> bool:
        """Whether the file at ``position`` is gone from its source (a remote one counts as present)."""
        folder, name = self.folder_of(position)
        if folder is None or ("://" in folder and not folder.startswith("file:")):
            return False
        return not os.path.exists(os.path.join(local_folder(folder), name))

    def files_df(self, spark: Any, positions: Sequence[str]) -> Any:
        """The records at ``positions`` as the query's frame gives them; InputGoneError if a file is gone."""
        from deltawheel.statestore.writepath.streams import stream_schema_ddl
        from pyspark.sql import functions as F

        frames = []
        bare = sorted(p for p in positions if "/" not in p)
        lost = [p for p in bare if self.gone(p)]
        if lost:
            raise InputGoneError(
                f"{self.comp.name}: a moved interval's new owner must read {len(lost)} input files that are gone "
                f"from the injector's folder (e.g. {lost[0]}): another interval ran them, the interval taken did "
                "not, and they were deleted meanwhile, so the move cannot be exact. Delete input files only once every "
                "instance has read them, or run the computation as one instance (docs/rescaling.md)")
        if bare:
            ((stream, inj),) = self.parquet.items()
            frames.append(_parquet_of(inj).files_df(spark, bare).withColumn("stream", F.lit(stream)))
        for stream, path in sorted(self.tables.items()):
            names = sorted(p.split("/", 1)[1] for p in positions if p.startswith(f"{stream}/"))
            if not names:
                continue
            paths = [f"{path.rstrip('/')}/{n}" for n in names]
            gone = [p for p in paths if "://" not in p and not os.path.exists(p)]
            if gone:
                raise InputGoneError(
                    f"{self.comp.name}: a moved interval's new owner must read {len(gone)} data files of stream "
                    f"{stream} that are gone (e.g. {gone[0]}; VACUUM removed them after a compaction), so the move "
                    "cannot be exact. Run the computation as one instance, or move the interval back to an "
                    "instance whose query is behind those files (docs/rescaling.md)")
            frames.append(spark.read.schema(stream_schema_ddl()).parquet(*paths).withColumn("stream", F.lit(stream)))
        return functools.reduce(lambda a, b: a.unionByName(b), frames)


class SkipCount:
    """How many records the skip rule dropped from a frame: observed (``DataFrame.observe``) by the first
    job that runs the kept frame, so a taken interval's first batch starts no Spark job of its own for
    it; a job of its own counts them when none ran the frame.

    ``int(count)`` gives the number (after the batch's job: it waits for that job's metrics a moment)."""

    WAIT_S = 2.0  # for the observed metrics once the batch's job is over (Spark hands them over after it)

    def __init__(self, df: Any | None, cond: Any) -> None:
        self._df: Any = df
        self._cond, self._n = cond, None if df is not None else 0
        self.kept = df
        self._obs: Any = None
        if df is not None:
            from pyspark.sql import Observation
            from pyspark.sql import functions as F

            self._obs = Observation()
            self.kept = df.observe(self._obs, F.count_if(cond).alias("skipped")).where(~cond)

    @classmethod
    def none(cls) -> "SkipCount":
        """Nothing dropped."""
        return cls(None, None)

    def __int__(self) -> int:
        if self._n is None:
            self._n = self._observed()
            if self._n is None:  # no job ran the kept frame (or its metrics did not come): count them now
                self._n = int(self._df.where(self._cond).count())
        return self._n

    def _observed(self) -> int | None:
        import time

        from deltawheel.statestore.delta.jvm import jobservation

        future = jobservation(self._obs).future()
        until = time.monotonic() + self.WAIT_S
        while not future.isCompleted():
            if time.monotonic() >= until:
                return None
            time.sleep(0.01)
        try:
            n = self._obs.get.get("skipped")
        except Exception:  # the observed job failed: its metrics are the failure
            return None
        return int(n or 0)
