"""The workdir's packing rules (controller.workdir) and the pod's unpacking (trainer.workdir).

Real folders, real git repositories, real sockets and FIFOs; archives crafted with tarfile for
what a packer never writes but an attacker or a damaged upload could.
"""

from __future__ import annotations

import gzip
import io
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from controller.errors import UserError
from controller.workdir import (
    DEFAULT_EXCLUDES,
    check_fits,
    list_entries,
    pack,
    summary,
)
from tests.projects import git, git_repository, write_tree
from trainer import workdir as pod


def _members(archive: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """Each entry of a .tar.gz, in its order, with a file's content."""
    with tarfile.open(archive) as tar:
        return {
            m.name: (m, tar.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def _paths(folder: Path) -> list[str]:
    return [e.path for e in list_entries(folder)[0]]


PROJECT = {
    "train.py": "import helpers.util\n",
    "helpers/__init__.py": "",
    "helpers/util.py": "VALUE = 1\n",
    "data/words.txt": "hello\n",
}


# ---------------------------------------------------------------------------------------------
# Outside git


def test_outside_git_everything_but_the_default_excludes(tmp_path):
    root = write_tree(
        tmp_path / "p",
        {
            **PROJECT,
            ".git/config": "x",
            ".venv/bin/python": "x",
            "helpers/__pycache__/util.cpython-311.pyc": "x",
            "stray.pyc": "x",
            "checkpoints/step_1/state.pt": "x",
            "runs/job/logs/rank-0.log": "x",
            # Only the top's checkpoints/ and runs/ are the trainer's: a package's own stay.
            "helpers/runs/keep.py": "",
            "helpers/checkpoints.py": "",
        },
    )
    assert _paths(root) == [
        "data/words.txt",
        "helpers/__init__.py",
        "helpers/checkpoints.py",
        "helpers/runs/keep.py",
        "helpers/util.py",
        "train.py",
    ]
    assert list_entries(root)[1] is None  # no git state outside git
    assert ".git/" in DEFAULT_EXCLUDES


def test_ddpjobignore_leaves_out_more_in_gitignore_syntax(tmp_path):
    root = write_tree(
        tmp_path / "p",
        {
            **PROJECT,
            "data/big.bin": b"\0" * 10,
            "notes/a.md": "",
            "notes/keep.md": "",
            ".ddpjobignore": "*.bin\nnotes/\n!notes/keep.md\n",
        },
    )
    # gitignore's meaning: a file inside an excluded directory cannot be re-included.
    assert _paths(root) == [".ddpjobignore", *sorted(PROJECT)]


def test_a_missing_folder_and_a_file_are_one_line_each(tmp_path):
    with pytest.raises(UserError) as e:
        list_entries(tmp_path / "nope")
    assert e.value.problems == [
        f"workdir: {tmp_path / 'nope'} does not exist (got {tmp_path / 'nope'}). Set workdir "
        "to your project's folder, relative to the spec file's folder, or pass --workdir DIR"
    ]
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        list_entries(tmp_path / "f")


def test_an_empty_result_is_refused(tmp_path):
    root = write_tree(tmp_path / "p", {"a.py": "", ".ddpjobignore": "*\n"})
    with pytest.raises(UserError, match="has no file to pack"):
        pack(root)


# ---------------------------------------------------------------------------------------------
# Inside git


@pytest.fixture
def repo(tmp_path) -> Path:
    return git_repository(
        tmp_path / "repo",
        {
            ".gitignore": "secret.txt\n*.log\n",
            "README.md": "top\n",
            "project/train.py": "print('v1')\n",
            "project/helpers/__init__.py": "",
            "project/helpers/util.py": "VALUE = 1\n",
            "project/gone.py": "",
        },
    )


def test_inside_git_what_git_would_commit_as_on_disk(repo):
    project = repo / "project"
    write_tree(project, {"new.py": "", "secret.txt": "pw", "debug.log": "", "ckpt/state.pt": "x"})
    (project / "gone.py").unlink()
    (project / "train.py").write_text("print('v2')\n")
    entries, state = list_entries(project)
    # Untracked and not ignored: packed (ckpt/ too: git would commit it); ignored ones and the
    # file deleted on disk: not; the folder's own listing only (README.md is above it).
    assert [e.path for e in entries] == [
        "ckpt/state.pt",
        "helpers/__init__.py",
        "helpers/util.py",
        "new.py",
        "train.py",
    ]
    head = git(repo, "rev-parse", "HEAD").strip()
    assert state is not None and state.commit == head and state.dirty
    with pack(project) as archive:
        members = _members(archive.path)
        assert ".git" not in " ".join(members) and "secret.txt" not in members
        assert members["train.py"][1] == b"print('v2')\n"


def test_a_clean_tree_is_not_dirty_and_a_ddpjobignore_applies_ingit(repo):
    project = repo / "project"
    (project / ".ddpjobignore").write_text("helpers/util.py\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ignore")
    entries, state = list_entries(project)
    assert [e.path for e in entries] == [
        ".ddpjobignore",
        "gone.py",
        "helpers/__init__.py",
        "train.py",
    ]
    assert state is not None and not state.dirty
    # A change outside the packed folder does not make it dirty.
    (repo / "README.md").write_text("changed\n")
    assert list_entries(project)[1].dirty is False


# ---------------------------------------------------------------------------------------------
# What is refused


def test_links_inside_are_kept_and_links_out_are_refused_by_path(tmp_path):
    root = write_tree(tmp_path / "p", PROJECT)
    os.symlink("../helpers/util.py", root / "data" / "util_link.py")
    os.symlink("helpers", root / "lib")  # a directory link: kept as a link, not walked
    assert _paths(root) == sorted([*PROJECT, "data/util_link.py", "lib"])
    entries = {e.path: e for e in list_entries(root)[0]}
    assert entries["lib"].link == "helpers" and entries["data/util_link.py"].size == 0

    (tmp_path / "outside.txt").write_text("x")
    os.symlink("../outside.txt", root / "out.txt")
    os.symlink(str(root / "train.py"), root / "abs.py")
    with pytest.raises(UserError) as e:
        list_entries(root)
    assert len(e.value.problems) == 2
    assert any(f"{root / 'out.txt'} is a symlink to ../outside.txt" in p for p in e.value.problems)
    assert any(f"{root / 'abs.py'} is a symlink to {root}" in p for p in e.value.problems)


def test_a_link_through_a_link_that_leaves_is_refused(tmp_path):
    """A link whose text stays inside but whose target is reached through a link that
    leaves: refused by where it resolves, as well as the link that leaves."""
    root = write_tree(tmp_path / "p", PROJECT)
    (tmp_path / "outside.txt").write_text("x")
    os.symlink(str(tmp_path), root / "escape")  # absolute: refused
    os.symlink("escape/outside.txt", root / "through.py")  # lexically inside, really not
    with pytest.raises(UserError) as e:
        list_entries(root)
    assert any("through.py" in p and "resolves to" in p for p in e.value.problems)


def test_sockets_fifos_and_devices_are_refused_by_path(tmp_path):
    root = write_tree(tmp_path / "p", PROJECT)
    os.mkfifo(root / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    try:
        with pytest.raises(UserError) as e:
            list_entries(root)
    finally:
        sock.close()
    assert sorted(e.value.problems) == [
        f"workdir: {root / 'pipe'} is a FIFO, which cannot be packed. Move it out of the "
        "folder or list it in .ddpjobignore",
        f"workdir: {root / 'sock'} is a socket, which cannot be packed. Move it out of the "
        "folder or list it in .ddpjobignore",
    ]


def test_a_device_is_refused(tmp_path):
    root = write_tree(tmp_path / "p", PROJECT)
    try:
        os.mknod(root / "null", 0o600 | 0o020000, os.makedev(1, 3))  # a character device
    except PermissionError:
        pytest.fail("this test needs CAP_MKNOD (root), as make test has")
    with pytest.raises(UserError, match=r"null is a device"):
        list_entries(root)


# ---------------------------------------------------------------------------------------------
# The archive


def test_the_same_files_give_the_same_archive_and_digest(tmp_path):
    a = write_tree(tmp_path / "a", PROJECT)
    b = write_tree(tmp_path / "elsewhere" / "b", PROJECT)
    os.utime(b / "train.py", (1, 1))  # other mtimes, owners' bits, folder names: same digest
    os.chmod(b / "data" / "words.txt", 0o600)
    with pack(a) as one, pack(b) as two, pack(a) as again:
        assert one.digest == two.digest == again.digest
        assert one.read_bytes() == again.read_bytes()
        assert one.digest.startswith("sha256:") and len(one.digest) == 7 + 64
        assert pod.tar_digest(io.BytesIO(one.read_bytes())) == one.digest
        members = _members(one.path)
        info = members["train.py"][0]
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (
            0, 0, 0, "", "", 0o644,
        )  # fmt: skip
        assert list(members) == sorted(members)
    (b / "train.py").write_text("import helpers.util  # edited\n")
    with pack(a) as one, pack(b) as two:
        assert one.digest != two.digest
    (b / "train.py").write_text(PROJECT["train.py"])
    os.chmod(b / "train.py", 0o755)  # the executable bit is content
    with pack(a) as one, pack(b) as two:
        assert one.digest != two.digest
        assert _members(two.path)["train.py"][0].mode == 0o755


def test_the_digest_does_not_depend_on_the_compression(tmp_path):
    root = write_tree(tmp_path / "p", PROJECT)
    with pack(root) as archive:
        raw = io.BytesIO()
        raw.write(gzip.compress(gzip.decompress(archive.read_bytes()), compresslevel=1))
        assert raw.getvalue() != archive.read_bytes()
        assert pod.tar_digest(io.BytesIO(raw.getvalue())) == archive.digest


def test_too_big_names_the_size_the_five_largest_files_and_the_fix(tmp_path):
    files = {f"blob{i}.bin": os.urandom(1000 * (i + 1)) for i in range(7)}
    root = write_tree(tmp_path / "p", {**PROJECT, **files})
    with pack(root) as archive:
        check_fits(archive, archive.size_bytes, "a ConfigMap")  # at the limit: fits
        with pytest.raises(UserError) as e:
            check_fits(archive, 4096, "a ConfigMap")
    (line,) = e.value.problems
    assert line.startswith(f"workdir: {root} packs to ")
    assert "over the 4.0 KiB a ConfigMap holds (got 11 files" in line
    assert "largest: blob6.bin (6.8 KiB), blob5.bin (5.9 KiB), blob4.bin (4.9 KiB), " in line
    assert "blob2.bin (2.9 KiB))" in line and "blob1.bin" not in line
    assert line.endswith("or set workdir_store: s3://BUCKET/PREFIX")


def test_the_summary_line_says_files_size_digest_commit_and_where(repo):
    with pack(repo / "project") as archive:
        line = summary(archive, "ConfigMap default/job-workdir")
    assert line.startswith("workdir: 4 files, ")
    assert f"sha256:{archive.digest[7:19]}, git " in line and "(dirty)" not in line
    assert line.endswith(" -> ConfigMap default/job-workdir")


# ---------------------------------------------------------------------------------------------
# The pod's half: check and unpack


def _roundtrip(tmp_path: Path) -> tuple[bytes, str, Path]:
    root = write_tree(tmp_path / "p", PROJECT)
    os.chmod(root / "train.py", 0o755)
    os.symlink("helpers/util.py", root / "util_link.py")
    with pack(root) as archive:
        return archive.read_bytes(), archive.digest, tmp_path / "into"


def test_install_unpacks_the_files_and_links_once(tmp_path):
    data, digest, into = _roundtrip(tmp_path)
    assert pod.install(data, digest, into) == (5, True)
    assert (into / "helpers" / "util.py").read_text() == "VALUE = 1\n"
    assert os.readlink(into / "util_link.py") == "helpers/util.py"
    assert (into / "train.py").stat().st_mode & 0o777 == 0o755
    assert (into / "data" / "words.txt").stat().st_mode & 0o777 == 0o644
    assert (into / pod.MARKER).read_text() == digest + "\n"
    # A container restarted in place: the folder keeps what the run wrote beside the code.
    (into / "out.txt").write_text("written by the run")
    assert pod.install(b"", digest, into) == (0, False)
    assert (into / "out.txt").exists()


def test_a_digest_mismatch_writes_nothing(tmp_path):
    data, digest, into = _roundtrip(tmp_path)
    other = "sha256:" + "0" * 64
    with pytest.raises(pod.WorkdirError) as e:
        pod.install(data, other, into)
    assert str(e.value) == (
        f"the archive's digest is {digest}, the job names {other}: it changed after the job "
        "was submitted. Submit the job again"
    )
    assert not into.exists() or list(into.iterdir()) == []


def _crafted(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, content in members:
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return buf.getvalue()


def _file(name: str, content: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), content


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _dev(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, None


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([_file("/etc/evil")], "/etc/evil: an absolute path"),
        ([_file("../evil")], "../evil: a path with .."),
        ([_file("a/../../evil")], "a/../../evil: a path with .."),
        ([_file("ok"), _link("out", "../../etc/passwd")], "out: a symlink that leaves the folder"),
        ([_link("abs", "/etc/passwd")], "abs: a symlink to an absolute path (/etc/passwd)"),
        ([_link("d", "."), _link("up", "d/..")], "up: a symlink that leaves the folder (d/..)"),
        ([_link("lib", "sub"), _file("lib/evil")], "lib/evil: under a symlink"),
        ([_link("hard", "ok", tarfile.LNKTYPE)], "hard: not a regular file or a symlink"),
        ([_dev("null")], "null: not a regular file or a symlink"),
        ([_file("twice"), _file("twice")], "twice: in the archive twice"),
    ],
)
def test_unpacking_refuses_what_could_reach_outside(tmp_path, members, why):
    data = _crafted(*members)
    into = tmp_path / "into"
    with pytest.raises(pod.WorkdirError) as e:
        pod.install(data, pod.tar_digest(io.BytesIO(data)), into)
    assert str(e.value).startswith(why)
    assert list(into.iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_garbage_is_not_an_archive(tmp_path):
    data = b"not a tar.gz at all"
    with pytest.raises(pod.WorkdirError, match="not a readable"):
        pod.unpack(io.BytesIO(data), tmp_path / "into")


# ---------------------------------------------------------------------------------------------
# python -m trainer.workdir, as the pod runs it


def test_the_entrypoint_unpacks_then_runs_the_command_in_the_folder(tmp_path):
    data, digest, into = _roundtrip(tmp_path)
    archive = tmp_path / "workdir.tar.gz"
    archive.write_bytes(data)
    script = (
        "import os, helpers.util; "
        "print(os.getcwd(), helpers.util.VALUE, open('data/words.txt').read().strip(), "
        "os.environ['PYTHONPATH'])"
    )
    env = {**os.environ, "PYTHONPATH": "/elsewhere"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.workdir", str(archive), "--digest", digest,
         "--into", str(into), "--", sys.executable, "-c", script],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(into), "1", "hello", f"{into}:/elsewhere"]
    assert proc.stderr.startswith(f"workdir: 5 files, {len(data)} bytes, {digest} from ")


def test_the_entrypoint_fails_with_one_line_and_exit_2(tmp_path):
    data, digest, into = _roundtrip(tmp_path)
    archive = tmp_path / "workdir.tar.gz"
    archive.write_bytes(data)
    wrong = "sha256:" + "f" * 64
    code = pod.main([str(archive), "--digest", wrong, "--into", str(into)])
    assert code == 2
    assert pod.main([str(tmp_path / "missing"), "--digest", digest, "--into", str(into)]) == 2


def test_a_file_that_changes_between_listing_and_packing_is_refused(tmp_path):
    from controller.workdir import _write

    root = write_tree(tmp_path / "p", PROJECT)
    entries, _ = list_entries(root)
    with open(root / "data" / "words.txt", "a") as f:  # a writer, after the listing
        f.write("more\n")
    with pytest.raises(UserError) as e:
        _write(root, entries, tmp_path / "out.tar.gz")
    (line,) = e.value.problems
    assert line.startswith(f"workdir: {root / 'data' / 'words.txt'} changed while it was packed")
    assert "(got 6 bytes when listed, 11 now)" in line
