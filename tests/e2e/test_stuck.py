"""A job that hangs or crawls on the local cluster's real node, and heals itself: rank 1's own data
set (a task of a user project that the image does not hold, shipped as the job's workdir,
tests/e2e/hangtask.py) hangs once, in the job's first run, and in the PyTorchJob rank 1 also
computes slowly every step. For a
PyTorchJob (with `wait` and `status`) and a TrainJob (with `logs -f`): the hang is named with its
frame within 60 s of it, once; the job restarts itself (`watchdog.restart_after_s`) within that
setting plus a minute of the verdict, resumes at its last checkpoint and ends at exactly
`max_steps`; `wait`, `status` and the goodput ledger name the restart's cause, and the node the
stuck rank ran on is recorded on the job (its pods run as k8s/rbac.yaml's `ddpjob-trainer`). The
PyTorchJob's slow rank is a straggler in `status`, with its pod and node.

The watchdog's and the restart's rules on real processes: tests/trainer/test_watchdog.py,
test_restart.py; what the controller makes of the events: tests/controller/test_stuck_unit.py,
test_heal_unit.py; a node left behind: tests/e2e/test_heal.py."""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest

from localkube.node import kubelet
from tests.e2e import hangtask
from tests.e2e.helpers import (
    Background,
    ddpjob,
    events,
    project,
    trainer_account,
    write_spec,
)
from trainer.contract import split_rank

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: The trainer's default: a rank is named well within this of its hang.
NAMED_WITHIN_S = 60
#: The tests' restart setting (the default is 120 s): the job restarts this long after the
#: verdict, and is back within it plus a minute.
RESTART_AFTER_S = 15
MAX_STEPS, EVERY_STEPS, BATCH = 40, 10, 16
#: The project's file in the pods (the workdir's path), and the line of _stuck_here's sleep.
TASK_IN_POD = "/workdir/hangtask.py"
_SOURCE, _FIRST = inspect.getsourcelines(hangtask._stuck_here)
HANG_LINE = _FIRST + next(i for i, text in enumerate(_SOURCE) if "time.sleep" in text)
#: What the verdict says of a rank 1 whose data set hangs as it draws the next step's batch,
#: after its part of the gradient all-reduce was launched: it is behind, and rank 0 waits.
VERDICT = (
    "stuck: rank 1 is behind, in the gradient all-reduce, while rank 0 waits in the gradient "
    "all-reduce"
)
WHERE = f"rank 1 is at {TASK_IN_POD}:{HANG_LINE}, in _stuck_here"
CAUSE = f"stuck: rank 1 in hangtask.py:_stuck_here on node {kubelet.NODE_NAME}"


def _spec(cluster, tmp_path: Path, name: str, namespace: str, task_args: dict, **fields) -> Path:
    """Two nodes of the project's task, shipped as the job's workdir; rank 1's data set hangs
    once (its marker on the claim every pod mounts) at its ``hang_at``-th read; the process
    group's timeout far beyond the test, so that the restart is what ends the hang."""
    args = {"image_size": 16, "hang_rank": 1, "hang_s": 1200, "hang_once": f"/ckpt/{name}.hung",
            **task_args}  # fmt: skip
    trainer = {
        "task": "hangtask:build", "task_args": args, "batch_size": BATCH, "timeout_s": 1800,
        "watchdog": {"restart_after_s": RESTART_AFTER_S},
    }  # fmt: skip
    return write_spec(
        cluster, tmp_path, name, namespace, nodes=2, max_steps=MAX_STEPS, log_every=2,
        every_steps=EVERY_STEPS, env={"OMP_NUM_THREADS": "1"}, trainer=trainer,
        workdir=project(tmp_path, Path(hangtask.__file__)),
        service_account=trainer_account(cluster, namespace), **fields,
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
    """When rank 1's data set started to hang, as it said in its pod's log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in cluster.pod_log_lines(namespace, pod):
            _, text = split_rank(line)  # a TrainJob's lines carry their rank's name
            if text.startswith(hangtask.HANGS):
                return float(text.removeprefix(hangtask.HANGS))
        time.sleep(0.2)
    raise AssertionError(f"{pod} did not say that it hangs")


def _named_within_the_limit(cluster, namespace, pod, seen_at: float) -> None:
    started = _hang_started(cluster, namespace, pod)
    assert 0 < seen_at - started <= NAMED_WITHIN_S, (started, seen_at)


def _status(cluster, name: str, namespace: str, *args: str) -> str:
    r = ddpjob(cluster, "status", name, "-n", namespace, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _healed(cluster, name: str, namespace: str, rank0_log: str, verdict_at: float, api: str):
    """The job restarted itself once, with its cause, within the setting plus a minute of the
    verdict; its second run resumed at the first run's last checkpoint and ended at exactly
    ``max_steps``; ``status`` and the ledger name the restart and the node it was on."""
    dones = events(rank0_log, "done")
    assert [d["reason"] for d in dones] == ["restart", "completed"], dones
    assert dones[0]["cause"] == CAUSE and dones[1]["step"] == MAX_STEPS
    # The log of each run: up to the restart's done event, and after it.
    cut = rank0_log.index('"reason": "restart"')
    before, after = rank0_log[:cut], rank0_log[cut:]
    (resume,) = [e for e in events(after, "resume") if e.get("path")]
    assert resume["step"] == max(e["step"] for e in events(before, "checkpoint"))
    assert resume["step"] % EVERY_STEPS == 0 and resume["step"] < dones[0]["step"]
    resumed = [e["step"] for e in events(after, "train")]
    assert resumed == list(range(resume["step"] + 2, MAX_STEPS + 1, 2)), resumed
    first, second = events(rank0_log, "goodput")[-1]["runs"]
    assert (first["end"], first["cause"]) == ("restart", CAUSE)
    assert (second["end"], second["start_step"]) == ("completed", resume["step"])
    assert first["kept_step"] == resume["step"] and first["lost_steps"] > 0
    # Back within the setting plus a minute: the second run's processes started by then.
    assert second["launched_at"] - verdict_at <= RESTART_AFTER_S + 60, (second, verdict_at)

    status = _status(cluster, name, namespace, "--api", api)
    assert f"restarted itself at step {dones[0]['step']}: {CAUSE}" in status, status
    assert f"fault on node {kubelet.NODE_NAME}: 1 of this job there ({CAUSE})" in status, status
    st = json.loads(_status(cluster, name, namespace, "--api", api, "-o", "json"))
    assert [r["cause"] for r in st["restarts"]] == [CAUSE]
    assert st["nodes"]["avoided"] == []  # one fault: the default avoids a node at two


def test_a_pytorchjobs_hung_rank_is_named_and_the_job_restarts_itself_from_its_checkpoint(
    real_node, namespace, tmp_path
):
    name = "hangs"
    # Rank 1 computes 0.3 s a step more (a straggler from the third log window, step 6), and
    # its data set hangs at its 24th batch.
    args = {"slow_rank": 1, "slow_s": 0.3, "hang_at": 23 * BATCH + 1}
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
        st = json.loads(_status(real_node, name, namespace, "-o", "json"))
        (lags,) = st["stragglers"]
        assert (lags["rank"], lags["pod"], lags["node"]) == (1, worker, kubelet.NODE_NAME)
        assert lags["factor"] >= 1.5 and lags["step_time_s"] >= 0.3

        verdict, seen_at = _line_in(wait.err_path, VERDICT, 180, "wait")
        _named_within_the_limit(real_node, namespace, worker, seen_at)
        assert verdict.startswith(f"job {name}: {VERDICT} (no progress for ")
        assert verdict.endswith(f"{WHERE} (pod {worker}, node {kubelet.NODE_NAME})")
        status = _status(real_node, name, namespace)
        assert f"{VERDICT} (no progress for " in status and WHERE in status

        restart, _ = _line_in(wait.err_path, "restarts itself", RESTART_AFTER_S + 60, "wait")
        assert restart.startswith(f"job {name}: restarts itself at step ")
        assert f": {CAUSE} (exit 138; " in restart
        code, _, err = wait.result(timeout=400)  # to the end of the second run
    finally:
        wait.stop()
    assert code == 0, err
    assert sum(VERDICT in line for line in err.splitlines()) == 1, err  # said once
    rank0 = "\n".join(real_node.pod_log_lines(namespace, f"{name}-master-0"))
    _healed(real_node, name, namespace, rank0, seen_at, "pytorchjob")


def test_a_trainjobs_hung_rank_is_named_and_the_job_restarts_itself_from_its_checkpoint(
    real_node, namespace, tmp_path
):
    name = "tj-hangs"
    spec = _spec(real_node, tmp_path, name, namespace, {"hang_at": 13 * BATCH + 1}, api="trainjob")
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
        (rank0,) = [p["metadata"]["name"] for p in pods if "-node-0-0" in p["metadata"]["name"]]
        _named_within_the_limit(real_node, namespace, rank1, seen_at)
        followed, _ = _line_in(follow.err_path, VERDICT, 60, "logs -f")
        assert followed.startswith(f"logs: {VERDICT}") and WHERE in followed
        restart, _ = _line_in(follow.err_path, "restarts itself", RESTART_AFTER_S + 60, "logs -f")
        assert restart.startswith("logs: restarts itself at step ") and CAUSE in restart
        code, _, err = wait.result(timeout=400)
        assert code == 0, err
        _, out, _ = follow.result(timeout=120)
    finally:
        wait.stop()
        follow.stop()
    assert '"culprit": 1' in out  # the event itself, on stdout
    # What logs -f printed is rank 0's log through its restart in place.
    assert [d["reason"] for d in events(out, "done")] == ["restart", "completed"]
    rank0_log = "\n".join(real_node.pod_log_lines(namespace, rank0))
    _healed(real_node, name, namespace, rank0_log, seen_at, "trainjob")
