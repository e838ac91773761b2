"""tools.background: make test's offline tests run in a cpu cgroup of the lowest weight, which
holds every process they start, sessions of their own included (a niceness does not, with
autogroups)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import background

REPO = Path(__file__).resolve().parents[1]


def _through_background(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.background", "--", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _cpu_cgroup(proc_cgroup: str) -> str:
    """The cpu controller's cgroup in a /proc/PID/cgroup text (v1's ``cpu`` line, else v2's)."""
    lines = [line.split(":", 2) for line in proc_cgroup.splitlines()]
    for _, controllers, path in lines:
        if "cpu" in controllers.split(","):
            return path
    return next(path for _, controllers, path in lines if controllers == "")


def _root_cgroup_procs() -> Path:
    """The cpu controller's root cgroup's ``cgroup.procs`` (v1's, else v2's)."""
    v1 = background.CGROUP_ROOT / "cpu" / "cgroup.procs"
    return v1 if v1.is_file() else background.CGROUP_ROOT / "cgroup.procs"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a cgroup needs root, which make test has")
@pytest.mark.parametrize("session", ["same", "setsid"])
def test_the_command_and_a_session_of_its_own_run_in_the_background_cgroup(session):
    """From a shell in the root cgroup (make test's offline tests, this one included, already
    run in the background one), the command lands in the background cgroup."""
    command = "setsid cat /proc/self/cgroup" if session == "setsid" else "cat /proc/self/cgroup"
    script = (
        f"echo $$ > {_root_cgroup_procs()} && cat /proc/self/cgroup && echo --- && "
        f"exec {sys.executable} -m tools.background -- {command}"
    )
    r = subprocess.run(
        ["sh", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.split("---\n")
    assert _cpu_cgroup(before) == "/", before
    assert _cpu_cgroup(after) == f"/{background.NAME}", after
    v1 = background.CGROUP_ROOT / "cpu" / background.NAME / "cpu.shares"
    v2 = background.CGROUP_ROOT / background.NAME / "cpu.weight"
    if v1.is_file():
        assert int(v1.read_text()) == background.V1_SHARES
    else:
        assert int(v2.read_text()) == background.V2_WEIGHT


def test_a_v1_cpu_controller_gets_the_group_its_weight_and_the_process(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.shares").write_text("1024\n")
    group = background.enter(tmp_path)
    assert group == tmp_path / "cpu" / background.NAME
    assert (group / "cpu.shares").read_text() == f"{background.V1_SHARES}\n"
    assert (group / "cgroup.procs").read_text() == f"{os.getpid()}\n"


def test_a_v2_hierarchy_gets_the_cpu_controller_enabled_and_a_low_weight(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    group = background.enter(tmp_path)
    assert group == tmp_path / background.NAME
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu\n"
    assert (group / "cpu.weight").read_text() == f"{background.V2_WEIGHT}\n"
    assert (group / "cgroup.procs").read_text() == f"{os.getpid()}\n"


def test_without_a_cgroup_to_use_the_command_runs_as_it_is(tmp_path):
    assert background.enter(tmp_path) is None  # no cpu controller there
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.shares").write_text("1024\n")
    (tmp_path / "cpu" / background.NAME).write_text("")  # a controller, but no group to be made
    assert background.enter(tmp_path) is None
    r = _through_background(sys.executable, "-c", "print('ran')")
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr


def test_no_command_is_a_usage_error_and_a_missing_one_says_so():
    r = _through_background()
    assert r.returncode == 2 and "usage: python -m tools.background -- COMMAND" in r.stderr
    r = _through_background("no-such-command-here")
    assert r.returncode == 127 and "cannot run no-such-command-here" in r.stderr
