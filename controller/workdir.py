"""A user's folder -> a content-addressed archive: the rules of what is packed, and how.

What is packed:

- Inside a git work tree: what git would commit, as it is on disk now: the tracked files and the
  untracked ones no ``.gitignore`` excludes (``git ls-files --cached --others
  --exclude-standard``), local changes included, deleted files left out. ``.git`` never.
- Elsewhere: every file but :data:`DEFAULT_EXCLUDES` (``.git``, ``.venv``, ``__pycache__``, the
  trainer's ``checkpoints/`` and ``runs/`` at the top, tool caches).
- Either way, a ``.ddpjobignore`` at the folder's top (gitignore syntax and meaning, read by
  pathspec's ``GitIgnoreSpec``) leaves out more.
- A symlink is kept as a link when it is relative and resolves inside the folder; one that is
  absolute or leaves the folder, a socket, a FIFO or a device is refused, with its path named.

The archive is reproducible: a PAX tar of files and links sorted by path, mtime 0, uid/gid 0, no
user or group names, mode 0644 or 0755 (executable), gzipped with no name and no timestamp.
Its digest is ``sha256:`` of the *uncompressed* tar (``trainer.workdir.tar_digest``), so the
same files give the same digest on any machine, whatever zlib compressed them.

Where it goes is the CLI's business (a ConfigMap owned by the job, or ``s3://``); render only
names it (:class:`Shipped`); the pod's half is ``trainer.workdir``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import posixpath
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.errors import UserError
from controller.kubeflow import ANNOTATION_WORKDIR_DIGEST
from controller.quantity import format_bytes
from trainer.workdir import DIGEST_ALGORITHM, short

#: The ignore file read at the folder's top, in either mode.
IGNORE_FILE = ".ddpjobignore"
#: Left out of a folder outside git (gitignore syntax): VCS and environments, caches, and what
#: the trainer writes relative to its working directory.
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".venv/",
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    "/checkpoints/",
    "/runs/",
)
#: The largest archive shipped in a ConfigMap. The API server takes binaryData of 1,048,576
#: bytes (decoded) and refuses one byte more ("Too long: may not be more than 1048576 bytes",
#: kube-apiserver v1.33); this leaves room for the key, and etcd's request limit (1.5 MiB by
#: default) is above the object with its metadata.
CONFIGMAP_LIMIT_BYTES = 1_000_000
#: The largest archive ``render --values`` puts into chart values. Helm keeps a release (its
#: values and its manifest, so the archive twice, base64-encoded, then gzipped and
#: base64-encoded again) in one Secret of at most 1 MiB.
HELM_LIMIT_BYTES = 300_000
#: The gzip level: 6 (zlib's default) packs within a few percent of 9 at a fraction of its time.
GZIP_LEVEL = 6


@dataclass(frozen=True)
class Entry:
    """One path of the archive: a regular file (``size``, ``executable``) or a link."""

    path: str  # relative, posix
    size: int = 0
    executable: bool = False
    link: str | None = None


@dataclass(frozen=True)
class GitState:
    """The commit the folder's repository is at, and whether the packed files differ from it."""

    commit: str | None
    dirty: bool


@dataclass
class Archive:
    """A packed folder: the ``.tar.gz`` at ``path`` (a temp file: :meth:`remove` it)."""

    folder: Path
    path: Path
    digest: str
    size_bytes: int
    entries: list[Entry]
    git: GitState | None = None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def files(self) -> int:
        return len(self.entries)

    @property
    def content_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def largest(self, n: int = 5) -> list[Entry]:
        return sorted(self.entries, key=lambda e: (-e.size, e.path))[:n]

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def remove(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@dataclass(frozen=True)
class Shipped:
    """What render names: the archive's digest and where the pods fetch it, one of a ConfigMap
    (``config_map``, key :data:`CONFIGMAP_KEY`) or an object URL (``url``); and, inside git,
    the commit and whether the tree was dirty."""

    digest: str
    config_map: str | None = None
    url: str | None = None
    commit: str | None = None
    dirty: bool | None = None


#: The ConfigMap's key that holds the archive (its file name in the pod).
CONFIGMAP_KEY = "workdir.tar.gz"


def configmap_name(job: str) -> str:
    """The job's ConfigMap: ``<job>-workdir`` (a job name is at most 63 characters)."""
    return f"{job}-workdir"


# ---------------------------------------------------------------------------------------------
# What is packed


def list_entries(folder: Path) -> tuple[list[Entry], GitState | None]:
    """The folder's entries by the rules above, sorted by path, and its git state (None outside
    git). UserError on a missing folder, links out, sockets and devices (each path named)."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(
            f"workdir: {folder} {what} (got {folder}). Set workdir to your project's folder, "
            "relative to the spec file's folder, or pass --workdir DIR"
        )
    root = folder.resolve()
    git = _git_root(root)
    ignore = _ignore_spec(root)
    paths = list(_git_paths(root)) if git else list(_walk(root, ignore))
    problems: list[str] = []
    entries: list[Entry] = []
    for rel in sorted(set(paths)):
        if ignore is not None and _ignored(ignore, rel):
            continue
        entry = _entry(root, rel, problems)
        if entry is not None:
            entries.append(entry)
    if problems:
        raise UserError([f"workdir: {p}" for p in problems])
    return entries, (_git_state(root) if git else None)


def _ignore_spec(root: Path):
    path = root / IGNORE_FILE
    if not path.is_file():
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(path.read_text().splitlines())


def _ignored(spec, rel: str) -> bool:
    """gitignore's meaning: a path is out when it matches, or when a folder above it does (a
    file in an excluded folder cannot be re-included)."""
    parts = rel.split("/")
    folders = ("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return any(spec.match_file(f) for f in folders) or spec.match_file(rel)


def _walk(root: Path, ignore) -> Iterator[str]:
    """Every path under ``root`` outside git, pruned by the default excludes and the folders
    ``ignore`` leaves out (never walked: a data folder may hold many files); a symlink to a
    directory is yielded as a path, never walked."""
    import pathspec

    excluded = pathspec.GitIgnoreSpec.from_lines(DEFAULT_EXCLUDES)

    def out(folder: str) -> bool:
        return excluded.match_file(folder) or (ignore is not None and ignore.match_file(folder))

    for top, dirs, files in os.walk(root):
        here = Path(top).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        keep = []
        for d in sorted(dirs):
            rel = prefix + d
            if os.path.islink(os.path.join(top, d)):
                yield rel
            elif not out(rel + "/"):
                keep.append(d)
        dirs[:] = keep
        for f in files:
            if not excluded.match_file(prefix + f):
                yield prefix + f


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)


def _git_root(root: Path) -> bool:
    """Whether ``root`` is inside a git work tree (False where git is not installed)."""
    try:
        proc = _git(root, "rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        return False
    return proc.returncode == 0 and proc.stdout.strip() == b"true"


def _git_paths(root: Path) -> Iterator[str]:
    """What git would commit under ``root``: tracked and untracked-not-ignored paths, relative
    to ``root``; a submodule's files through its own listing."""
    proc = _git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    if proc.returncode != 0:
        raise UserError(
            f"workdir: git ls-files failed in {root} ({proc.stderr.decode().strip()}). "
            "Fix the repository, or pack the folder from outside it"
        )
    for raw in proc.stdout.split(b"\0"):
        if not raw:
            continue
        rel = os.fsdecode(raw)
        path = root / rel
        if path.is_dir() and not path.is_symlink():  # a submodule (a gitlink entry)
            if _git_root(path):  # checked out: its own listing
                yield from (f"{rel}/{sub}" for sub in _git_paths(path))
        else:
            yield rel


def _git_state(root: Path) -> GitState:
    head = _git(root, "rev-parse", "HEAD")
    commit = head.stdout.decode().strip() if head.returncode == 0 else None
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", ".")
    return GitState(commit=commit, dirty=bool(status.stdout.strip()) or commit is None)


def _entry(root: Path, rel: str, problems: list[str]) -> Entry | None:
    path = root / rel
    try:
        st = path.lstat()
    except FileNotFoundError:  # tracked but deleted on disk: not packed, as git would commit
        return None
    if stat.S_ISREG(st.st_mode):
        return Entry(rel, size=st.st_size, executable=bool(st.st_mode & 0o111))
    if stat.S_ISLNK(st.st_mode):
        return _link(root, rel, problems)
    if stat.S_ISDIR(st.st_mode):
        return None  # an empty submodule, or a directory git lists: its files come on their own
    kind = (
        "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "a FIFO"
        if stat.S_ISFIFO(st.st_mode)
        else "a device"
    )
    problems.append(
        f"{path} is {kind}, which cannot be packed. Move it out of the folder or list it "
        f"in {IGNORE_FILE}"
    )
    return None


def _link(root: Path, rel: str, problems: list[str]) -> Entry | None:
    path = root / rel
    target = os.readlink(path)
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    resolved = Path(os.path.realpath(path))
    if os.path.isabs(target) or inside.startswith("../") or inside == "..":
        problems.append(
            f"{path} is a symlink to {target}, outside the folder (or absolute): the pod would "
            f"not have it. Copy the file in, make the link relative, or list it in {IGNORE_FILE}"
        )
        return None
    if resolved != root and root not in resolved.parents:
        problems.append(
            f"{path} is a symlink to {target}, which resolves to {resolved}, outside the "
            f"folder. Copy the file in, or list it in {IGNORE_FILE}"
        )
        return None
    return Entry(rel, link=target)


# ---------------------------------------------------------------------------------------------
# The archive


def pack(folder: Path) -> Archive:
    """Pack ``folder`` into a reproducible ``.tar.gz`` in a temp dir (see the module doc)."""
    entries, git = list_entries(folder)
    if not entries:
        raise UserError(
            f"workdir: {folder} has no file to pack (got 0 files after the ignore rules). "
            f"Check .gitignore and {IGNORE_FILE}, or point workdir at your project's folder"
        )
    tmp = tempfile.TemporaryDirectory(prefix="ddpjob-workdir-")
    path = Path(tmp.name) / "workdir.tar.gz"
    try:
        digest = _write(folder.resolve(), entries, path)
    except BaseException:
        tmp.cleanup()
        raise
    return Archive(folder, path, digest, path.stat().st_size, entries, git, tmp)


class _Hashing:
    """A write-only file that hashes what passes through it on its way to ``sink``."""

    def __init__(self, sink):
        self.sink, self.hash = sink, hashlib.new(DIGEST_ALGORITHM)

    def write(self, data) -> int:
        self.hash.update(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()


def _write(root: Path, entries: list[Entry], path: Path) -> str:
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz,
    ):
        hashing = _Hashing(gz)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for e in entries:
                _add(tar, root, e)
    return f"{DIGEST_ALGORITHM}:{hashing.hash.hexdigest()}"


def _add(tar: tarfile.TarFile, root: Path, e: Entry) -> None:
    info = tarfile.TarInfo(e.path)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if e.link is not None:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.link, 0o777
        tar.addfile(info)
        return
    info.size, info.mode = e.size, 0o755 if e.executable else 0o644
    with open(root / e.path, "rb") as f:
        try:
            tar.addfile(info, f)
            grew = os.fstat(f.fileno()).st_size != e.size
        except OSError as err:  # shorter than when it was listed
            grew, detail = True, str(err)
        else:
            detail = f"{e.size} bytes when listed, {os.fstat(f.fileno()).st_size} now"
    if grew:
        raise UserError(
            f"workdir: {root / e.path} changed while it was packed (got {detail}). Pack "
            f"again, or leave it out with {IGNORE_FILE} if something writes it"
        )


def check_fits(archive: Archive, limit_bytes: int, where: str) -> None:
    """UserError naming the size, the five largest files and the fix when ``archive`` is over
    ``limit_bytes`` (``where``: what holds it, e.g. "a ConfigMap")."""
    if archive.size_bytes <= limit_bytes:
        return
    largest = ", ".join(f"{e.path} ({format_bytes(e.size)})" for e in archive.largest())
    raise UserError(
        f"workdir: {archive.folder} packs to {format_bytes(archive.size_bytes)}, over the "
        f"{format_bytes(limit_bytes)} {where} holds (got {archive.files} files, "
        f"{format_bytes(archive.content_bytes)} before compression; largest: {largest}). "
        f"Leave big files out with a {IGNORE_FILE} rule (gitignore syntax), or set "
        "workdir_store: s3://BUCKET/PREFIX"
    )


def summary(archive: Archive, where: str) -> str:
    """The one line submit prints: files, size, digest, where it went."""
    git = ""
    if archive.git is not None and archive.git.commit:
        git = f", git {archive.git.commit[:12]}{' (dirty)' if archive.git.dirty else ''}"
    return (
        f"workdir: {archive.files} files, {format_bytes(archive.size_bytes)}, "
        f"{short(archive.digest)}{git} -> {where}"
    )


# ---------------------------------------------------------------------------------------------
# Where it goes


def folder_of(workdir: str, spec_path: str | None) -> Path:
    """The spec's ``workdir`` as a folder: relative to the spec file's folder (an absolute
    path, as ``--workdir`` passes it, stays as it is)."""
    path = Path(workdir).expanduser()
    if path.is_absolute() or spec_path is None:
        return path
    return Path(spec_path).parent / path


def shipped_for(job: str, store: str | None, archive: Archive) -> Shipped:
    """What render names for ``archive``: the job's ConfigMap, or the object under ``store``."""
    from trainer.workdir import object_name

    git = archive.git
    common = {
        "digest": archive.digest,
        "commit": git.commit if git else None,
        "dirty": git.dirty if git else None,
    }
    if store:
        return Shipped(url=f"{store.rstrip('/')}/{object_name(archive.digest)}", **common)
    return Shipped(config_map=configmap_name(job), **common)


def configmap_manifest(
    shipped: Shipped, namespace: str, archive: Archive, labels: dict[str, str]
) -> dict[str, Any]:
    """The ConfigMap that holds ``archive`` for the job's pods: immutable (the kubelet need not
    watch it), its key :data:`CONFIGMAP_KEY`. submit creates it owned by the job (so deleting
    the job deletes it); the chart, owned by the release."""
    import base64

    assert shipped.config_map is not None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": shipped.config_map,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {ANNOTATION_WORKDIR_DIGEST: shipped.digest},
        },
        "immutable": True,
        "binaryData": {CONFIGMAP_KEY: base64.b64encode(archive.read_bytes()).decode()},
    }


def upload(archive: Archive, store: str) -> tuple[str, bool]:
    """Put ``archive`` into ``store`` unless it is there: (its URL, whether it was uploaded).
    UserError, before anything is created, when this machine cannot or the store refuses."""
    from trainer.workdir import upload as put

    try:
        return put(archive.path, store, archive.digest)
    except ImportError as e:
        raise UserError(
            f"workdir_store: uploading to {store} needs boto3 on this machine (got "
            f"ImportError: {e}). pip install 'ddpjob[s3]', or leave workdir_store out to ship "
            "it in a ConfigMap"
        ) from None
    except Exception as e:  # the store's StorageError, or botocore's credential errors
        detail = getattr(e, "detail", None) or f"{type(e).__name__}: {e}"
        raise UserError(
            f"workdir_store: {store} refused the upload ({detail}). Check this machine's "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or profile), AWS_ENDPOINT_URL for an "
            "S3-compatible server, and that the bucket exists"
        ) from None
