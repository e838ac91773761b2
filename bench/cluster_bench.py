"""Cluster client bench, side by side in one run on the local cluster (localkube).

    python bench/cluster_bench.py            # reuses a live `make cluster-up`, else starts one

1. Waiting for a job to end: ddpjob's ``wait_for_job`` (a watch) and the Kubeflow SDK's
   ``TrainingClient.wait_for_job_conditions`` at its defaults (a GET every 15 s) wait for the
   same job at the same time; three jobs of different lengths run at once. For each: seconds
   from the terminal condition becoming visible (an independent watch records that instant) to
   the waiting call returning, and the API requests it issued while waiting. Requests are
   counted with one hook for both clients: ``kubernetes.client.rest.RESTClientObject.request``,
   attributed by client instance.
2. Following rank 0's log across a pod restart: the trainer of a one-node job is killed (-9)
   mid-run, the operator re-creates the pod and training resumes from the last checkpoint.
   ddpjob's ``RankFollower`` and the SDK's ``get_job_logs(follow=True)`` follow at the same
   time; each is compared with what the pods really printed (the node's container logs, kept
   past the kubelet's cleanup): lines lost and lines printed twice.

The pods run on the real node in this checkout's image, a quarter CPU each (the three waited
jobs run at once on 2 cores), with checkpoints on a local PersistentVolume (claim ``ckpt``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.apicount import RequestCounter, lost_and_doubled  # noqa: E402
from trainer.contract import is_event, parse_event  # noqa: E402

CLAIM = "ckpt"


def job_manifest(
    name: str, namespace: str, max_steps: int, log_every: int = 5, nodes: int = 2
) -> dict[str, Any]:
    from controller.render.pytorchjob import render_pytorchjob
    from controller.spec import validate_spec

    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec.update(name=name, namespace=namespace, nodes=nodes)
    spec["resources"] = {"cpu": "250m", "memory": "1536Mi"}
    spec["volumes"] = [{"name": "ckpt", "claim": CLAIM, "mount_path": "/ckpt"}]
    spec["trainer"].update(
        max_steps=max_steps,
        log_every=log_every,
        eval_every=0,
        resume="auto",
        warmup_steps=0,
        task_args={"image_size": 16, "noise": 2.0},
        checkpoint={"dir": f"/ckpt/{name}", "every_steps": 10},
    )
    return render_pytorchjob(validate_spec(spec))


WAIT_JOBS = (("bench-wait-a", 300), ("bench-wait-b", 600), ("bench-wait-c", 1200))
SDK = "Kubeflow SDK wait_for_job_conditions (defaults)"
OURS = "ddpjob wait_for_job (watch)"


def bench_wait(cluster_handle: Any, namespace: str, counter: RequestCounter) -> dict[str, Any]:
    """Three jobs of different lengths at once; per job: an observer, ours, the SDK."""
    from kubeflow.training import TrainingClient
    from kubernetes import client, config, watch

    from controller.jobs.read.explain import job_terminal
    from controller.jobs.wait import wait_for_job
    from controller.kube.client import Cluster

    kubeconfig = str(cluster_handle.kubeconfig)
    submitter = Cluster(kubeconfig=kubeconfig, notice=lambda s: None)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(name: str, steps: int) -> None:
        submitter.create_job(job_manifest(name, namespace, steps, log_every=100))
        created = time.monotonic()
        ours = Cluster(kubeconfig=kubeconfig, notice=lambda s: None)
        sdk = TrainingClient(config_file=kubeconfig, namespace=namespace)
        seen: dict[str, float] = {}
        returned: dict[str, tuple[float, int]] = {}

        def observe() -> None:
            api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
            for ev in watch.Watch().stream(
                api.list_namespaced_custom_object,
                "kubeflow.org",
                "v1",
                namespace,
                "pytorchjobs",
                field_selector=f"metadata.name={name}",
                timeout_seconds=600,
            ):
                if job_terminal(ev["object"]):
                    seen["t"] = time.monotonic()
                    return

        def run_ours() -> None:
            rc = ours.transport
            before = counter.of(rc)
            wait_for_job(ours, name, namespace, timeout_s=600)
            returned[OURS] = (time.monotonic(), counter.of(rc) - before)

        def run_sdk() -> None:
            rc = sdk.custom_api.api_client.rest_client
            before = counter.of(rc)
            sdk.wait_for_job_conditions(name, namespace=namespace)
            returned[SDK] = (time.monotonic(), counter.of(rc) - before)

        threads = [threading.Thread(target=f) for f in (observe, run_ours, run_sdk)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=700)
        with lock:
            for who, (at, requests) in returned.items():
                rows.append(
                    {
                        "job": name,
                        "who": who,
                        "job_s": seen["t"] - created,
                        "latency_s": at - seen["t"],
                        "requests": requests,
                    }
                )

    jobs = [threading.Thread(target=one, args=job) for job in WAIT_JOBS]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(timeout=800)
    return {"rows": sorted(rows, key=lambda r: (r["job"], r["who"]))}


def bench_logs(cluster_handle: Any, ours: Any, namespace: str) -> dict[str, Any]:
    from controller.jobs.follow import RankFollower
    from localkube.handle import wait_until

    name = "bench-logs"
    # One node: a restarted master then resumes alone (with two, the survivor of a lost peer
    # exits 1 today and the job fails; see tests/e2e/test_recovery.py).
    ours.create_job(job_manifest(name, namespace, 600, nodes=1))
    got: list[str] = []
    follower = RankFollower(ours, namespace, name, 0, got.extend, lambda s: None)
    done = threading.Event()

    def follow() -> None:
        follower.follow(time.monotonic() + 300)
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    wait_until(
        "master running", lambda: cluster_handle.running_pod(name, namespace, "master-0"), 120, 0.3
    )
    sdk_code = (
        "import sys\nfrom kubeflow.training import TrainingClient\n"
        f"TrainingClient(config_file={str(cluster_handle.kubeconfig)!r}, "
        f"namespace={namespace!r}).get_job_logs({name!r}, follow=True)\n"
    )
    sdk = subprocess.Popen(
        [sys.executable, "-c", sdk_code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    def step() -> int:
        return max([parse_event(x)["step"] for x in list(got) if is_event(x, "train")] or [0])

    wait_until("step 100", lambda: step() >= 100, 120, 0.1)
    # kill -9 of the trainer: exit 137 is retryable, the operator re-creates the pod (same
    # name, new UID) and the trainer resumes from its last checkpoint.
    pod = cluster_handle.running_pod(name, namespace, "master-0")
    os.kill(cluster_handle.pod_pid(namespace, pod), signal.SIGKILL)
    done.wait(300)
    try:
        sdk_out, _ = sdk.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        sdk.kill()
        sdk_out, _ = sdk.communicate()
    prefix = f"[Pod {name}-master-0]: "
    sdk_lines = [x[len(prefix) :] for x in sdk_out.splitlines() if x.startswith(prefix)]
    truth = cluster_handle.pod_log_lines(namespace, f"{name}-master-0")
    runs = sum(1 for x in truth if is_event(x, "start"))
    out: dict[str, Any] = {"printed_by_pods": len(truth), "runs": runs}
    for who, lines in (
        ("ddpjob logs -f (RankFollower)", got),
        ("Kubeflow SDK get_job_logs(follow=True)", sdk_lines),
    ):
        lost, doubled = lost_and_doubled(lines, truth)
        out[who] = {"lines": len(lines), "lost": lost, "doubled": doubled}
    return out


def main() -> int:
    from controller.kube.client import Cluster
    from localkube.handle import start_or_reuse

    counter = RequestCounter()
    handle = start_or_reuse()
    from kubernetes import client

    core = client.CoreV1Api(handle.api_client())
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    from localkube.handle import wait_until

    def has_sa() -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(namespace).items
        )

    wait_until("service account", has_sa, 30)
    handle.trainer_image()  # this checkout's, under the examples' name
    handle.local_volume(namespace, CLAIM)
    ours = Cluster(kubeconfig=str(handle.kubeconfig), notice=lambda s: None)
    try:
        wait = bench_wait(handle, namespace, counter)
        logs = bench_logs(handle, ours, namespace)
    finally:
        core.delete_namespace(namespace)
        handle.delete_local_volumes(namespace)
        # Drop our lease: the cluster stops only if this run started it and nobody else uses it.
        handle.control_plane.release()
    print("wait for a job to end: 3 jobs at once, each waited for by both clients at once")
    print(f"  {'job':14s} {'ran':>6s}  {'client':48s} {'returned after':>14s} {'requests':>8s}")
    for r in wait["rows"]:
        print(
            f"  {r['job']:14s} {r['job_s']:5.1f}s  {r['who']:48s} "
            f"{r['latency_s']:+13.3f}s {r['requests']:8d}"
        )
    for who in (OURS, SDK):
        mine = [r for r in wait["rows"] if r["who"] == who]
        if mine:
            lat = [r["latency_s"] for r in mine]
            print(
                f"  {who}: mean {sum(lat) / len(lat):.3f} s, max {max(lat):.3f} s after the "
                f"terminal condition; {sum(r['requests'] for r in mine)} requests for "
                f"{len(mine)} jobs"
            )
    print(
        f"follow rank 0 across a pod restart (kill -9 mid-run, pod re-created; its "
        f"{logs.pop('runs')} runs printed {logs.pop('printed_by_pods')} lines):"
    )
    for who, r in logs.items():
        print(
            f"  {who:50s} {r['lines']:4d} lines, {r['lost']:4d} lost, {r['doubled']:3d} "
            "printed twice"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
