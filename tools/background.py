"""Run a command in the background of the machine's CPUs: in a cpu cgroup of its own of a low
weight, so that it takes what the rest of the machine leaves idle and little more.

    python -m tools.background -- nice -n 19 pytest ...

``nice`` alone does not do this on Linux with autogroups (``kernel.sched_autogroup_enabled``, the
default of most distributions): a niceness counts only within the process's session, and each
session competes with the others at full weight. A test that starts a process in a session of its
own (torchrun's workers, a process group to kill) gives it full weight again; the local cluster's
pods (the ``kubepods`` cgroup) and its daemons then share the CPUs with them as equals. A cgroup
holds every process the command starts, whatever their sessions.

Without a cgroup this process may write (not root, no cpu controller), the command runs as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The cgroup, under the cpu controller's root (v1) or the unified root (v2).
NAME = "ddpjob-background"
#: cgroup v1 ``cpu.shares`` (a nice-0 task weighs 1024, the kubelet's ``kubepods`` as many as
#: the node's CPUs times 1024) and cgroup v2 ``cpu.weight`` (default 100): an eighth of a nice-0
#: task. Not the least there is: at 10 shares, tests of four processes that must all progress
#: (gloo's collectives) starved past their timeouts while the cluster tests kept both CPUs busy.
V1_SHARES = 128
V2_WEIGHT = 12

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _v1(root: Path) -> Path | None:
    cpu = root / "cpu"
    if not (cpu / "cpu.shares").is_file():
        return None
    group = cpu / NAME
    group.mkdir(exist_ok=True)
    (group / "cpu.shares").write_text(f"{V1_SHARES}\n")
    return group


def _v2(root: Path) -> Path | None:
    if not (root / "cgroup.controllers").is_file():
        return None
    if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
        (root / "cgroup.subtree_control").write_text("+cpu\n")
    group = root / NAME
    group.mkdir(exist_ok=True)
    (group / "cpu.weight").write_text(f"{V2_WEIGHT}\n")
    return group


def enter(root: Path = CGROUP_ROOT) -> Path | None:
    """Move this process into the background cgroup (made if missing); the cgroup, or None
    where there is none this process may use."""
    for make in (_v1, _v2):
        try:
            group = make(root)
            if group is not None:
                (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
                return group
        except OSError:
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m tools.background -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    enter()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"tools.background: cannot run {argv[0]} (got {e.strerror})", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
