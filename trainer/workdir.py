"""The pod's half of a shipped working directory: fetch the archive, check it, unpack it safely.

``controller.workdir`` packs a user's folder into a reproducible ``.tar.gz`` whose digest is the
SHA-256 of its *uncompressed* tar stream (so the same files give the same digest whatever zlib
compressed them). The job names that digest; in the pod, before the user's code runs::

    python -m trainer.workdir SOURCE --digest sha256:HEX --into /workdir [-- COMMAND ARGS...]

SOURCE is the archive as a file (a ConfigMap's key, mounted) or ``s3://bucket/prefix/HEX.tar.gz``
(read with the checkpoint stores' code and credentials: ``trainer.checkpoint.storage``). The
digest is checked before a single file is written; a mismatch is exit 2 with one line. Unpacking
accepts regular files and symlinks only, refuses absolute names, ``..``, a name twice and a path
under a symlink, writes every file before any link exists, and checks that each link resolves
inside the folder. A marker (``.ddpjob-digest``) makes a second run with the same digest (a
container restarted in place) keep the folder as it is. With a COMMAND (the training
container's own, as render writes it for both job APIs) it then changes into the folder, puts
it at the head of ``PYTHONPATH`` and execs the command, which becomes the container's PID 1.

The client uploads through here too (:func:`upload`), so both ends of ``s3://`` are one code.
Stdlib only at import: ``controller.workdir`` imports this module; boto3 comes in, through the
store, only when an ``s3://`` source or store is used.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import posixpath
import shutil
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trainer.contract import EXIT_CONFIG

#: The digest's algorithm, as it prefixes the hex.
DIGEST_ALGORITHM = "sha256"
#: Left in the unpacked folder: the digest it holds.
MARKER = ".ddpjob-digest"
#: An object store's name for an archive: ``<hex>.tar.gz`` under the store's prefix.
SUFFIX = ".tar.gz"
_CHUNK = 1 << 20


class WorkdirError(Exception):
    """The archive cannot be fetched, does not match its digest, or holds an unsafe entry."""


def object_name(digest: str) -> str:
    """The archive's name in an object store: ``<hex>.tar.gz``."""
    return digest.partition(":")[2] + SUFFIX


def short(digest: str) -> str:
    """``sha256:0123456789ab``: enough to tell archives apart in a line of output."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}:{hexdigest[:12]}"


def tar_digest(gz: BinaryIO) -> str:
    """``sha256:<hex>`` of the tar stream inside the gzip stream ``gz`` (read to its end)."""
    h = hashlib.sha256()
    with gzip.GzipFile(fileobj=gz, mode="rb") as tar:
        while chunk := tar.read(_CHUNK):
            h.update(chunk)
    return f"{DIGEST_ALGORITHM}:{h.hexdigest()}"


# ---------------------------------------------------------------------------------------------
# Unpacking


def _checked_name(name: str) -> str:
    norm = posixpath.normpath(name)
    if name.startswith("/") or norm.startswith("/"):
        raise WorkdirError(f"{name}: an absolute path")
    if norm == ".." or norm.startswith("../") or ".." in name.split("/"):
        raise WorkdirError(f"{name}: a path with ..")
    if norm in (".", ""):
        raise WorkdirError(f"{name!r}: not a file's path")
    return norm


def _members(tar: tarfile.TarFile) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """Each entry with its checked name: files and symlinks only, each name once, none under a
    symlink (a file written there would go wherever the link points)."""
    seen: set[str] = set()
    links: set[str] = set()
    for info in tar:
        name = _checked_name(info.name)
        if not (info.isfile() or info.issym()):
            raise WorkdirError(f"{name}: not a regular file or a symlink (tar type {info.type!r})")
        if name in seen:
            raise WorkdirError(f"{name}: in the archive twice")
        parents = {"/".join(name.split("/")[:i]) for i in range(1, name.count("/") + 1)}
        if parents & links:
            raise WorkdirError(f"{name}: under a symlink")
        seen.add(name)
        if info.issym():
            if info.linkname.startswith("/"):
                raise WorkdirError(f"{name}: a symlink to an absolute path ({info.linkname})")
            links.add(name)
        yield name, info


def unpack(gz: BinaryIO, into: Path) -> int:
    """Unpack the archive ``gz`` into the empty-or-missing folder ``into``; the file count.

    Files first, then the links (so no file is written through one), then every link is
    resolved and must land inside ``into``; on any refusal ``into`` is emptied again."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    links: list[tuple[str, str]] = []
    count = 0
    try:
        with tarfile.open(fileobj=gz, mode="r|gz") as tar:
            for name, info in _members(tar):
                if info.issym():
                    links.append((name, info.linkname))
                    continue
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(info)
                assert source is not None
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
                os.chmod(target, 0o755 if info.mode & 0o111 else 0o644)
                count += 1
        for name, linkname in links:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(linkname, path)
        for name, linkname in links:
            resolved = Path(os.path.realpath(root / name))
            if resolved != root and root not in resolved.parents:
                raise WorkdirError(f"{name}: a symlink that leaves the folder ({linkname})")
        return count + len(links)
    except (WorkdirError, tarfile.TarError, EOFError, OSError) as e:
        empty(into)
        if isinstance(e, WorkdirError):
            raise
        raise WorkdirError(f"not a readable tar.gz archive ({type(e).__name__}: {e})") from e


def empty(folder: Path) -> None:
    """Remove everything inside ``folder`` (an emptyDir's mount point itself stays)."""
    for child in folder.iterdir() if folder.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def unpacked_digest(into: Path) -> str | None:
    """The digest a previous unpack into ``into`` left in its marker, if any."""
    try:
        return (into / MARKER).read_text().strip()
    except OSError:
        return None


def install(data: bytes, digest: str, into: Path) -> tuple[int, bool]:
    """Check ``data`` against ``digest`` and unpack it into ``into``, unless ``into`` already
    holds that digest: (files, whether this call unpacked)."""
    if unpacked_digest(into) == digest:
        return 0, False
    got = tar_digest(io.BytesIO(data))
    if got != digest:
        raise WorkdirError(
            f"the archive's digest is {got}, the job names {digest}: it changed after the "
            "job was submitted. Submit the job again"
        )
    empty(into)
    count = unpack(io.BytesIO(data), into)
    (into / MARKER).write_text(digest + "\n")
    return count, True


# ---------------------------------------------------------------------------------------------
# Where the archive is: a file, or an object store


def is_url(source: str) -> bool:
    from trainer.checkpoint.storage import is_url as store_url

    return store_url(source)


def fetch(source: str) -> bytes:
    """The archive's bytes from a file or ``s3://bucket/prefix/<hex>.tar.gz``."""
    if not is_url(source):
        try:
            return Path(source).read_bytes()
        except OSError as e:
            raise WorkdirError(f"{source}: cannot read the archive ({e.strerror})") from e
    from trainer.checkpoint.storage import StorageError, open_store

    prefix, _, name = source.rpartition("/")
    try:
        return open_store(prefix).read_bytes(name)
    except FileNotFoundError as e:
        raise WorkdirError(f"{source}: no such object") from e
    except StorageError as e:
        raise WorkdirError(f"{source}: {e.detail}") from e


def upload(path: Path, store: str, digest: str) -> tuple[str, bool]:
    """Put the archive at ``path`` into ``store`` (``s3://bucket/prefix``) as
    ``<hex>.tar.gz``, unless an object of that name is there already: (its url, uploaded).

    Raises StorageError (the store's answer) and ImportError (no boto3 here)."""
    from trainer.checkpoint.storage import open_store

    target = open_store(store)
    name = object_name(digest)
    if target.exists(name):
        return target.url_of(name), False

    def produce(out: BinaryIO) -> None:
        with open(path, "rb") as f:
            shutil.copyfileobj(f, out, _CHUNK)

    target.write(name, produce)
    return target.url_of(name), True


# ---------------------------------------------------------------------------------------------
# python -m trainer.workdir


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``SOURCE --digest D --into DIR [-- COMMAND ARGS...]``: everything after ``--`` is the
    command, untouched (its own flags included)."""
    head, command = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = argparse.ArgumentParser(
        prog="python -m trainer.workdir",
        description="Fetch, check and unpack a job's working directory; then run COMMAND in it.",
    )
    p.add_argument("source", help="the archive: a file, or s3://bucket/prefix/<hex>.tar.gz")
    p.add_argument("--digest", required=True, help="sha256:<hex> of the archive's tar stream")
    p.add_argument("--into", required=True, type=Path, help="the folder to unpack into")
    args = p.parse_args(head)
    args.command = command
    return args


def run_in(into: Path, command: list[str]) -> None:
    """Exec ``command`` in ``into`` with ``into`` at the head of PYTHONPATH (never returns)."""
    os.chdir(into)
    rest = os.environ.get("PYTHONPATH", "")
    parts = [str(into), *(p for p in rest.split(os.pathsep) if p and p != str(into))]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        data = b"" if unpacked_digest(args.into) == args.digest else fetch(args.source)
        count, unpacked = install(data, args.digest, args.into)
    except WorkdirError as e:
        print(f"workdir: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if unpacked:
        print(
            f"workdir: {count} files, {len(data)} bytes, {args.digest} from {args.source} "
            f"-> {args.into}",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"workdir: {args.into} already holds {args.digest}", file=sys.stderr, flush=True)
    if args.command:
        try:
            run_in(args.into, args.command)
        except OSError as e:
            print(f"workdir: cannot run {args.command[0]!r} ({e.strerror})", file=sys.stderr)
            return 127
    return 0


if __name__ == "__main__":
    sys.exit(main())
