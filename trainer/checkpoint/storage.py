"""Where checkpoint objects live: a local directory or an S3 bucket, behind one small interface.

A store holds named objects (``step_00000100/state.pt``: ``/`` separates the parts of a name) under
one root, a directory or ``s3://bucket/prefix``. It writes an object whole or not at all: on disk
through a temp file that is fsynced and renamed into place, on S3 as one PUT or one multipart
upload, which is invisible until it completes. What makes a *checkpoint* complete (its manifest,
written last) is ``trainer.checkpoint.manager``'s business, not the store's.

S3 goes through boto3, configured the way the AWS tools are: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (or any other source of boto3's credential chain), ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, and ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for an S3-compatible
server, which is then addressed by path (``http://server/bucket/key``), as such servers expect.
An upload streams: ``torch.save`` writes into a pipe and boto3's transfer manager sends the bytes
as parallel multipart parts, holding a bounded number of parts in memory, never the whole state.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

#: The URL scheme of object storage in ``checkpoint.dir``.
S3_SCHEME = "s3://"
#: Multipart part size of S3 uploads and downloads (S3's minimum part is 5 MiB, its maximum part
#: count 10,000: 32 MiB parts allow objects up to 312 GiB).
PART_BYTES = 32 << 20
#: Parts uploaded or downloaded at once. (An upload from a stream holds at most 10 parts in
#: memory: s3transfer's ``max_in_memory_upload_chunks``.)
CONCURRENCY = 8


class StorageError(Exception):
    """A store refused or failed an operation: ``url`` is where, ``detail`` the server's answer."""

    def __init__(self, url: str, detail: str):
        super().__init__(f"{url}: {detail}")
        self.url, self.detail = url, detail


class Store(Protocol):
    """Named objects under one root (see the module docstring)."""

    #: The root, as the user wrote it: an absolute directory or ``s3://bucket/prefix``.
    url: str

    def url_of(self, name: str) -> str:
        """Where object ``name`` is, for messages and events."""

    def writer(self, name: str) -> contextlib.AbstractContextManager[Written]:
        """A file object to write ``name`` into: stored whole when the block ends, not at all
        when it raises. It counts and checksums what passes (``size``, ``crc``)."""

    def write(self, name: str, produce: Callable[[BinaryIO], None]) -> tuple[int, int]:
        """Store what ``produce`` writes into the file object it is given, whole or not at all;
        return its size and CRC-32."""

    def write_bytes(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``, whole or not at all."""

    def read_bytes(self, name: str) -> bytes:
        """The object's content (FileNotFoundError if there is none)."""

    def exists(self, name: str) -> bool:
        """Whether object ``name`` is there (a shipped workdir is uploaded only when not)."""

    def local_path(self, name: str) -> Path | None:
        """The object's file, where the store is a directory (None for object storage)."""

    def list(self) -> list[str]:
        """Every object's name under the root (at most two levels deep), in no order."""

    def delete(self, names: list[str]) -> None:
        """Remove these objects, in this order; a missing one is no error."""

    def probe(self) -> None:
        """Write, list, read back and delete a small object: raise StorageError if any fails."""

    def remove_partial(self) -> None:
        """Remove what a writer killed mid-object left behind: temp files, open uploads,
        directories emptied by a delete cut short."""


def is_url(location: str) -> bool:
    return location.startswith(S3_SCHEME)


def open_store(location: str, retries: Retries | None = None) -> Store:
    """The store for ``checkpoint.dir``: ``s3://bucket/prefix`` or a local directory;
    ``retries``: how an S3 request is retried (the default: :data:`DATA_RETRIES`)."""
    if is_url(location):
        return S3Store(location, retries)
    return LocalStore(Path(location))


def describe(e: BaseException) -> str:
    """One line for an I/O or S3 error: the server's code and message where it sent one."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        err = response["Error"]
        code = err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        text = f"{code}: {err.get('Message') or ''}".rstrip(": ")
    else:
        lines = str(e).strip().splitlines()
        text = f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= 200 else text[:197] + "..."


class Written(io.RawIOBase):
    """A write-only file that passes every byte on to ``sink`` and counts and checksums them."""

    def __init__(self, sink: BinaryIO):
        self.sink, self.size, self.crc = sink, 0, 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        self.sink.write(view)
        return len(view)


def crc_file(path: Path, block: int = 16 << 20) -> tuple[int, int]:
    """A file's size and CRC-32, read in blocks."""
    size, crc = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
    return size, crc


def _probe_name() -> str:
    return f".ddpjob-probe-{socket.gethostname()}-{os.getpid()}"


def _write(store: Store, name: str, produce: Callable[[BinaryIO], None]) -> tuple[int, int]:
    """``Store.write`` over ``Store.writer``: the object's size and CRC-32."""
    with store.writer(name) as f:
        produce(f)
    return f.size, f.crc


# ---------------------------------------------------------------------------------------------
# A local directory (a PVC on a cluster)

#: Temp files of a write in progress: ``.state.pt.tmp-<pid>`` beside the object they become.
_TEMP = re.compile(r"\..+\.tmp-\d+")


class LocalStore:
    """Objects as files under a directory; names with ``/`` are files in subdirectories."""

    def __init__(self, root: Path):
        self.root = root.absolute()
        self.url = str(self.root)

    def url_of(self, name: str) -> str:
        return str(self.root / name)

    def local_path(self, name: str) -> Path:
        return self.root / name

    @contextlib.contextmanager
    def writer(self, name: str) -> Iterator[Written]:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                tee = Written(f)
                yield tee
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # make the rename itself durable

    def write(self, name: str, produce: Callable[[BinaryIO], None]) -> tuple[int, int]:
        return _write(self, name, produce)

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write(name, lambda f: f.write(data))

    def read_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def list(self) -> list[str]:
        names = []
        for top in _scandir(self.root):
            if top.is_dir(follow_symlinks=False):
                names += [f"{top.name}/{e.name}" for e in _scandir(Path(top.path)) if e.is_file()]
            elif top.is_file():
                names.append(top.name)
        return names

    def delete(self, names: list[str]) -> None:
        parents = []
        for name in names:
            path = self.root / name
            path.unlink(missing_ok=True)
            if path.parent != self.root and path.parent not in parents:
                parents.append(path.parent)
        for parent in parents:  # a step's directory goes with its last object
            with contextlib.suppress(OSError):  # not empty, or already gone
                parent.rmdir()

    def probe(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            name, data = _probe_name(), b"ddpjob probe"
            self.write_bytes(name, data)
            self.list()
            if self.read_bytes(name) != data:
                raise OSError("read back other bytes than were written")
            self.delete([name])
        except OSError as e:
            raise StorageError(self.url, describe(e)) from e

    def remove_partial(self) -> None:
        stale = [n for n in self.list() if _TEMP.fullmatch(n.rpartition("/")[2])]
        self.delete(stale)
        # A delete cut short between a directory's last unlink and its rmdir leaves it empty.
        for top in _scandir(self.root):
            if top.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):  # not empty: someone's objects
                    os.rmdir(top.path)


def _scandir(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except FileNotFoundError:
        return []


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# S3 and S3-compatible servers


@dataclass(frozen=True)
class Retries:
    """How boto3 retries an S3 request (``checkpoint.max_attempts``, ``checkpoint.retry_mode``):
    its own retry modes, which back off exponentially (with jitter, at most 20 s between
    attempts) on throttling, 5xx answers, timeouts and refused connections."""

    max_attempts: int = 8
    mode: str = "standard"


#: Saves and loads: every attempt a transient outage may need.
DATA_RETRIES = Retries()
#: The probe's bounds: a wrong endpoint or bucket is said within seconds, not after minutes of
#: retries. Saves and loads get longer reads (a large part takes a while).
PROBE_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 10}
PROBE_RETRIES = Retries(max_attempts=2)
DATA_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 120}


def s3_client(connect_timeout: float, read_timeout: float, retries: Retries = DATA_RETRIES):
    """A boto3 S3 client from the environment (credentials, region, endpoint), with bounds."""
    import boto3
    from botocore.config import Config

    # Their INFO lines ("Found credentials in environment variables") are not the run's news.
    for name in ("boto3", "botocore", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)

    custom_endpoint = any(os.environ.get(v) for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    config = Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": retries.mode, "max_attempts": retries.max_attempts},
        max_pool_connections=CONCURRENCY + 2,
        # S3-compatible servers answer at one host name, not a host name per bucket.
        s3={"addressing_style": "path"} if custom_endpoint else None,
    )
    return boto3.session.Session().client("s3", config=config)


def parse_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``."""
    bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
    return bucket, prefix.strip("/")


class S3Store:
    """Objects under ``s3://bucket/prefix/``."""

    def __init__(self, url: str, retries: Retries | None = None):
        self.bucket, self.prefix = parse_s3(url)
        self.url = f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")
        self.retries = retries or DATA_RETRIES
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = s3_client(**DATA_TIMEOUTS, retries=self.retries)
        return self._client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url_of(self, name: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self._key(name)}"

    def local_path(self, name: str) -> None:
        return None

    def _transfer_config(self):
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=PART_BYTES,
            multipart_chunksize=PART_BYTES,
            max_concurrency=CONCURRENCY,
        )

    @contextlib.contextmanager
    def writer(self, name: str) -> Iterator[Written]:
        """What the block writes goes into a pipe; the transfer manager reads it part by part
        (one PUT if it is short, a multipart upload if not) in a thread of its own."""
        read_fd, write_fd = os.pipe()
        source = _PipeSource(os.fdopen(read_fd, "rb", buffering=PART_BYTES))
        uploaded: list[BaseException] = []

        def upload() -> None:
            try:
                self.client.upload_fileobj(
                    source, self.bucket, self._key(name), Config=self._transfer_config()
                )
            except BaseException as e:
                uploaded.append(e)
            finally:
                source.close()  # a producer still writing gets EPIPE, not a pipe that never drains

        uploader = threading.Thread(target=upload, name="ddpjob-s3-upload", daemon=True)
        uploader.start()
        sink = os.fdopen(write_fd, "wb")
        produced: BaseException | None = None
        try:
            yield Written(sink)
        except BaseException as e:
            produced = e
            source.failed = True  # before the close: the upload must fail, not end short
        finally:
            with contextlib.suppress(OSError):  # the uploader gave up and closed its end
                sink.close()
        uploader.join()
        # The first failure is the one to tell: a producer cut off by a failed upload sees EPIPE.
        if uploaded and (produced is None or isinstance(produced, BrokenPipeError)):
            raise StorageError(self.url_of(name), describe(uploaded[0])) from uploaded[0]
        if produced is not None:
            raise produced

    def write(self, name: str, produce: Callable[[BinaryIO], None]) -> tuple[int, int]:
        return _write(self, name, produce)

    def write_bytes(self, name: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except Exception as e:
            raise StorageError(self.url_of(name), describe(e)) from e

    def read_bytes(self, name: str) -> bytes:
        buf = io.BytesIO()
        try:
            self.client.download_fileobj(
                self.bucket, self._key(name), buf, Config=self._transfer_config()
            )
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(self.url_of(name)) from e
            raise StorageError(self.url_of(name), describe(e)) from e
        return buf.getvalue()

    def exists(self, name: str) -> bool:
        client = self.client  # without boto3 here: ImportError, not the store's refusal
        try:
            client.head_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise StorageError(self.url_of(name), describe(e)) from e
        return True

    def list(self) -> list[str]:
        return self._list(self.client, self._key(""))

    def _list(self, client, prefix: str) -> list[str]:
        names = []
        try:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                names += [o["Key"][len(prefix) :] for o in page.get("Contents", [])]
        except Exception as e:
            raise StorageError(self.url, describe(e)) from e
        return [n for n in names if n.count("/") <= 1]

    def delete(self, names: list[str]) -> None:
        # One request deletes up to 1,000 keys; S3 applies them in no promised order, so each
        # object that must go first gets a request of its own (see trainer.checkpoint.manager).
        for name in names:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self._key(name))
            except Exception as e:
                raise StorageError(self.url_of(name), describe(e)) from e

    def probe(self) -> None:
        client = s3_client(**PROBE_TIMEOUTS, retries=PROBE_RETRIES)
        key, data = self._key(_probe_name()), b"ddpjob probe"
        try:
            client.put_object(Bucket=self.bucket, Key=key, Body=data)
            self._list(client, key)
            got = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            if got != data:
                raise StorageError(self.url, "read back other bytes than were written")
            client.delete_object(Bucket=self.bucket, Key=key)
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(self.url, describe(e)) from e

    def remove_partial(self) -> None:
        """Abort the multipart uploads under the prefix that a killed writer left open (they
        are invisible, but the bucket keeps and bills their parts until then)."""
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._key("")
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
        except Exception as e:
            raise StorageError(self.url, describe(e)) from e


def _code(e: BaseException) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


class _PipeSource(io.RawIOBase):
    """The read end of the upload's pipe. A short read is the end of the object, unless the
    producer failed: then it raises, so the transfer manager aborts the upload instead of
    completing a truncated object."""

    def __init__(self, f: BinaryIO):
        self.f, self.failed = f, False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        if self.failed and (size < 0 or len(data) < size):
            raise OSError("the checkpoint's serialisation failed; upload abandoned")
        return data

    def close(self) -> None:
        self.f.close()
        super().close()
