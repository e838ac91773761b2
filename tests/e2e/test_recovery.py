"""Faults on the local control plane: a pod process killed (-9), a pod deleted (SIGTERM), the
API server restarted. The job recovers from its checkpoint, `wait` and `logs -f` reconnect, and
a followed log equals what the pods printed: no line lost, none twice.

The pods run on the real node, in containers of this checkout's image: the kubelet sends the
SIGTERM and its grace period, ``kill -9`` hits a container's PID 1 from outside. The checkpoints
live on a local PersistentVolume that uid 1000 writes (fsGroup) and the re-created pods read
back, or on the local cluster's S3 server with no volume for them."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime, timezone

import pytest

from controller.jobs.read.goodput import PARTS
from controller.jobs.read.loglines import split_timestamp
from controller.kubeflow import LABEL_JOB_NAME
from localkube.handle import wait_until
from localkube.node import volumes
from tests.e2e.helpers import (
    CLAIM,
    Background,
    ExitCodes,
    assert_same_lines,
    ddpjob,
    events,
    latest_step,
    paced,
    paced_spec,
    restart_apiserver,
    s3_checkpoints,
    s3_objects,
    s3_url,
    where_things_stand,
    write_spec,
)
from trainer.contract import parse_event

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MAX_STEPS = 160


def _start_job(cluster, namespace, tmp_path, name, s3: bool = False, every_steps: int = 10):
    # Paced (0.1 s a step): at least 13 s of training left when the fault comes at step 30.
    fields = paced(cluster, namespace, 0.1)
    if s3:
        fields = s3_checkpoints(cluster, namespace, name, fields)
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


def _seconds_to_events(cluster, namespace: str, pod: str, since: float) -> dict[str, float]:
    """Seconds from ``since`` (epoch) to the first ``resume`` and the first ``train`` event
    after it in the pod's current log, by the kubelet's timestamps."""
    text = cluster.kubectl("logs", pod, "-n", namespace, "-c", "pytorch", "--timestamps").stdout
    seen: dict[str, float] = {}
    for line in text.splitlines():
        stamp, body = split_timestamp(line)
        event = parse_event(body)
        if stamp is None or event is None or event["event"] in seen:
            continue
        at = datetime.fromisoformat(stamp[0]).replace(tzinfo=timezone.utc).timestamp()
        if event["event"] == "resume" or (event["event"] == "train" and "resume" in seen):
            seen[event["event"]] = at + stamp[1] / 1e9 - since
    return seen


def test_a_deleted_worker_stops_the_job_at_a_step_saved_to_s3_and_it_resumes_there(
    real_node, namespace, tmp_path
):
    """No volume holds the checkpoints: they go to the local cluster's S3 server (the claim
    the pods mount, read-only, holds the paced task's code). The deleted worker's SIGTERM stops
    every rank at the same step; rank 0 uploads that step before exiting 143, and the re-created
    pods resume from it: every step runs once."""
    cluster, name = real_node, "preempt"
    follow0, follow1 = _start_job(cluster, namespace, tmp_path, name, s3=True)
    exits = ExitCodes(cluster, namespace, f"{LABEL_JOB_NAME}={name}")
    try:
        wait_until(
            "training past step 30", lambda: latest_step(cluster, name, namespace) >= 30, 90, 0.5
        )
        deleted_at = time.time()
        cluster.kubectl("delete", "pod", f"{name}-worker-0", "-n", namespace, "--wait=false")
        _wait_succeeds(cluster, namespace, name, 150, follow0, follow1)
        code0, out0, err0 = follow0.result(60)
        code1, _, err1 = follow1.result(60)
    finally:
        follow0.stop()
        follow1.stop()
        runs = exits.stop()
    assert code0 == 0 and code1 == 0, err0 + err1
    # The kubelet's SIGTERM to the worker; the stop rode in the step's all-reduce to rank 0,
    # which checkpointed: both exited 143 within the grace period, and their next runs 0.
    for replica in ("master", "worker"):
        codes = [code for pod, _, code in runs if pod == f"{name}-{replica}-0"]
        assert codes == [143, 0], runs
    first_run, second_run = out0.split('{"event": "resume"', 1)
    (stopped,) = events(first_run, "done")
    assert stopped["reason"] == "preempted"
    assert events(first_run, "checkpoint")[-1]["step"] == stopped["step"]
    (resumed,) = events(out0, "resume")
    assert resumed["step"] == stopped["step"]
    assert resumed["path"] == f"{s3_url(namespace, name)}/step_{stopped['step']:08d}"
    assert all(e["step"] > stopped["step"] for e in events(second_run, "train"))
    assert _final_step(out0) == MAX_STEPS
    assert_same_lines(out0, cluster.pod_log_lines(namespace, f"{name}-master-0"), "rank 0")
    # The upload on the S3 server: the final step complete (its manifest written last).
    final = f"step_{MAX_STEPS:08d}"
    assert {f"{final}/state.pt", f"{final}/manifest.json"} <= set(
        s3_objects(cluster, namespace, name)
    )
    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded" and st["progress"]["step"] == MAX_STEPS
    ckpt = st["checkpoint"]
    assert (ckpt["step"], ckpt["path"]) == (MAX_STEPS, f"{s3_url(namespace, name)}/{final}")
    assert ckpt["age_s"] is not None and ckpt["bytes"] > 0
    took = _seconds_to_events(cluster, namespace, f"{name}-master-0", deleted_at)
    print(f"seconds from the deletion to rank 0's next run's events: {took}")


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
