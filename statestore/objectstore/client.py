"""A minimal S3 client (AWS signature version 2) for buckets: create, check and list."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import urllib.parse
from dataclasses import dataclass
from email.utils import formatdate

from ..exceptions import (
    BucketMissingError,
    ConfigError,
    ObjectStoreAuthError,
    ObjectStoreError,
    ObjectStoreUnreachableError,
)

__all__ = ["S3Endpoint", "S3Client"]


@dataclass(frozen=True)
class S3Endpoint:
    """Where an S3-compatible store answers (``http://host:port``) and with which credentials."""

    url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"object store endpoint {self.url!r} is not an http(s)://host:port URL; set it so "
                              "(e.g. http://127.0.0.1:9000; 'deltawheel objectstore status' prints the local server's)")

    @property
    def host(self) -> str:
        """Host name of the endpoint."""
        return str(urllib.parse.urlparse(self.url).hostname)

    @property
    def port(self) -> int:
        """Port of the endpoint (80/443 when the URL names none)."""
        parsed = urllib.parse.urlparse(self.url)
        return parsed.port or (443 if parsed.scheme == "https" else 80)

    @property
    def ssl(self) -> bool:
        """True for an ``https`` endpoint."""
        return self.url.startswith("https:")


class S3Client:
    """Bucket operations on ``endpoint`` (each call is one HTTP request; nothing is kept open)."""

    def __init__(self, endpoint: S3Endpoint, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str) -> tuple[int, bytes]:
        ep = self.endpoint
        date = formatdate(usegmt=True)
        to_sign = f"{method}\n\n\n{date}\n{path.split('?')[0]}"  # no sub-resources used: the path signs
        sig = base64.b64encode(hmac.new(ep.secret_key.encode(), to_sign.encode(), hashlib.sha1).digest()).decode()
        cls = http.client.HTTPSConnection if ep.ssl else http.client.HTTPConnection
        conn = cls(ep.host, ep.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, headers={"Date": date, "Authorization": f"AWS {ep.access_key}:{sig}",
                                                "Content-Length": "0"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError as exc:
            raise ObjectStoreUnreachableError(f"no S3 server answers at {ep.url} ({exc}); start one with "
                                              "'deltawheel objectstore start' or check the endpoint setting "
                                              "(fs.s3a.endpoint)") from exc
        finally:
            conn.close()

    def _check(self, status: int, body: bytes, what: str, bucket: str) -> None:
        text = body.decode("utf-8", "replace")
        if status in (401, 403):
            raise ObjectStoreAuthError(f"{self.endpoint.url} refused the credentials of access key "
                                       f"{self.endpoint.access_key!r} ({what}: HTTP {status}); use the "
                                       "identity and credential the server was started with ('deltawheel "
                                       "objectstore status' prints them)")
        if status == 404 and "NoSuchBucket" in text:
            raise BucketMissingError(f"bucket {bucket!r} does not exist on {self.endpoint.url}; create it "
                                     f"with 'deltawheel objectstore create-bucket {bucket}' (or your store's "
                                     "console)")
        if status >= 300:
            raise ObjectStoreError(f"{what} on {self.endpoint.url} failed: HTTP {status} {text[:300]}")

    def create_bucket(self, bucket: str) -> bool:
        """Create ``bucket``; returns False if it already existed (and is this identity's)."""
        status, body = self._request("PUT", f"/{urllib.parse.quote(bucket)}")
        if status == 409 and b"BucketAlreadyOwnedByYou" in body:
            return False
        self._check(status, body, f"create bucket {bucket!r}", bucket)
        return True

    def bucket_exists(self, bucket: str) -> bool:
        """True if ``bucket`` exists (wrong credentials raise, they do not read as 'missing')."""
        status, body = self._request("GET", f"/{urllib.parse.quote(bucket)}?max-keys=0")
        if status == 404:
            return False
        self._check(status, body, f"list bucket {bucket!r}", bucket)
        return True

    def list_buckets(self) -> list[str]:
        """Names of this identity's buckets."""
        import xml.etree.ElementTree as ET

        status, body = self._request("GET", "/")
        self._check(status, body, "list buckets", "")
        root = ET.fromstring(body)
        names = (child.text or "" for el in root.iter() if el.tag.endswith("}Bucket") or el.tag == "Bucket"
                 for child in el if child.tag.endswith("Name"))
        return sorted(names)
