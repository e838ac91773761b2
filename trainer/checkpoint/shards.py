"""torch.distributed.checkpoint (DCP) over a checkpoint store: each rank's shard as an object of
the store (a local dir or ``s3://``), written whole or not at all, counted and checksummed.

DCP writes through a ``FileSystemBase``; :class:`StoreFiles` is one over a
``trainer.checkpoint.storage.Store``: a stream it opens for writing is the store's ``writer`` (a
temp file renamed into place, or one upload), and one it opens for reading has first been checked
against the manifest's size and CRC-32 (:class:`Damaged` if it differs). DCP's own names are kept
under the step: ``__<rank>_<n>.distcp`` per rank and ``.metadata`` (the coordinator's), which DCP
writes to a temp name and renames; a store writes whole objects already, so the temp name is the
final one and the rename is nothing.
"""

from __future__ import annotations

import contextlib
import io
import zlib
from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from trainer.checkpoint.storage import Store, crc_file

#: DCP's metadata object (its ``.metadata``; written by the coordinator, rank 0).
METADATA = ".metadata"
_TEMP_SUFFIX = ".tmp"


class Damaged(ValueError):
    """An object of a checkpoint is missing or is not what its manifest says."""


class StoreFiles(FileSystemBase):
    """DCP's file system over a store: paths are object names (``step_00000100/__0_0.distcp``).

    ``written`` holds what this process stored, ``{name: (bytes, crc32)}``; ``expected`` (when
    reading) what the manifest says each object is."""

    def __init__(self, store: Store, expected: dict[str, dict[str, Any]] | None = None):
        self.store = store
        self.expected = expected or {}
        self.written: dict[str, tuple[int, int]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | Any, mode: str) -> Iterator[io.IOBase]:
        name = str(path).removesuffix(_TEMP_SUFFIX)
        if mode == "wb":
            with self.store.writer(name) as f:
                yield f
            self.written[name] = (f.size, f.crc)
        elif mode == "rb":
            yield self._verified(name)
        else:
            raise ValueError(f"StoreFiles: mode {mode} (got {path})")

    def _verified(self, name: str) -> io.IOBase:
        """The object, opened for reading once its size and CRC-32 are the manifest's."""
        leaf = name.rpartition("/")[2]
        want = self.expected.get(leaf)
        if want is None:
            raise Damaged(f"{leaf} is not in the manifest")
        path = self.store.local_path(name)
        try:
            if path is not None:
                size, crc = crc_file(path)
                source: io.IOBase = open(path, "rb")  # noqa: SIM115 (DCP closes it)
            else:
                data = self.store.read_bytes(name)
                size, crc, source = len(data), zlib.crc32(data), io.BytesIO(data)
        except FileNotFoundError:
            raise Damaged(f"{leaf} is missing") from None
        if size != want["bytes"] or f"{crc:08x}" != want["crc32"]:
            source.close()
            raise Damaged(
                f"{leaf} has {size} bytes, CRC-32 {crc:08x}; its manifest says "
                f"{want['bytes']}, {want['crc32']}"
            )
        return source

    def concat_path(self, path: str | Any, suffix: str) -> str:
        return f"{path}/{suffix}"

    def rename(self, path: str | Any, new_path: str | Any) -> None:
        """Nothing: the temp name was written as the final one (see the module docstring)."""

    def init_path(self, path: str | Any) -> str:
        return str(path)

    def mkdir(self, path: str | Any) -> None:
        """Nothing: a store's names need no directories."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | Any) -> bool:
        return True

    def exists(self, path: str | Any) -> bool:
        # DCP asks before it writes its metadata, to warn about overwriting; a step written
        # again has had its manifest removed first (trainer.checkpoint.manager).
        return False

    def rm_file(self, path: str | Any) -> None:
        """Nothing: writing an object replaces it."""


def writer(store: Store, name: str) -> FileSystemWriter:
    """DCP's writer of checkpoint ``name`` (a step) into ``store``: one object per rank. Its
    ``fs.written`` says what this rank stored."""
    w = FileSystemWriter(name, single_file_per_rank=True, sync_files=False, overwrite=True)
    w.fs, w.path = StoreFiles(store), name
    return w


def reader(store: Store, name: str, objects: dict[str, dict[str, Any]]) -> FileSystemReader:
    """DCP's reader of checkpoint ``name`` in ``store``, each object checked against
    ``objects`` (the manifest's) before DCP reads it."""
    r = FileSystemReader(name)
    r.fs, r.path = StoreFiles(store, objects), name
    return r
