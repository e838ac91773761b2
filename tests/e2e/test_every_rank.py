"""Every rank's log on the local cluster's real node: `logs --all` follows every pod of a
3-pod TrainJob, each line after its rank, each pod's lines exactly as it printed them; `--tail`
works with and without `-f`. An elastic PyTorchJob running a script of the user's own (torchrun's
c10d rendezvous, no ddpjob trainer, so no `start` event tells rank 0) is followed on every
worker rather than not at all, by `submit --follow` and by `logs`; once it has ended, every
worker's log is still there, also of a worker that outlived the job.

The follower's guarantees through restarts and broken streams, per pod: tests/controller/
test_follow_unit.py; for one rank on this node: test_recovery.py, test_trainjob.py."""

from __future__ import annotations

import pytest
import yaml

from controller import kubeflow
from localkube.handle import wait_until
from tests.e2e.helpers import Background, ddpjob, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _by_prefix(text: str, prefixes: dict[str, str]) -> dict[str, list[str]]:
    """``{key: [line without its prefix, ...]}`` for each ``prefix -> key``; every line must
    start with one of them."""
    out: dict[str, list[str]] = {key: [] for key in prefixes.values()}
    for line in text.splitlines():
        prefix = next((p for p in prefixes if line.startswith(p)), None)
        assert prefix is not None, f"a line without a known prefix: {line!r}"
        out[prefixes[prefix]].append(line.removeprefix(prefix))
    return out


def test_logs_all_follows_every_rank_of_a_three_pod_trainjob(real_node, namespace, tmp_path):
    name = "three"
    spec = write_spec(
        real_node,
        tmp_path,
        name,
        namespace,
        api="trainjob",
        nodes=3,
        max_steps=20,
        resources={"cpu": "300m", "memory": "1536Mi"},
    )
    r = ddpjob(real_node, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    follow = Background(real_node, tmp_path, "all", "logs", name, "-n", namespace, "--all", "-f")
    w = ddpjob(real_node, "wait", name, "-n", namespace, "--timeout", "400", timeout=420)
    rc, out, err = follow.result(timeout=120)
    assert w.returncode == 0, w.stdout + w.stderr
    assert rc == 0, err[-3000:]

    selector = f"{kubeflow.LABEL_JOBSET_NAME}={name}"
    pods = real_node.get_json("pods", "-n", namespace, "-l", selector)["items"]
    rank_of = {
        p["metadata"]["name"]: p["metadata"]["labels"][kubeflow.LABEL_JOB_COMPLETION_INDEX]
        for p in pods
    }
    assert sorted(rank_of.values()) == ["0", "1", "2"]
    truth = {rank: real_node.pod_log_lines(namespace, pod) for pod, rank in rank_of.items()}
    followed = _by_prefix(out, {f"[rank {r}] ": r for r in truth})
    for rank, lines in truth.items():
        assert lines, f"rank {rank} printed nothing"
        assert followed[rank] == lines, f"rank {rank}: {len(followed[rank])} vs {len(lines)} lines"

    # Not followed: the last two lines of each rank, rank after rank.
    t = ddpjob(real_node, "logs", name, "-n", namespace, "--all", "--tail", "2")
    assert t.returncode == 0, t.stderr
    assert t.stdout.splitlines() == [
        f"[rank {r}] {line}" for r in sorted(truth) for line in truth[r][-2:]
    ]
    # Followed, from the last line of each (the job has ended: it stops at once).
    tf = ddpjob(real_node, "logs", name, "-n", namespace, "--all", "-f", "--tail", "1")
    assert tf.returncode == 0, tf.stderr
    assert sorted(tf.stdout.splitlines()) == sorted(f"[rank {r}] {truth[r][-1]}" for r in truth)


#: The user's own script: torchrun (its c10d rendezvous from the operator's PET_* variables)
#: runs a Python one-liner per worker. No ddpjob trainer: no JSON events at all.
SCRIPT = "import os; print('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"


def test_an_elastic_job_of_a_users_own_script_is_followed_on_every_worker(
    real_node, namespace, tmp_path
):
    name = "own"
    spec = tmp_path / "own.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "namespace": namespace,
                "image": real_node.trainer_image(),
                "nodes": 2,
                "elastic": {"min_nodes": 2, "max_nodes": 2},
                "resources": {"cpu": "250m", "memory": "1Gi"},
                "command": ["python", "-m", "torch.distributed.run", "--no-python"],
                "args": ["python", "-c", SCRIPT],
            }
        )
    )
    r = ddpjob(real_node, "submit", str(spec), "--follow", "--timeout", "300", timeout=330)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "following every worker" in r.stderr
    assert "no pod for rank 0" not in r.stderr

    pods = [f"{name}-worker-0", f"{name}-worker-1"]
    truth = {pod: real_node.pod_log_lines(namespace, pod) for pod in pods}
    hellos = sorted(x for lines in truth.values() for x in lines if x.startswith("hello from"))
    assert hellos == ["hello from rank 0 of 2", "hello from rank 1 of 2"]
    printed = [x for x in r.stdout.splitlines() if x.startswith(f"[{name}-worker-")]
    followed = _by_prefix("\n".join(printed), {f"[{pod}] ": pod for pod in pods})
    assert followed == truth

    # `logs` (not followed) finds no rank 0 either: every worker, said so.
    once = ddpjob(real_node, "logs", name, "-n", namespace)
    assert once.returncode == 0, once.stderr
    assert "shows the trainer's start event" in once.stderr
    assert _by_prefix(once.stdout, {f"[{pod}] ": pod for pod in pods}) == truth


def test_a_finished_elastic_job_keeps_the_log_of_a_worker_that_outlived_it(
    real_node, namespace, tmp_path
):
    """The operator ends an elastic job as soon as any worker succeeds. Here worker-1 goes on
    for 15 s after torchrun (as a worker that uploads its results does): the job is Succeeded
    while worker-1 still runs. The spec leaves clean_pod_policy out, as a new user does; under
    cleanPodPolicy Running the operator would delete worker-1 then, and its log with it. An
    elastic job keeps its pods: worker-1 ends on its own, and `logs --all` of the finished job
    shows both workers' lines."""
    name = "outlived"
    # The shell is PID 1: without the trap it would ignore a SIGTERM and outlive a deletion.
    linger = (
        'trap "exit 143" TERM; case "$(cat /etc/hostname)" in *-worker-1) sleep 15 & wait;; esac'
    )
    spec = tmp_path / "outlived.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "namespace": namespace,
                "image": real_node.trainer_image(),
                "nodes": 2,
                "elastic": {"min_nodes": 2, "max_nodes": 2},
                "resources": {"cpu": "250m", "memory": "1Gi"},
                "command": ["sh", "-c"],
                "args": [
                    'python -m torch.distributed.run --no-python python -c "$SCRIPT" && ' + linger
                ],
                "env": {"SCRIPT": SCRIPT},
            }
        )
    )
    r = ddpjob(real_node, "submit", str(spec), "--wait", "--timeout", "300", timeout=330)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"job {namespace}/{name} Succeeded" in r.stdout

    pods = [f"{name}-worker-0", f"{name}-worker-1"]

    def phase(pod: str) -> str | None:
        got = real_node.get_json("pod", pod, "-n", namespace, missing_ok=True)
        return got["status"].get("phase") if got is not None else None

    # worker-1 ends on its own, or (deleted as the job ended) is gone.
    wait_until(
        "worker-1 ended or gone", lambda: phase(pods[1]) in ("Succeeded", "Failed", None), 120
    )
    once = ddpjob(real_node, "logs", name, "-n", namespace, "--all")
    assert once.returncode == 0, once.stderr
    shown = _by_prefix(once.stdout, {f"[{pod}] ": pod for pod in pods})
    hellos = sorted(x for lines in shown.values() for x in lines if x.startswith("hello from"))
    assert hellos == ["hello from rank 0 of 2", "hello from rank 1 of 2"], once.stdout
    assert all(shown[pod] for pod in pods), shown
    assert [phase(pod) for pod in pods] == ["Succeeded", "Succeeded"]
    job = real_node.get_json("pytorchjob", name, "-n", namespace)
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
