"""S3-compatible object storage through boto3: the bucket side of ``store/remote.py``.

Why boto3 and not obstore: measured against the local Swift of ``.ci/s3-server``
(2 shared cores, 50 puts and gets of 4 KiB, 10 of 4 MiB), neither is faster where it
matters, the server is the bottleneck: a 4 KiB put 36 ms (boto3) vs 38 ms (obstore), a get
12 vs 9 ms; 4 MiB put 100 vs 64 ms, get 38 vs 49 ms. boto3 reads the standard AWS
configuration whole (``AWS_*`` variables, ``~/.aws/config`` and ``credentials``, profiles,
``AWS_ENDPOINT_URL``), which obstore's ``from_env`` does only for variables; and its
client is thread-safe once made, so the trio daemon can call it from ``trio.to_thread``
workers. It costs 0.34 s to make a client (obstore 0.08 s): once per process.

Retries are ours, not boto3's (its client makes one attempt): :class:`RetryPolicy` bounds
them by attempts *and* total time, and covers what boto3's retry modes do not, a download
whose body breaks off midway (a reset or a stall after the headers). Transient failures
(HTTP 500/502/503/504, ``SlowDown`` and the other throttling codes, a connection refused,
reset or timed out, a body cut short) are retried with exponential backoff and full
jitter; anything else (403 wrong credentials, 404, 400) fails at the first answer.

Every call blocks. Errors become :class:`RemoteError` naming the operation, the object and
the server's words (and, past the bound, the attempts and the time they took).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from sprite_env.errors import StoreError, UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Reads and writes of a file go in pieces of this size (bounded memory per transfer).
COPY_BYTES = 1 << 20

#: Error codes worth another attempt: the server is overloaded or failed inside (S3's
#: documented retryable codes; Swift's s3api answers ``SlowDown`` and ``InternalError``).
#: ``BadDigest`` too: the body was damaged on the way, and what we send never changes.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "BadDigest",
    }
)
_TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
#: Codes that mean the credentials were refused: said so plainly, never retried.
_DENIED_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
)


class RemoteError(StoreError):
    """The object storage refused a request, or failed it past the :class:`RetryPolicy`."""


class RemoteNotFound(RemoteError):
    """The bucket has no object of that name."""


class BadStoreUrl(UserError):
    """A ``--store`` value that is no ``s3://BUCKET[/PREFIX]``."""


class BadRemoteSetting(UserError):
    """An environment variable of :meth:`RetryPolicy.from_env` that is no number."""


def env_number(env: Mapping[str, str], name: str, default: float, least: float) -> float:
    """The number in variable ``name`` (``default`` when unset or empty).

    Raises:
        BadRemoteSetting: not a number, or below ``least``.
    """
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRemoteSetting(f"{name}={raw!r} is not a number") from None
    if not value >= least:  # also refuses NaN
        raise BadRemoteSetting(f"{name}={raw!r}: must be at least {least:g}")
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard a request tries before it fails.

    A transient failure is tried again after a random wait in ``[0, min(cap, base * 2**n))``
    (exponential backoff with "full jitter", which spreads competing clients out the most:
    AWS Architecture Blog, "Exponential Backoff And Jitter", 2015), until ``attempts``
    attempts were made or ``seconds`` have passed since the first began (no attempt starts
    after that; one attempt is bounded by the timeouts). The defaults ride out a server
    restart (``.ci/s3-server`` takes 4-6 s to start) with margin: 8 attempts wait up to
    1+2+4+8+16+20+20 s, and the minute caps that, so a person at a command line hears of a
    server that is down within about a minute, and a background upload tries its whole
    push again later anyway.

    Attributes:
        attempts: tries of one request, the first included (``AWS_MAX_ATTEMPTS``).
        seconds: the time after which no new attempt starts (``SPRITE_ENV_S3_RETRY_SECONDS``).
        base: the first backoff's upper bound, in seconds.
        cap: no backoff's upper bound exceeds this.
        connect_timeout: seconds to open a connection (``SPRITE_ENV_S3_CONNECT_TIMEOUT``);
            5 s: a refused connection fails at once, so this only waits out a lost packet.
        read_timeout: seconds without a byte moving before an attempt fails
            (``SPRITE_ENV_S3_READ_TIMEOUT``); 30 s: Swift answers a 32 MiB pack's PUT,
            fsync included, in ~0.1-1 s here, so a stall of 30 s is a stuck server.
    """

    attempts: int = 8
    seconds: float = 60.0
    base: float = 1.0
    cap: float = 20.0
    connect_timeout: float = 5.0
    read_timeout: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """The policy the environment asks for (the defaults where it is silent).

        Raises:
            BadRemoteSetting: a variable that is not a number, or out of range.
        """
        env = os.environ if env is None else env
        d = cls()
        return cls(
            attempts=int(env_number(env, "AWS_MAX_ATTEMPTS", d.attempts, 1)),
            seconds=env_number(env, "SPRITE_ENV_S3_RETRY_SECONDS", d.seconds, 0),
            base=d.base,
            cap=d.cap,
            connect_timeout=env_number(
                env, "SPRITE_ENV_S3_CONNECT_TIMEOUT", d.connect_timeout, 0.1
            ),
            read_timeout=env_number(env, "SPRITE_ENV_S3_READ_TIMEOUT", d.read_timeout, 0.1),
        )

    def backoff(self, retry: int) -> float:
        """The wait before retry number ``retry`` (0 for the first), with full jitter."""
        return random.uniform(0, min(self.cap, self.base * 2.0**retry))


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object: its size, and when the server stored it (seconds since the
    epoch, by the server's clock)."""

    size: int
    modified: float


@dataclass(slots=True)
class Listing:
    """The objects under a name, and the server's time when it answered (its ``Date``
    header): ages computed from the two use one clock, whatever the local one says."""

    objects: dict[str, ObjectInfo] = field(default_factory=dict)
    now: float = 0.0

    def age(self, name: str) -> float:
        """Seconds since ``name`` was stored, by the server's clock."""
        return self.now - self.objects[name].modified


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """``s3://BUCKET/PREFIX``: where a remote store lives (PREFIX may be empty)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> StoreUrl:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise BadStoreUrl(f"not an object storage URL: {url!r} (expected s3://BUCKET/PREFIX)")
        prefix = parts.path.strip("/")
        return cls(parts.netloc, prefix + "/" if prefix else "")


def _error_code(e: Exception) -> tuple[str | None, int | None]:
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return None, None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response.get("Error", {}).get("Code"), status


def _describe(e: Exception) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        said = f"{err.get('Code', '?')} (HTTP {status}): {err.get('Message', '')}".rstrip(": ")
        if err.get("Code") in _DENIED_CODES:
            said += (
                " (the credentials were refused: check AWS_ACCESS_KEY_ID, "
                "AWS_SECRET_ACCESS_KEY or the AWS profile)"
            )
        return said
    return f"{type(e).__name__}: {e}"


def transient(e: Exception) -> bool:
    """Whether another attempt may succeed where this one failed."""
    from botocore import exceptions as bx  # type: ignore[import-untyped]

    code, status = _error_code(e)
    if code is not None or status is not None:
        return code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS
    # Refused, reset or timed-out connections, and bodies cut short (HTTPClientError
    # covers ResponseStreamingError and ReadTimeoutError; ConnectionError the refusals).
    return isinstance(e, (bx.HTTPClientError, bx.ConnectionError, bx.IncompleteReadError))


class _LocalFailure(Exception):
    """Wraps an error of a local file inside a request, so it is not taken for the
    server's (and not retried): a full disk is no reason to download again."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class S3Storage:
    """A prefix of one bucket, through a boto3 client. Thread-safe.

    Args:
        url: the bucket and prefix.
        client: a boto3 S3 client (default: one made from the standard AWS configuration,
            see :func:`make_client`, with the policy's timeouts).
        policy: how each request retries (default: :meth:`RetryPolicy.from_env`).

    Error handling:
        Every method retries transient failures within ``policy``, then raises
        :class:`RemoteError` naming the operation and the object; a refusal (wrong
        credentials, a missing bucket) raises at the first answer. Errors of local files
        are raised as they are (``OSError``).
    """

    def __init__(
        self, url: StoreUrl, client: Any = None, policy: RetryPolicy | None = None
    ) -> None:
        self.url = url
        self.policy = policy if policy is not None else RetryPolicy.from_env()
        self.client = client if client is not None else make_client(self.policy)

    def __repr__(self) -> str:
        return f"s3://{self.url.bucket}/{self.url.prefix}"

    def _key(self, name: str) -> str:
        return self.url.prefix + name

    def _fail(self, what: str, name: str, e: Exception) -> RemoteError:
        return RemoteError(f"{self!r}: {what} {name} failed: {_describe(e)}")

    def _call(self, what: str, name: str, attempt: Callable[[], _T]) -> _T:
        """Runs ``attempt`` until it succeeds, fails for good, or the policy's bound."""
        p = self.policy
        start = time.monotonic()
        deadline = start + p.seconds
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except _LocalFailure as e:
                raise e.error from None
            except Exception as e:
                code, _ = _error_code(e)
                if code in ("NoSuchKey", "404") and what == "download of":
                    raise RemoteNotFound(f"{self!r}: no object {name}") from None
                if not transient(e):
                    raise self._fail(what, name, e) from None
                now = time.monotonic()
                if tries >= p.attempts or now >= deadline:
                    raise RemoteError(
                        f"{self!r}: {what} {name} failed: {_describe(e)} (after {tries} "
                        f"attempt{'s' if tries > 1 else ''} in {now - start:.1f} s; bound: "
                        f"{p.attempts} attempts, {p.seconds:g} s)"
                    ) from None
                wait = min(p.backoff(tries - 1), deadline - now)
                log.info(
                    "%r: %s %s: %s; attempt %d in %.2f s",
                    self,
                    what,
                    name,
                    _describe(e),
                    tries + 1,
                    wait,
                )
                time.sleep(wait)

    def create_bucket(self) -> None:
        """Creates the bucket if it is missing."""

        def attempt() -> None:
            try:
                self.client.create_bucket(Bucket=self.url.bucket)
            except Exception as e:
                code, _ = _error_code(e)
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._call("create bucket", self.url.bucket, attempt)

    def put_file(self, name: str, path: str) -> None:
        """Uploads a file as one object, with its MD5 (so the server refuses a body that
        arrived damaged: a 400, not a bad object). Packs are ~32 MiB, far below the 5 GiB
        of one PUT. The file must not change meanwhile (packs and catalog copies never do):
        a retry sends it again from its start."""
        md5 = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(COPY_BYTES), b""):
                md5.update(block)
            size = os.fstat(f.fileno()).st_size
            digest = base64.b64encode(md5.digest()).decode()

            def attempt() -> None:
                f.seek(0)
                self.client.put_object(
                    Bucket=self.url.bucket,
                    Key=self._key(name),
                    Body=f,
                    ContentLength=size,
                    ContentMD5=digest,
                )

            self._call("upload of", name, attempt)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Uploads a small object (a lease) from memory, with its MD5."""
        digest = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        self._call(
            "upload of",
            name,
            lambda: self.client.put_object(
                Bucket=self.url.bucket, Key=self._key(name), Body=data, ContentMD5=digest
            ),
        )

    def get_bytes(self, name: str) -> bytes:
        """A small object's bytes (a lease).

        Raises:
            RemoteNotFound: there is no such object.
        """

        def attempt() -> bytes:
            body = self.client.get_object(Bucket=self.url.bucket, Key=self._key(name))["Body"]
            data: bytes = body.read()
            return data

        return self._call("download of", name, attempt)

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of an object from ``offset`` (fewer at its end), in one ranged
        GET (``Range: bytes=...``); a body cut short is tried again whole.

        Raises:
            RemoteNotFound: there is no such object.
            RemoteError: the request failed (a range past the object's end is refused:
                ``InvalidRange``).
        """
        last = offset + length - 1

        def attempt() -> bytes:
            r = self.client.get_object(
                Bucket=self.url.bucket, Key=self._key(name), Range=f"bytes={offset}-{last}"
            )
            data: bytes = r["Body"].read()
            if r.get("ContentRange") is None and len(data) > length:
                data = data[offset : offset + length]  # a server that ignored the range
            return data

        return self._call("download of", f"{name} (bytes {offset}-{last})", attempt)

    def get_file(self, name: str, path: str) -> None:
        """Downloads an object into a new file ``path`` (not fsync'd: the caller decides).
        A download cut short is tried again from the start, into a new file.

        Raises:
            RemoteNotFound: there is no such object.
            FileExistsError: ``path`` exists (it is never replaced).
        """
        made = False

        def attempt() -> None:
            nonlocal made
            body = self.client.get_object(Bucket=self.url.bucket, Key=self._key(name))["Body"]
            try:
                if made:  # the partial file of an attempt that broke off
                    os.unlink(path)
                # Created 0600: what it holds is as private as the store it goes into.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except OSError as e:
                body.close()
                raise _LocalFailure(e) from None
            made = True
            with open(fd, "wb") as f:
                for block in iter(lambda: body.read(COPY_BYTES), b""):
                    try:
                        f.write(block)
                    except OSError as e:
                        raise _LocalFailure(e) from None

        try:
            self._call("download of", name, attempt)
        except BaseException:
            if made:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise

    def delete(self, name: str) -> None:
        """Removes an object; one that is already gone is no error (a retried delete may
        find its first attempt done)."""

        def attempt() -> None:
            try:
                self.client.delete_object(Bucket=self.url.bucket, Key=self._key(name))
            except Exception as e:
                if _error_code(e)[0] not in ("NoSuchKey", "404"):
                    raise

        self._call("delete of", name, attempt)

    def list(self, under: str) -> dict[str, int]:
        """The objects whose names start with ``under`` (names relative to the prefix),
        with their sizes."""
        return {n: o.size for n, o in self.listing(under).objects.items()}

    def listing(self, under: str) -> Listing:
        """The objects whose names start with ``under``, with their sizes and times, and
        the server's time (a listing broken off midway is made again from its start)."""
        return self._call("listing of", under or "/", lambda: self._listing(under))

    def _listing(self, under: str) -> Listing:
        cut = len(self.url.prefix)
        out = Listing()
        kwargs: dict[str, Any] = {"Bucket": self.url.bucket, "Prefix": self._key(under)}
        while True:
            page = self.client.list_objects_v2(**kwargs)
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            # Without a Date header (none seen yet), the local clock stands in.
            out.now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
            for o in page.get("Contents", []):
                out.objects[o["Key"][cut:]] = ObjectInfo(
                    int(o["Size"]), o["LastModified"].timestamp()
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token


def make_client(policy: RetryPolicy | None = None) -> Any:
    """A boto3 S3 client from the standard AWS configuration (variables, config files),
    with ``policy``'s timeouts and no retries of its own (:class:`S3Storage` retries).

    Path-style addressing when an endpoint is configured (``AWS_ENDPOINT_URL``): servers
    on an address or a single host name (Swift, Ceph, MinIO) have no bucket subdomains.
    Checksums only where the API requires them: servers before 2025 (Swift 2.30 among
    them) refuse the CRC trailers botocore sends by default since 1.36.
    """
    import boto3  # type: ignore[import-untyped]  # 0.3 s, paid only by a remote store
    from botocore.config import Config  # type: ignore[import-untyped]

    policy = policy if policy is not None else RetryPolicy.from_env()
    session = boto3.session.Session()
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(
        s3={"addressing_style": "path" if endpoint else "auto"},
        # One attempt: two retry layers would multiply (8 x 8 attempts) and boto3's bound
        # has no total time; a body that breaks off is not retried by it at all.
        retries={"mode": "standard", "total_max_attempts": 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=policy.connect_timeout,
        read_timeout=policy.read_timeout,
    )
    if session.region_name is None:
        return session.client("s3", config=config, region_name="us-east-1")
    return session.client("s3", config=config)


__all__ = [
    "BadRemoteSetting",
    "BadStoreUrl",
    "Listing",
    "ObjectInfo",
    "RemoteError",
    "RemoteNotFound",
    "RetryPolicy",
    "S3Storage",
    "StoreUrl",
    "env_number",
    "make_client",
    "transient",
]
