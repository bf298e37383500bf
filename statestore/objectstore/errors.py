"""Object-store failures seen through Spark and Hadoop, turned into deltawheel's typed errors."""

from __future__ import annotations

import re
from typing import Any

from ..exceptions import (
    BucketMissingError,
    DeltaWheelError,
    ObjectStoreAuthError,
    ObjectStoreError,
    ObjectStoreUnreachableError,
)
from ..layout import StoreLayout
from .s3a import bucket_of

__all__ = ["translate", "probe_store", "pyarrow_error", "check_bucket", "store_failure", "raise_store_failure"]

_UNREACHABLE = ("java.net.ConnectException", "java.net.SocketException", "java.net.UnknownHostException", "java.net.NoRouteToHostException",
                "java.net.SocketTimeoutException", "org.apache.http.conn.HttpHostConnectException",
                "org.apache.http.conn.ConnectTimeoutException")
_MISSING = ("org.apache.hadoop.fs.s3a.UnknownStoreException",
            "software.amazon.awssdk.services.s3.model.NoSuchBucketException")
_DENIED = ("java.nio.file.AccessDeniedException",)
_FAILED = ("org.apache.hadoop.fs.s3a.AWSStatus500Exception", "org.apache.hadoop.fs.s3a.AWSServiceThrottledException")
_LOST = "java.io.FileNotFoundException"


def _chain(exc: BaseException) -> list[tuple[str, str]]:
    """(Java class name, message) of the Java exception behind ``exc`` and its causes."""
    out: list[tuple[str, str]] = []

    def java(e: object) -> Any:  # py4j's error, or pyspark's captured one (a query's: its cause's)
        return getattr(e, "java_exception", None) or getattr(e, "_origin", None)

    je = java(exc) or java(getattr(exc, "_cause", None))
    while je is not None and len(out) < 20:
        try:
            out.append((str(je.getClass().getName()), str(je.getMessage())))
            je = je.getCause()
        except Exception:
            break
    return out


def _said(exc: BaseException) -> str:
    """The messages of ``exc`` and of its causes (Python's, and those pyspark captured behind it)."""
    out: list[str] = []
    cause: object = exc
    while cause is not None and len(out) < 20:
        out.append(str(cause))
        cause = getattr(cause, "_cause", None) or getattr(cause, "__cause__", None)
    return " ".join(out)


def _typed(kind: str, uri: str, detail: str, *, spark: bool) -> DeltaWheelError:
    """The error of ``kind`` (``missing``, ``denied``, ``unreachable``, ``failed``) for ``uri``, naming the
    settings to fix: Spark's Hadoop settings (``spark``), else deltawheel's environment variables."""
    bucket = bucket_of(uri) or "?"
    if kind == "missing":
        return BucketMissingError(
            f"bucket {bucket!r} of {uri} does not exist on the object store; create it (for the local server: "
            f"'deltawheel objectstore create-bucket {bucket}') or fix {'the store URI' if spark else '--store'}")
    if kind == "denied":
        keys = (f"fs.s3a.access.key and fs.s3a.secret.key (or fs.s3a.bucket.{bucket}.*)" if spark
                else "$DELTAWHEEL_S3_ACCESS_KEY and $DELTAWHEEL_S3_SECRET_KEY")
        return ObjectStoreAuthError(
            f"the object store refused the credentials for {uri} ({detail}): set {keys} to the store's identity "
            "and credential ('deltawheel objectstore status' prints the local server's)")
    if kind == "failed":
        return ObjectStoreUnreachableError(f"the object store failed a request for {uri} with a server error "
                                           f"({detail}); run the command again once it serves")
    endpoint = f"fs.s3a.endpoint (or fs.s3a.bucket.{bucket}.endpoint)" if spark else "$DELTAWHEEL_S3_ENDPOINT"
    return ObjectStoreUnreachableError(f"no object store answers for {uri} ({detail}): start it ('deltawheel "
                                       f"objectstore start' for the local server) or fix {endpoint}")


def translate(exc: BaseException, uri: str) -> DeltaWheelError | None:
    """The typed error for ``exc`` raised while reaching ``uri`` (None: not an object-store failure)."""
    chain = _chain(exc)
    # pyspark keeps a query's Java causes as text ("java.net.ConnectException: ..."): their class names too
    said = _said(exc)
    classes = [c for c, _ in chain] + [c for c in (*_UNREACHABLE, *_FAILED) if c + ":" in said]
    text = " ".join(m for _, m in chain) or said
    if any(c in _MISSING for c in classes) or "NoSuchBucket" in text or "UnknownStoreException" in text:
        return _typed("missing", uri, "", spark=True)
    if any(c in _DENIED for c in classes) or "Status Code: 403" in text or "AccessDeniedException" in text:
        return _typed("denied", uri, "HTTP 403", spark=True)
    if any(c in _UNREACHABLE for c in classes) or "Unable to execute HTTP request" in text:
        return _typed("unreachable", uri, chain[-1][1] if chain else text[:200], spark=True)
    if any(c in _FAILED for c in classes) or any(f"Status Code: {n}" in text for n in (500, 502, 503)):
        return _typed("failed", uri, text[:200], spark=True)
    lost = [m for c, m in chain if c == _LOST] + re.findall(_LOST.replace(".", r"\.") + r": ([^\n]*)", said)
    if any("/_delta_log/" in m and uri in m for m in lost):
        # a log entry written a moment ago is not there: the store lost it (a full disk behind it);
        # the commit's log-store entry still holds it, and the next reader of the log completes it
        return _typed("failed", uri, next(m for m in lost if "/_delta_log/" in m)[:200], spark=True)
    return None


def probe_store(spark: Any, layout: StoreLayout) -> None:
    """Check that the object store of ``layout`` answers with its bucket (a no-op for local stores).

    Raises:
        ObjectStoreUnreachableError: nothing answers at the endpoint.
        BucketMissingError: the bucket does not exist.
        ObjectStoreAuthError: the store refused the credentials.
    """
    if layout.is_local:
        return
    from ..delta.jvm import jsession, jvm

    try:
        path = jvm(spark).org.apache.hadoop.fs.Path(layout.root)
        conf = jsession(spark).sessionState().newHadoopConf()
        path.getFileSystem(conf).exists(path)
    except Exception as exc:
        typed = translate(exc, layout.root)
        if typed is None:
            raise
        raise typed from exc


# pyarrow's S3 errors name the AWS error kind ("AWS Error ACCESS_DENIED during ListObjectsV2 ...")
_PA_KINDS = {"missing": ("NO_SUCH_BUCKET", "NoSuchBucket"),
             "denied": ("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "AccessDenied"),
             "unreachable": ("NETWORK_CONNECTION", "Couldn't connect", "curlCode", "UNKNOWN (HTTP status 0)"),
             "failed": ("INTERNAL_FAILURE", "SERVICE_UNAVAILABLE")}


def _pa_kind(text: str) -> str | None:
    return next((k for k, marks in _PA_KINDS.items() if any(m in text for m in marks)), None)


def pyarrow_error(exc: OSError, root: str) -> DeltaWheelError:
    """The typed error for an object store that failed a read of ``root`` (pyarrow's ``OSError``)."""
    text = str(exc)
    if (kind := _pa_kind(text)) is None:
        return ObjectStoreError(f"reading {root} failed: {text}; check that the object store answers and "
                                "$DELTAWHEEL_S3_ENDPOINT and its keys ('deltawheel objectstore status')")
    return _typed(kind, root, text[:200], spark=False)


def check_bucket(files: Any, root: str) -> None:
    """Raise :class:`BucketMissingError` when the bucket of the ``s3a://`` store ``root`` (``files``: its
    TableFiles) does not exist: S3 lists a missing bucket's prefix as empty, as a missing folder."""
    from pyarrow import fs as pafs

    try:
        missing = files.fs.get_file_info(files.root.split("/", 1)[0]).type == pafs.FileType.NotFound
    except OSError as exc:
        raise pyarrow_error(exc, root) from exc
    if missing:
        raise _typed("missing", root, "", spark=False)


def store_failure(exc: BaseException, uri: str) -> DeltaWheelError | None:
    """The typed error for ``exc`` if the object store of ``uri`` failed under it, through Spark's
    JVM or pyarrow, at any step of a command (None: another error)."""
    typed = translate(exc, uri)
    said = _said(exc)  # pyarrow's OSError, also inside a Spark task's error or one of ours
    if typed is None and (isinstance(exc, OSError) or "AWS Error" in said) and (kind := _pa_kind(said)):
        typed = _typed(kind, uri, said[:200], spark=False)
    return typed


def raise_store_failure(exc: BaseException, uri: str) -> None:
    """Raise :func:`store_failure`'s typed error when there is one, so that a caller turning a failed
    read into "no such table" does not say so of a store that did not answer."""
    if uri.startswith("s3a://") and (typed := store_failure(exc, uri)) is not None:
        raise typed from exc
