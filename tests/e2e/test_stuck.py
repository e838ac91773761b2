"""A job that hangs or crawls on the local cluster's real node, with the trainer's defaults: a rank
that blocks before the step's all-reduce is named by `wait` (and `logs -f`, and `status`) with the
frame it blocks in, within 60 s of the hang, for a PyTorchJob and a TrainJob; a rank slowed on
purpose is flagged as a straggler, with its pod and node, in `status`.

The tests' task (tests/trainer/tasks.py) runs from the claim, as a user mounts code: rank 1 sleeps
in ``hang_here`` at a chosen step (and says when it started, on stderr), or a little every step.
The watchdog's rules on real processes: tests/trainer/test_watchdog.py; what the controller makes
of the events: tests/controller/test_stuck_unit.py."""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest

from localkube.node import kubelet
from tests.e2e.helpers import REPO, Background, ddpjob, plugin_on_claim, write_spec
from tests.trainer import tasks

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: The trainer's default: a rank is named well within this of its hang.
NAMED_WITHIN_S = 60
#: The plug-in's path in the pods, and the line of hang_here's sleep.
TASKS_IN_POD = "/ckpt/plugins/tasks.py"
_SOURCE, _FIRST = inspect.getsourcelines(tasks.hang_here)
HANG_LINE = _FIRST + next(i for i, text in enumerate(_SOURCE) if "time.sleep" in text)
#: What the verdict says of a rank 1 that hangs before the gradient all-reduce.
VERDICT = "stuck: rank 1 is not in the gradient all-reduce that rank 0 waits in"
WHERE = f"rank 1 is at {TASKS_IN_POD}:{HANG_LINE}, in hang_here"


def _spec(cluster, tmp_path: Path, name: str, namespace: str, task_args: dict, **fields) -> Path:
    """Two nodes of the tests' task from the claim; the process group's timeout far beyond the
    test, so the job hangs until it is deleted."""
    env = plugin_on_claim(cluster, namespace, REPO / "tests" / "trainer" / "tasks.py")
    trainer = {"task": "tasks:build", "task_args": task_args, "batch_size": 16, "timeout_s": 1800}
    return write_spec(
        cluster, tmp_path, name, namespace, nodes=2, max_steps=200, log_every=2, every_steps=0,
        env=env, trainer=trainer, **fields,
    )  # fmt: skip


def _line_in(path: Path, text: str, timeout_s: float, what: str) -> tuple[str, float]:
    """The first line of the file ``path`` (a background command's output) that contains
    ``text``, and when it was first seen there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if text in line:
                return line, time.time()
        time.sleep(0.2)
    raise AssertionError(f"{what} did not say {text!r} in {timeout_s:.0f} s:\n{path.read_text()}")


def _hang_started(cluster, namespace: str, pod: str, timeout_s: float = 30) -> float:
    """When rank 1's task started to hang, as it said in its pod's log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in cluster.pod_log_lines(namespace, pod):
            if line.startswith(tasks.HANGS):
                return float(line.removeprefix(tasks.HANGS))
        time.sleep(0.2)
    raise AssertionError(f"{pod} did not say that it hangs")


def _named_within_the_limit(cluster, namespace, pod, seen_at: float) -> None:
    started = _hang_started(cluster, namespace, pod)
    assert 0 < seen_at - started <= NAMED_WITHIN_S, (started, seen_at)


def _status(cluster, name: str, namespace: str) -> str:
    r = ddpjob(cluster, "status", name, "-n", namespace)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_pytorchjobs_hung_rank_is_named_by_wait_and_status_and_its_straggler_flagged(
    real_node, namespace, tmp_path
):
    name = "hangs"
    # Rank 1 sleeps 0.3 s every step (a straggler from the third log window, step 6), then
    # hangs at its 24th step.
    args = {"slow_rank": 1, "slow_s": 0.3, "hang_rank": 1, "hang_call": 24, "hang_s": 1200}
    spec = _spec(real_node, tmp_path, name, namespace, args)
    r = ddpjob(real_node, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    wait = Background(real_node, tmp_path, "wait", "wait", name, "-n", namespace)
    try:
        straggler, _ = _line_in(wait.err_path, "straggler: rank 1", 400, "wait")
        worker = f"{name}-worker-0"
        assert straggler.startswith(f"job {name}: straggler: rank 1 (pod {worker}, node ")
        status = _status(real_node, name, namespace)
        assert f"straggler: rank 1 (pod {worker}, node {kubelet.NODE_NAME}) is busy " in status
        st = json.loads(ddpjob(real_node, "status", name, "-n", namespace, "-o", "json").stdout)
        (lags,) = st["stragglers"]
        assert (lags["rank"], lags["pod"], lags["node"]) == (1, worker, kubelet.NODE_NAME)
        assert lags["factor"] >= 1.5 and lags["step_time_s"] >= 0.3

        verdict, seen_at = _line_in(wait.err_path, VERDICT, 180, "wait")
        _named_within_the_limit(real_node, namespace, worker, seen_at)
        assert verdict.startswith(f"job {name}: {VERDICT} (no progress for ")
        assert verdict.endswith(f"{WHERE} (pod {worker}, node {kubelet.NODE_NAME})")
        status = _status(real_node, name, namespace)
        assert f"{VERDICT} (no progress for " in status and WHERE in status
    finally:
        ddpjob(real_node, "delete", name, "-n", namespace, "--wait", timeout=150)
        _, _, err = wait.result(timeout=60)
    assert sum(VERDICT in line for line in err.splitlines()) == 1, err  # said once


def test_a_trainjobs_hung_rank_is_named_by_wait_and_logs_follow(real_node, namespace, tmp_path):
    name = "tj-hangs"
    args = {"hang_rank": 1, "hang_call": 10, "hang_s": 1200}
    spec = _spec(real_node, tmp_path, name, namespace, args, api="trainjob")
    r = ddpjob(real_node, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    wait = Background(real_node, tmp_path, "wait", "wait", name, "-n", namespace)
    follow = Background(real_node, tmp_path, "follow", "logs", name, "-n", namespace, "-f")
    try:
        verdict, seen_at = _line_in(wait.err_path, VERDICT, 400, "wait")
        assert verdict.startswith(f"job {name}: {VERDICT} (no progress for ")
        assert f"{WHERE} (pod {name}-node-0-1" in verdict  # the pod's hostname
        pods = json.loads(
            real_node.kubectl(
                "get", "pods", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}",
                "-o", "json",
            ).stdout
        )["items"]  # fmt: skip
        (rank1,) = [p["metadata"]["name"] for p in pods if "-node-0-1" in p["metadata"]["name"]]
        _named_within_the_limit(real_node, namespace, rank1, seen_at)
        followed, _ = _line_in(follow.err_path, VERDICT, 60, "logs -f")
        assert followed.startswith(f"logs: {VERDICT}") and WHERE in followed
        assert '"culprit": 1' in follow.out_path.read_text()  # the event itself, on stdout
    finally:
        ddpjob(real_node, "delete", name, "-n", namespace, "--api", "trainjob", "--wait",
               timeout=150)  # fmt: skip
        wait.result(timeout=60)
        follow.result(timeout=60)
