"""TrainJob client bench: ddpjob against the Kubeflow SDK v2 (``TrainerClient``), side by side in
one run on the local cluster (localkube) with its real node.

    python bench/trainjob_bench.py          # reuses a live `make cluster-up`, else starts one

1. Waiting for a TrainJob to end: ddpjob's ``wait_for_job`` (a watch) and the SDK's
   ``TrainerClient.wait_for_job_status`` at its defaults (``get_job`` every 2 s, which reads the
   TrainJob, its runtime and its pods) wait for the same job at the same time; three one-node
   TrainJobs of different lengths run at once. For each: seconds from the terminal condition
   becoming visible (an independent watch records that instant) to the waiting call returning,
   and the API requests it issued while waiting. Requests are counted with one hook for both
   clients, ``kubernetes.client.rest.RESTClientObject.request``, attributed by client instance.
2. Following rank 0's log across a container restart: the trainer of a one-node TrainJob is
   killed (-9, its container's PID 1) mid-run; the runtime's Job restarts the container in place
   (restartPolicy OnFailure) and training resumes from the checkpoint on a PersistentVolume.
   ddpjob's ``RankFollower`` (what ``logs -f`` runs) and the SDK's
   ``get_job_logs(follow=True)`` follow at the same time; each is compared with what the
   container really printed (the kubelet's log files of every run): lines lost and lines
   printed twice.

The SDK's follow reads the one container run it found and ends with it (the kubelet closes the
stream when the container exits); ddpjob's follows each run (pod UID, restartCount) until the
job ends.
"""

from __future__ import annotations

import json
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

WAIT_JOBS = (("tj-wait-a", 60), ("tj-wait-b", 120), ("tj-wait-c", 240))
SDK = "Kubeflow SDK wait_for_job_status (defaults)"
OURS = "ddpjob wait_for_job (watch)"
FOLLOW_OURS = "ddpjob logs -f (RankFollower)"
FOLLOW_SDK = "Kubeflow SDK get_job_logs(follow=True)"
#: The logs job: its length, where rank 0 is killed, how often it logs and checkpoints.
LOG_STEPS, KILL_AT_STEP = 400, 100


def trainjob_manifest(
    name: str,
    namespace: str,
    image: str,
    max_steps: int,
    *,
    log_every: int = 100,
    claim: str | None = None,
) -> dict[str, Any]:
    """The quickstart as a one-node TrainJob of this checkout's image, small enough that three
    run at once on two cores; with ``claim``, checkpoints every 10 steps on that volume."""
    from controller.render.trainjob import render_trainjob
    from controller.spec import validate_spec

    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec.update(name=name, namespace=namespace, nodes=1, api="trainjob", image=image)
    spec["resources"] = {"cpu": "500m", "memory": "1536Mi"}
    spec["trainer"].update(
        max_steps=max_steps,
        log_every=log_every,
        eval_every=0,
        warmup_steps=0,
        task_args={"image_size": 16, "noise": 2.0},
    )
    if claim:
        spec["volumes"] = [{"name": "ckpt", "claim": claim, "mount_path": "/ckpt"}]
        spec["trainer"].update(resume="auto", checkpoint={"dir": "/ckpt", "every_steps": 10})
    else:
        spec["trainer"].update(resume="never", checkpoint={"dir": "/tmp/ckpt"})
    return render_trainjob(validate_spec(spec))


def bench_wait(handle: Any, namespace: str, image: str, counter: RequestCounter) -> list[dict]:
    """Three TrainJobs at once; per job: an observer, ours, the SDK."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    from kubernetes import client, config, watch

    from controller.jobs.read.apis import TRAINJOB_KIND
    from controller.jobs.wait import wait_for_job
    from controller.kube.client import Cluster
    from controller.kubeflow import TRAINJOB

    kubeconfig = str(handle.kubeconfig)
    submitter = Cluster(kubeconfig=kubeconfig, notice=lambda s: None)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(name: str, steps: int) -> None:
        submitter.create_job(trainjob_manifest(name, namespace, image, steps))
        created = time.monotonic()
        ours = Cluster(kubeconfig=kubeconfig, notice=lambda s: None)
        sdk = TrainerClient(KubernetesBackendConfig(config_file=kubeconfig, namespace=namespace))
        seen: dict[str, float] = {}
        returned: dict[str, tuple[float, int]] = {}

        def observe() -> None:
            api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
            for ev in watch.Watch().stream(
                api.list_namespaced_custom_object,
                TRAINJOB.group,
                TRAINJOB.version,
                namespace,
                TRAINJOB.plural,
                field_selector=f"metadata.name={name}",
                timeout_seconds=900,
            ):
                if TRAINJOB_KIND.terminal(ev["object"]):
                    seen["t"] = time.monotonic()
                    return

        def run_ours() -> None:
            rc = ours.transport
            before = counter.of(rc)
            wait_for_job(ours, name, namespace, kind=TRAINJOB_KIND, timeout_s=900)
            returned[OURS] = (time.monotonic(), counter.of(rc) - before)

        def run_sdk() -> None:
            rc = sdk.backend.core_api.api_client.rest_client  # custom_api shares it
            before = counter.of(rc)
            sdk.wait_for_job_status(name, timeout=900)
            returned[SDK] = (time.monotonic(), counter.of(rc) - before)

        threads = [threading.Thread(target=f) for f in (observe, run_ours, run_sdk)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=1000)
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
        t.join(timeout=1100)
    return sorted(rows, key=lambda r: (r["job"], r["who"]))


def _rank0(handle: Any, name: str, namespace: str) -> dict[str, Any] | None:
    """Rank 0's pod once its trainer runs."""
    from controller.jobs.read.apis import TRAINJOB_KIND

    core = handle.core_api()
    resp = core.list_namespaced_pod(
        namespace, label_selector=TRAINJOB_KIND.rank_selector(name, 0), _preload_content=False
    )
    for pod in json.loads(resp.data)["items"]:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if statuses and statuses[0].get("state", {}).get("running"):
            return pod
    return None


def bench_logs(handle: Any, namespace: str, image: str) -> dict[str, Any]:
    from controller.jobs.follow import RankFollower
    from controller.jobs.read.apis import TRAINJOB_KIND
    from controller.kube.client import Cluster
    from localkube.handle import wait_until

    name = "tj-logs"
    handle.local_volume(namespace, "ckpt")
    ours = Cluster(kubeconfig=str(handle.kubeconfig), notice=lambda s: None)
    ours.create_job(trainjob_manifest(name, namespace, image, LOG_STEPS, log_every=5, claim="ckpt"))
    got: list[str] = []
    follower = RankFollower(ours, namespace, name, 0, got.extend, lambda s: None, TRAINJOB_KIND)
    done = threading.Event()

    def follow() -> None:
        follower.follow(time.monotonic() + 900)
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    pod = wait_until("rank 0 running", lambda: _rank0(handle, name, namespace), 300, 0.3)
    pod_name = pod["metadata"]["name"]
    sdk_code = (
        "from kubeflow.common.types import KubernetesBackendConfig\n"
        "from kubeflow.trainer import TrainerClient\n"
        f"sdk = TrainerClient(KubernetesBackendConfig(config_file={str(handle.kubeconfig)!r}, "
        f"namespace={namespace!r}))\n"
        f"for line in sdk.get_job_logs({name!r}, follow=True):\n"
        "    print(line, flush=True)\n"
    )
    sdk = subprocess.Popen(
        [sys.executable, "-c", sdk_code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    def step() -> int:
        trains = [x for x in list(got) if is_event(x, "train")]
        return max([parse_event(x)["step"] for x in trains] or [0])

    wait_until(f"step {KILL_AT_STEP}", lambda: step() >= KILL_AT_STEP, 600, 0.1)
    # kill -9 of the trainer (its container's PID 1): exit 137, the Job's OnFailure restarts the
    # container in place (same pod, restartCount 1) and the trainer resumes from /ckpt.
    pod = _rank0(handle, name, namespace)
    pid = handle.pod_pid(namespace, pod) if pod else None
    if not pid:
        raise SystemExit(f"trainjob bench: no host pid for rank 0's container (got pod {pod})")
    os.kill(pid, signal.SIGKILL)
    done.wait(900)
    try:
        sdk_out, _ = sdk.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        sdk.kill()
        sdk_out, _ = sdk.communicate()
    truth = handle.pod_log_lines(namespace, pod_name)
    runs = sum(1 for x in truth if is_event(x, "start"))
    out: dict[str, Any] = {"printed_by_pods": len(truth), "runs": runs, "clients": {}}
    for who, lines in ((FOLLOW_OURS, got), (FOLLOW_SDK, sdk_out.splitlines())):
        lost, doubled = lost_and_doubled(lines, truth)
        out["clients"][who] = {"lines": len(lines), "lost": lost, "doubled": doubled}
    return out


def report(wait: list[dict], logs: dict[str, Any]) -> None:
    print(
        f"wait for a TrainJob to end: {len(WAIT_JOBS)} jobs at once, each waited for by both "
        "clients at once"
    )
    print(f"  {'job':10s} {'ran':>6s}  {'client':44s} {'returned after':>14s} {'requests':>8s}")
    for r in wait:
        print(
            f"  {r['job']:10s} {r['job_s']:5.1f}s  {r['who']:44s} "
            f"{r['latency_s']:+13.3f}s {r['requests']:8d}"
        )
    for who in (OURS, SDK):
        mine = [r for r in wait if r["who"] == who]
        if mine:
            lat = [r["latency_s"] for r in mine]
            print(
                f"  {who}: mean {sum(lat) / len(lat):.3f} s, max {max(lat):.3f} s after the "
                f"terminal condition; {sum(r['requests'] for r in mine)} requests for "
                f"{len(mine)} jobs"
            )
    print(
        f"follow rank 0 across a container restart (kill -9 mid-run, restarted in place; its "
        f"{logs['runs']} runs printed {logs['printed_by_pods']} lines):"
    )
    for who, r in logs["clients"].items():
        print(
            f"  {who:42s} {r['lines']:4d} lines, {r['lost']:4d} lost, {r['doubled']:3d} "
            "printed twice"
        )


def main() -> int:
    from kubernetes import client

    from localkube.handle import start_or_reuse, wait_until

    counter = RequestCounter()
    handle = start_or_reuse()
    core = client.CoreV1Api(handle.api_client())
    namespace = f"tjbench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})

    def has_sa() -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(namespace).items
        )

    try:
        wait_until("service account", has_sa, 30)
        image = handle.trainer_image()
        wait = bench_wait(handle, namespace, image, counter)
        logs = bench_logs(handle, namespace, image)
    finally:
        core.delete_namespace(namespace)
        handle.delete_local_volumes(namespace)
        # Drop our lease: the cluster stops only if this run started it and nobody else uses it.
        handle.control_plane.release()
    report(wait, logs)
    ours = logs["clients"][FOLLOW_OURS]
    worst_ours = max((r["latency_s"] for r in wait if r["who"] == OURS), default=99.0)
    # Targets: ours loses and repeats nothing, and returns within a second of the condition.
    return 0 if ours["lost"] == ours["doubled"] == 0 and worst_ours < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
