"""Faults on the local control plane: a pod process killed (-9), the API server restarted. The
job recovers from its checkpoint, `wait` and `logs -f` reconnect, and a followed log equals what
the pods printed: no line lost, none twice.

The pods run on the real node, in containers of this checkout's image; ``kill -9`` hits a
container's PID 1 from outside. The checkpoints live on a local PersistentVolume that uid 1000
writes (fsGroup) and the re-created pods read back. A pod deleted (the kubelet's SIGTERM and its
grace period), its job checkpointing to the local S3 server with no volume for its checkpoints:
test_metrics_tracking.py's job (a PyTorchJob), test_fsdp_example.py (every rank's shard) and
test_trainjob.py (a TrainJob)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from controller.jobs.read.goodput import PARTS
from localkube.handle import wait_until
from localkube.node import volumes
from tests.e2e.helpers import (
    CLAIM,
    Background,
    assert_same_lines,
    ddpjob,
    events,
    latest_step,
    paced,
    paced_spec,
    restart_apiserver,
    where_things_stand,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MAX_STEPS = 160


def _start_job(cluster, namespace, tmp_path, name, every_steps: int = 10):
    # Paced (0.1 s a step): at least 13 s of training left when the fault comes at step 30.
    fields = paced(cluster, namespace, 0.1)
    spec = write_spec(
        cluster, tmp_path, name, namespace, max_steps=MAX_STEPS, every_steps=every_steps, **fields
    )
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stderr
    follow0 = Background(cluster, tmp_path, "logs-rank0", "logs", name, "-n", namespace, "-f")
    follow1 = Background(
        cluster, tmp_path, "logs-rank1", "logs", name, "-n", namespace, "-f", "--rank", "1"
    )
    return follow0, follow1


def _wait_succeeds(cluster, namespace: str, name: str, timeout_s: int, *follows) -> None:
    """``wait`` for the job to succeed; if it does not, the failure carries where the pods stand
    and the tail of each followed log."""
    w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", str(timeout_s),
               timeout=timeout_s + 20)  # fmt: skip
    assert w.returncode == 0, "\n".join([
        w.stdout + w.stderr, where_things_stand(cluster, namespace),
        *(f"{path.name}: {path.read_text()[-3000:]}"
          for f in follows for path in (f.out_path, f.err_path)),
    ])  # fmt: skip


def _final_step(out: str) -> int:
    done = events(out, "done")
    assert done, "no done event"
    return done[-1]["step"]


def _checkpoints_written_by_uid_1000(cluster, namespace: str, name: str) -> None:
    """The real node's checkpoints: on the PersistentVolume, files of uid 1000 and the pod's
    fsGroup 1000 (the kubelet handed the volume to that group)."""
    folder = volumes.host_path(namespace, CLAIM) / name
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files, f"no checkpoint under {folder}"
    assert {(p.stat().st_uid, p.stat().st_gid) for p in files} == {(1000, 1000)}


def test_kill_9_of_a_worker_is_retried_and_resumes_from_its_checkpoint(
    real_node, namespace, tmp_path
):
    cluster, name = real_node, "kill9"
    # Checkpoints at steps 30 and 60; the kill comes at step 35 or a little later, between the
    # two, so the master trains steps that no checkpoint keeps (a kill in the step right after
    # a checkpoint would cost none).
    follow0, follow1 = _start_job(cluster, namespace, tmp_path, name, every_steps=30)
    try:
        wait_until(
            "training past step 35, the checkpoint of step 30 written",
            lambda: (
                latest_step(cluster, name, namespace) >= 35
                and 30 in _saved_steps(cluster, name, namespace)
            ),
            90,
            0.5,
        )
        worker = cluster.running_pod(name, namespace, "worker-0")
        assert worker is not None
        pid = cluster.pod_pid(namespace, worker)
        assert pid, "no host pid for the worker"
        os.kill(pid, signal.SIGKILL)

        # Two restarts follow (the worker's, then the master's when it finds its peer lost),
        # each a container start and a torch import, several times slower beside make test's
        # other tests than alone.
        _wait_succeeds(cluster, namespace, name, 300, follow0, follow1)
        code0, out0, err0 = follow0.result(60)
        code1, out1, err1 = follow1.result(60)
    finally:
        follow0.stop()
        follow1.stop()
    assert code0 == 0 and code1 == 0, err0 + err1
    # The killed worker's pod was re-created (new UID). The master lost its peer, exited 138
    # (retryable) and was retried too: rank 0's log shows both attempts, the second resumed.
    done = events(out0, "done")
    assert [d["reason"] for d in done] == ["peer_lost", "completed"], err0
    assert len(events(out0, "start")) == 2, err0
    resumed = events(out0, "resume")
    assert resumed and resumed[-1]["step"] >= 10
    assert _final_step(out0) == MAX_STEPS
    assert "following kill9-master-0 (attempt 2)" in err0
    assert_same_lines(out1, cluster.pod_log_lines(namespace, f"{name}-worker-0"), "rank 1")
    assert_same_lines(out0, cluster.pod_log_lines(namespace, f"{name}-master-0"), "rank 0")
    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded" and st["progress"]["step"] == MAX_STEPS
    _checkpoints_written_by_uid_1000(cluster, namespace, name)

    # What the kill cost (status -o json's goodput, from rank 0's ledger): the master's first
    # run trained past the checkpoint it was resumed from for nothing; every moment of the wall
    # time is in one part.
    g = st["goodput"]
    killed, last = events(out0, "goodput")[-1]["runs"]
    assert (g["runs"], g["sources"]["trainer"], last["end"]) == (2, "ledger", "completed")
    assert killed["kept_step"] == resumed[-1]["step"] and killed["last_step"] >= 30
    assert g["lost_steps"] == killed["last_step"] - killed["kept_step"] == killed["lost_steps"]
    assert g["lost_s"] >= 0.1 * g["lost_steps"]  # each step sleeps 0.1 s
    assert g["productive_s"] >= 0.1 * MAX_STEPS and g["other_s"] > 0  # other: the restart
    assert sum(g[k] for k in PARTS) == pytest.approx(g["wall_s"], abs=0.05)
    r = ddpjob(cluster, "goodput", name, "-n", namespace)
    assert r.returncode == 0, r.stderr
    print(r.stdout)  # the account, as a user reads it (pytest -rP shows it)
    assert g["lost_steps"] > 0 and f"{g['lost_steps']} step(s) trained again" in r.stdout


def _saved_steps(cluster, name: str, namespace: str) -> set[int]:
    """The steps of the checkpoints rank 0's current log says it wrote."""
    got = cluster.kubectl("logs", f"{name}-master-0", "-n", namespace, "-c", "pytorch", check=False)
    return {e["step"] for e in events(got.stdout, "checkpoint")}


@pytest.mark.disruptive
def test_wait_and_logs_follow_ride_out_an_api_server_restart(real_node, namespace, tmp_path):
    cluster, name = real_node, "apirestart"
    # Long enough that the job is still training when the API server comes back (checked
    # below), so wait and logs -f must reconnect to see it end.
    max_steps = 400  # at 0.1 s a step: ends well after the API server is back (checked below)
    spec = paced_spec(
        cluster, tmp_path, name, namespace, max_steps=max_steps, step_s=0.1,
        every_steps=200, log_every=20,
    )  # fmt: skip
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stderr
    waiter = Background(cluster, tmp_path, "wait", "wait", name, "-n", namespace)
    follower = Background(cluster, tmp_path, "logs", "logs", name, "-n", namespace, "-f")
    try:
        wait_until(
            "training past step 20", lambda: latest_step(cluster, name, namespace) >= 20, 90, 0.5
        )
        down_s = restart_apiserver(cluster, down_s=2.0)
        print(f"API server away for {down_s:.1f} s")
        assert down_s >= 2.0, "the API server never stopped answering: no outage was tested"
        assert latest_step(cluster, name, namespace) < max_steps, "it ended during the outage"
        code_w, out_w, err_w = waiter.result(150)
        code_f, out_f, err_f = follower.result(60)
    finally:
        waiter.stop()
        follower.stop()
    assert code_w == 0, out_w + err_w
    assert f"job {namespace}/{name} Succeeded" in out_w
    assert "lost the API server" in err_w and "reconnected" in err_w
    assert code_f == 0, err_f
    assert _final_step(out_f) == max_steps
    assert_same_lines(out_f, cluster.pod_log_lines(namespace, f"{name}-master-0"), "rank 0")
