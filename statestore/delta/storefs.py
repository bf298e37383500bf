"""A store's files as Python reaches them (a local folder or ``s3a://``; any other scheme: None);
a file is complete before anything names it. docs/objectstore-fastpath.md."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import hmac
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from urllib.parse import quote, urlsplit

__all__ = ["S3Settings", "TableFiles", "files_for", "table_files", "files_resolver", "supports", "local_path",
           "background_uploads"]


@dataclass(frozen=True, kw_only=True)
class S3Settings:
    """How to reach an S3-compatible server, as Hadoop's s3a connector is configured."""

    endpoint: str | None = None  # host[:port] (None: AWS for ``region``)
    scheme: str = "https"
    access_key: str | None = None  # None: pyarrow's default credential chain
    secret_key: str | None = None
    session_token: str | None = None  # temporary credentials (fs.s3a.session.token)
    path_style: bool = False  # bucket in the path, not in the host name
    region: str | None = None
    proxy: str | None = None  # an HTTP proxy's URI (fs.s3a.proxy.*): every request goes through it

    @classmethod
    def from_hadoop(cls, get: Callable[[str], str | None], bucket: str) -> S3Settings:
        """The settings s3a uses for ``bucket`` (per-bucket keys first); ``get`` reads one Hadoop key.

        >>> conf = {"fs.s3a.endpoint": "http://127.0.0.1:9000", "fs.s3a.path.style.access": "true",
        ...         "fs.s3a.bucket.b.access.key": "k", "fs.s3a.secret.key": "s", "fs.s3a.session.token": "t"}
        >>> s = S3Settings.from_hadoop(conf.get, "b")
        >>> (s.endpoint, s.scheme, s.access_key, s.secret_key, s.session_token, s.path_style, s.proxy)
        ('127.0.0.1:9000', 'http', 'k', 's', 't', True, None)
        >>> S3Settings.from_hadoop({"fs.s3a.proxy.host": "p", "fs.s3a.proxy.username": "u@x"}.get, "b").proxy
        'http://u%40x@p:443'
        """
        def conf(key: str) -> str | None:
            value = get(f"fs.s3a.bucket.{bucket}.{key}") or get(f"fs.s3a.{key}")
            return None if value is None or value.strip() == "" else value.strip()

        ssl = (conf("connection.ssl.enabled") or "true").lower() != "false"
        endpoint = conf("endpoint")
        scheme = "https" if ssl else "http"
        if endpoint is not None and "://" in endpoint:
            parts = urlsplit(endpoint)
            scheme, endpoint = parts.scheme or scheme, parts.netloc or None
        proxy = None
        if (proxy_host := conf("proxy.host")) is not None:  # s3a's port default: the store's scheme's
            user = ":".join(quote(v, safe="") for v in (conf("proxy.username"), conf("proxy.password")) if v)
            proxy = (f"{'https' if (conf('proxy.secured') or '').lower() == 'true' else 'http'}://"
                     f"{user + '@' if user else ''}{proxy_host}:{conf('proxy.port') or (443 if ssl else 80)}")
        return cls(endpoint=endpoint, scheme=scheme, access_key=conf("access.key"), secret_key=conf("secret.key"),
                   session_token=conf("session.token"), path_style=(conf("path.style.access") or "false").lower() == "true",
                   region=conf("endpoint.region") or conf("region"), proxy=proxy)


def local_path(path: str) -> str | None:
    """The folder of a local table (a plain path or a ``file:`` URI); None for a remote one."""
    if path.startswith("file:"):
        return path.removeprefix("file:").removeprefix("//")
    head = path.split("/", 1)[0]
    return None if ":" in head else path


def _built_once(build: Callable[..., Any]) -> Callable[..., Any]:
    """``build`` cached per arguments, under a lock: threads that miss at once share one object."""
    cached, lock = functools.cache(build), threading.Lock()

    def once(*args: Any) -> Any:
        with lock:
            return cached(*args)
    return once


@_built_once
def _s3(settings: S3Settings) -> Any:
    from pyarrow import fs as pafs

    # the AWS SDK's flexible checksums are refused by S3-compatible servers such as S3Proxy
    for var in ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"):
        os.environ.setdefault(var, "when_required")
    return pafs.S3FileSystem(
        access_key=settings.access_key, secret_key=settings.secret_key, session_token=settings.session_token,
        endpoint_override=settings.endpoint,
        scheme=settings.scheme, region=settings.region or "us-east-1",
        force_virtual_addressing=not settings.path_style and settings.endpoint is not None,
        allow_delayed_open=True,  # a small file goes up in one PUT on close
        connect_timeout=10, request_timeout=60, proxy_options=settings.proxy)


@dataclass(frozen=True)
class TableFiles:
    """A folder of a store; ``root``: the local folder, or ``bucket/key`` on S3 (``s3`` set)."""

    root: str
    s3: S3Settings | None = None

    @property
    def is_local(self) -> bool:
        """True for a local folder."""
        return self.s3 is None

    @property
    def fs(self) -> Any:
        """The pyarrow file system (local or S3)."""
        if self.s3 is None:
            from pyarrow import fs as pafs

            return pafs.LocalFileSystem()
        return _s3(self.s3)

    def path(self, rel: str = "") -> str:
        """``rel`` below the root, as the file system names it."""
        if not rel:
            return self.root
        return os.path.join(self.root, rel) if self.s3 is None else f"{self.root.rstrip('/')}/{rel.lstrip('/')}"

    def sub(self, rel: str) -> TableFiles:
        """The folder ``rel`` below this one."""
        return TableFiles(self.path(rel), self.s3)

    def listdir(self, rel: str = "") -> list[str] | None:
        """The names in folder ``rel`` (None: it does not exist)."""
        if self.s3 is None:
            try:
                return os.listdir(self.path(rel))
            except FileNotFoundError:
                return None
        files = self.list_files(rel)
        return None if files is None else [name for name, _size, _mtime in files]

    def list_files(self, rel: str = "") -> list[tuple[str, int, int]] | None:
        """(name, size, mtime in ns) of the files (not folders) in folder ``rel``; None: no such folder."""
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.path(rel), allow_not_found=True, recursive=False)
        infos = self.fs.get_file_info(selector)
        if not infos and self.fs.get_file_info(self.path(rel)).type == pafs.FileType.NotFound:
            return None
        return [(i.base_name, int(i.size or 0), int(i.mtime_ns or 0)) for i in infos
                if i.type == pafs.FileType.File]

    def read_text(self, rel: str) -> str | None:
        """A text file's content (None: no such file)."""
        try:
            if self.s3 is None:
                with open(self.path(rel), encoding="utf-8") as fh:
                    return fh.read()
            with self.fs.open_input_stream(self.path(rel)) as fh:
                return bytes(fh.read()).decode("utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, rel: str, text: str) -> None:
        """Write a small text file whole: one PUT on S3, staged and renamed locally (folder made as needed)."""
        if self.s3 is not None:
            _put(self.s3, self.path(rel), text.encode("utf-8"))
            return
        path = self.path(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"  # a name of its own: writers of one file do not collide
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)

    def _source(self, rel: str) -> Any:
        if self.s3 is None:
            return self.path(rel)
        import pyarrow as pa

        with self.fs.open_input_stream(self.path(rel)) as fh:
            return pa.BufferReader(fh.read())

    def read_parquet(self, rel: str, columns: list[str] | None = None, *,
                     read_dictionary: list[str] | None = None) -> Any:
        """A Parquet file as a pyarrow table (``read_dictionary`` as pyarrow's ``read_table``)."""
        import pyarrow.parquet as pq

        if self.s3 is None:
            return pq.read_table(self.path(rel), columns=columns, read_dictionary=read_dictionary)
        return pq.ParquetFile(self._source(rel), read_dictionary=read_dictionary).read(columns=columns)

    def parquet_file(self, rel: str) -> Any:
        """A ``pyarrow.parquet.ParquetFile`` of ``rel`` (schema and data of one read)."""
        import pyarrow.parquet as pq

        return pq.ParquetFile(self._source(rel))

    def read_schema(self, rel: str) -> Any:
        """A Parquet file's Arrow schema (its footer only)."""
        import pyarrow.parquet as pq

        if self.s3 is None:
            return pq.read_schema(self.path(rel))
        with self.fs.open_input_file(self.path(rel)) as fh:
            return pq.read_schema(fh)

    def size(self, rel: str = "") -> int:
        """A file's size in bytes (``FileNotFoundError`` if missing)."""
        if self.s3 is None:
            return os.path.getsize(self.path(rel))
        from pyarrow import fs as pafs

        info = self.fs.get_file_info(self.path(rel))
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(self.path(rel))
        return int(info.size or 0)

    def delete(self, rel: str) -> bool:
        """Delete the file ``rel`` and a local Hadoop ``.crc`` beside it (False: there was none)."""
        path = self.path(rel)
        try:
            if self.s3 is None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc"))
                os.remove(path)
            else:
                self.fs.delete_file(path)
        except FileNotFoundError:
            return False
        return True

    def write_parquet(self, table: Any, rel: str, **options: Any) -> int:
        """Write ``table`` as Parquet to ``rel``; returns the size once the file is complete."""
        import pyarrow.parquet as pq

        if self.s3 is None:
            path = self.path(rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(table, path, **options)
            return os.path.getsize(path)
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        data = sink.getvalue()
        pending = _UPLOADS.get()
        if pending is None:
            _put(self.s3, self.path(rel), data)
        else:  # background_uploads: the block's end waits for it
            pending.append(_pool().submit(_put, self.s3, self.path(rel), data))
        return int(data.size)


# a file up to this size with the store's keys set goes up in one signed PUT of our own (_signs); pyarrow's S3 client
# sends ``Expect: 100-continue`` on every upload and waits for the answer before the body (two round trips,
# and it has no setting for it); larger files keep pyarrow's parallel multipart upload
SIGNED_PUT_MAX = 16 << 20
_CONNECTIONS = threading.local()  # a thread's kept-alive connections, by (scheme, host)


def _signs(s3: S3Settings, path: str, size: int) -> bool:
    """Whether :func:`signed_put` uploads ``path``: the keys set, and where the bucket answers known (an endpoint,
    or AWS in a set region; a dotted bucket name on AWS would not match its certificate as a host name), and
    no proxy (pyarrow takes it).

    >>> keys = {"access_key": "k", "secret_key": "s"}
    >>> [_signs(S3Settings(endpoint="h:9000", **keys), "b/x", 10), _signs(S3Settings(endpoint="h:9000"), "b/x", 10)]
    [True, False]
    >>> [_signs(S3Settings(**keys), "b/x", 10), _signs(S3Settings(region="eu-west-1", **keys), "b/x", 10),
    ...  _signs(S3Settings(region="eu-west-1", **keys), "b.c/x", 10)]
    [False, True, False]
    >>> [_signs(S3Settings(endpoint="h:9000", **keys), "b/x", SIGNED_PUT_MAX + 1),
    ...  _signs(S3Settings(endpoint="h:9000", proxy="http://p:80", **keys), "b/x", 10)]
    [False, False]
    """
    known = s3.endpoint is not None or (s3.region is not None and "." not in path.partition("/")[0])
    return bool(s3.access_key and s3.secret_key) and known and size <= SIGNED_PUT_MAX and s3.proxy is None


def _put(s3: S3Settings, path: str, data: Any) -> None:
    if _signs(s3, path, len(data)):
        signed_put(s3, path, memoryview(data))
        return
    with _s3(s3).open_output_stream(path) as out:  # closing waits for the upload
        out.write(data)


def signed_put(s3: S3Settings, path: str, body: bytes | memoryview, *, attempts: int = 4) -> None:
    """PUT ``body`` as ``path`` (``bucket/key``) in one request signed with AWS signature version 4, no
    ``Expect``; a dropped connection or a server's passing trouble (500, 502-504, 429) is tried again (the
    key is the writer's own), other answers raise ``OSError``."""
    import http.client
    import ssl

    bucket, _, key = path.partition("/")
    region = s3.region or "us-east-1"
    if s3.endpoint is None:
        host, uri = f"{bucket}.s3.{region}.amazonaws.com", f"/{key}"
    else:
        host, uri = (s3.endpoint, f"/{bucket}/{key}") if s3.path_style else (f"{bucket}.{s3.endpoint}", f"/{key}")
    uri = quote(uri, safe="/-_.~")
    digest = hashlib.sha256(body).hexdigest()
    # per process too: a forked child must not write into its parent's socket
    conns: dict[tuple[str, str], Any] = _CONNECTIONS.__dict__.setdefault(f"by_host_{os.getpid()}", {})
    for attempt in range(attempts):
        headers = _sigv4(s3, host, uri, region, digest, time.gmtime())
        headers["Content-Length"] = str(len(body))
        conn = conns.get((s3.scheme, host))
        if conn is None:
            conn = (http.client.HTTPSConnection(host, timeout=60, context=ssl.create_default_context(
                cafile=os.environ.get("AWS_CA_BUNDLE"))) if s3.scheme == "https"
                    else http.client.HTTPConnection(host, timeout=60))
            conns[(s3.scheme, host)] = conn
        try:
            conn.request("PUT", uri, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            conns.pop((s3.scheme, host), None)
            if attempt + 1 == attempts:
                raise OSError(f"PUT s3a://{path} to {host} failed: {exc}") from exc
            continue
        if resp.status < 300:
            return
        if resp.status not in (429, 500, 502, 503, 504) or attempt + 1 == attempts:
            hint = " (check fs.s3a.access.key and fs.s3a.secret.key)" if resp.status in (401, 403) else ""
            raise OSError(f"PUT s3a://{path} to {host} failed: HTTP {resp.status}{hint} {text[:300]}")
        time.sleep(0.1 * 2 ** attempt)


def _sigv4(s3: S3Settings, host: str, uri: str, region: str, digest: str, now: Any) -> dict[str, str]:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
    headers = {"host": host, "x-amz-content-sha256": digest, "x-amz-date": stamp}
    if s3.session_token:
        headers["x-amz-security-token"] = s3.session_token
    names = ";".join(sorted(headers))
    canonical = "\n".join(["PUT", uri, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", names, digest])
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{s3.secret_key}".encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={s3.access_key}/{scope}, SignedHeaders={names}, "
                                f"Signature={signature}")
    return headers


_UPLOADS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("deltawheel_uploads", default=None)
# the process's uploads at once (threads start as needed): every writer of the process shares them, and
# with 4, 16 writers at 50 ms per request queued for them (docs/scale.md, "The upload pool")
UPLOAD_THREADS = 16


@_built_once
def _pool() -> Any:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="deltawheel-upload")


@contextlib.contextmanager
def background_uploads() -> Iterator[None]:
    """Within the block, S3 PUTs run in the background; leaving it waits for all (and raises a failure)."""
    if _UPLOADS.get() is not None:
        yield
        return
    pending: list[Any] = []
    token = _UPLOADS.set(pending)
    failed: BaseException | None = None
    try:
        yield
    finally:
        _UPLOADS.reset(token)
        for fut in pending:
            try:
                fut.result()
            except BaseException as exc:
                failed = failed or exc
    if failed is not None:
        raise failed


def supports(uri: str) -> bool:
    """True when the fast path reaches ``uri``'s files from Python (local, ``file:``, ``s3a://``)."""
    return local_path(uri) is not None or uri.startswith("s3a://")


def files_for(uri: str, s3: S3Settings | None = None) -> TableFiles | None:
    """:class:`TableFiles` of ``uri`` (``s3``: the settings for ``s3a://``); None for another scheme."""
    local = local_path(uri)
    if local is not None:
        return TableFiles(local)
    if uri.startswith("s3a://"):
        parts = urlsplit(uri)
        return TableFiles(f"{parts.netloc}{parts.path}".rstrip("/"), s3 or S3Settings())
    return None


def table_files(spark: Any, uri: str) -> TableFiles | None:
    """:func:`files_for` with the S3 settings of ``spark``'s Hadoop configuration.

    A bucket's settings are read once per JVM (a dozen py4j round trips, each commit made a
    ``TableLog`` and read them again), as S3A itself keeps one file system per bucket and JVM
    with the settings it first saw; :func:`forget_s3_settings` after changing them."""
    if not uri.startswith("s3a://"):
        return files_for(uri)
    from .jvm import jsession, jvm, per_owner

    bucket = urlsplit(uri).netloc
    known: dict[str, S3Settings] = per_owner("s3-settings", jvm(spark), dict)
    s3 = known.get(bucket)
    if s3 is None:
        conf = jsession(spark).sessionState().newHadoopConf()
        s3 = known[bucket] = S3Settings.from_hadoop(lambda key: None if (v := conf.get(key)) is None else str(v),
                                                    bucket)
    return files_for(uri, s3)


def forget_s3_settings(spark: Any) -> None:
    """Read every bucket's S3 settings again at its next use (they were changed in ``spark``)."""
    from .jvm import jvm, per_owner

    per_owner("s3-settings", jvm(spark), dict).clear()


def files_resolver(spark: Any) -> Callable[[str], TableFiles | None]:
    """:func:`table_files` of ``spark``."""
    return functools.partial(table_files, spark)
