"""What a batch failed in a Spark task says: the cause, not py4j's call site."""

from __future__ import annotations

from deltawheel.executor.exceptions import BatchFailedError
from deltawheel.executor.tasks.job import task_failure

_JAVA = """An error occurred while calling o1234.getResult.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 failed 1 times, most recent failure: Lost task 1.0 in stage 7.0 (TID 12) (10.0.0.5 executor driver): java.io.FileNotFoundException: File file:/store/rows/part-0001.parquet does not exist
\tat org.apache.hadoop.fs.RawLocalFileSystem.deprecatedGetFileStatus(RawLocalFileSystem.java:915)
Caused by: java.io.FileNotFoundException: File file:/store/rows/part-0001.parquet does not exist
\tat org.apache.hadoop.fs.RawLocalFileSystem.getFileStatus(RawLocalFileSystem.java:700)
"""

_PYTHON = """An error occurred while calling o88.getResult.
: org.apache.spark.SparkException: Job aborted due to stage failure: ... org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "job.py", line 3, in run
ValueError: the input is not what the task expects
"""


def test_a_jvm_failure_names_its_root_cause_not_the_py4j_call() -> None:
    err = task_failure(RuntimeError(_JAVA), "counts", 7)
    assert isinstance(err, BatchFailedError)
    assert "getResult" not in str(err)
    assert str(err).startswith("counts batch 7 failed in a Spark task: java.io.FileNotFoundException: File ")


def test_a_python_failure_in_a_task_names_the_python_error() -> None:
    err = task_failure(RuntimeError(_PYTHON), "counts", None)
    assert str(err) == "counts batch ? failed in a Spark task: ValueError: the input is not what the task expects"


def test_a_failure_without_any_exception_named_keeps_its_first_line() -> None:
    err = task_failure(RuntimeError("the worker went away\nmore"), "counts", 2)
    assert str(err) == "counts batch 2 failed in a Spark task: the worker went away"


def test_an_input_file_whose_store_did_not_answer_is_a_retry_not_a_bad_file() -> None:
    """Found by a chaos run: S3Proxy killed under a batch's read of a stream table's file made the
    batch an ``InputFileError`` (exit 3, "write the file again") though the file was whole."""
    from deltawheel.executor.exceptions import InputFileError
    from deltawheel.statestore.exceptions import ObjectStoreUnreachableError

    reset = ("org.apache.spark.SparkException: Task failed: ... InputFileError: input file "
             "s3a://chaos/store/streams/changes/part-c6c2.snappy.parquet cannot be read (java.net.SocketException: "
             "Connection reset); the batch was not committed.\n")
    err = task_failure(RuntimeError(reset), "ledger", 3)
    assert isinstance(err, ObjectStoreUnreachableError), err
    assert str(err).startswith("ledger batch 3: input file s3a://chaos/store/streams/changes/part-c6c2.snappy.parquet "
                               "cannot be read (java.net.SocketException: Connection reset)")
    truncated = ("InputFileError: input file /in/part-3.parquet cannot be read (java.io.EOFException: reached the "
                 "end of the file early); the batch was not committed.\n")
    assert isinstance(task_failure(RuntimeError(truncated), "ledger", 3), InputFileError)


def test_a_jvm_that_went_away_ends_a_command_typed_not_with_a_traceback() -> None:
    """Found by the 10-minute chaos run: a driver whose JVM stopped answering (py4j's connection
    refused after Delta's "No active or default Spark session found") exited 1 with a traceback."""
    from deltawheel.statestore.exceptions import SparkGoneError, exit_code
    from py4j.protocol import Py4JNetworkError

    from deltawheel.cli import _typed

    try:
        try:
            raise Py4JNetworkError("Answer from Java side is empty")
        except Py4JNetworkError:
            raise ConnectionRefusedError(111, "Connection refused")  # noqa: B904 - as py4j chains it
    except ConnectionRefusedError as exc:
        gone = _typed(exc)
    assert isinstance(gone, SparkGoneError) and exit_code(gone) == 9, gone
    stopped = RuntimeError("[INTERNAL_ERROR] No active or default Spark session found SQLSTATE: XX000")
    assert isinstance(_typed(stopped), SparkGoneError)
    assert _typed(RuntimeError("something else")) is None
