"""Queues at scale, in simulation on the local cluster (localkube, Kueue v0.17):

    python bench/queue_bench.py            # reuses a live `make cluster-up`, else starts one

64 kwok GPU nodes of 8 GPUs (the cluster's own two and 62 more, tainted like them; a pod bound
there is never started), a ClusterQueue holding their 512 GPUs, and 216 PyTorchJobs of 4 nodes x
8 GPUs in one namespace's LocalQueue: Kueue admits 16 (512 GPUs) and 200 wait in the queue.
Then, measured side by side in the same run:

1. ``list`` and ``status`` of a queued job (``python -m controller``, a fresh process each
   time, as a user runs it: interpreter start included), against ``kubectl get pytorchjobs``
   and ``kubectl get workloads`` of the same namespace (the same lists, without the queue
   reading), each the median of 5 runs: wall time, and the CPU time of the command itself
   (the 2-core machine is shared: under load the wall time is mostly waiting for a core, the
   API server's included). The goal is under a second each. With ``--debug``, the requests
   each makes.
2. ``wait`` on a queued job for 20 s and for 80 s: the API requests each made (``--debug``
   counts them); what the longer wait made more, per second, is the cost of waiting in the
   queue. The goal is none per second (a watch, and the queue read when the job changes).

The objects are deleted at the end (the nodes, the queue, the namespace). Exit 1 if waiting in
the queue cost any request per second.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

NODES = 64  # kwok nodes of 8 GPUs, the cluster's two included
JOB_NODES, JOB_GPUS = 4, 8  # each job: 4 pods of 8 GPUs
ADMITTED = NODES * 8 // (JOB_NODES * JOB_GPUS)  # 16 jobs fill the quota
QUEUED = 200
RUNS = 5
WAIT_S = (20, 80)  # two waits: the requests they differ by are the per-second cost


def job_manifest(name: str, namespace: str, queue: str) -> dict[str, Any]:
    from controller.render.pytorchjob import render_pytorchjob
    from controller.spec import validate_spec

    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec.update(name=name, namespace=namespace, nodes=JOB_NODES, queue=queue)
    spec["resources"] = {"cpu": "1", "memory": "4Gi", "gpus": JOB_GPUS}
    spec["trainer"].update(max_steps=100, warmup_steps=0)
    return render_pytorchjob(validate_spec(spec))


def setup(cluster: Any, namespace: str, queue: str) -> list[str]:
    """The extra kwok nodes, the ClusterQueue (named ``queue``) and LocalQueue, the jobs."""
    from localkube.addons import kueue
    from localkube.controlplane import bootstrap

    extra = [f"bench-kwok-{i}" for i in range(NODES - len(bootstrap.KWOK_NODES))]
    items: list[dict[str, Any]] = [bootstrap.kwok_node(n) for n in extra]
    items.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": kueue.FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 10_000},
                                    {"name": "memory", "nominalQuota": "100Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": NODES * 8},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
    )
    items.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "bench-queue", "namespace": namespace},
            "spec": {"clusterQueue": queue},
        }
    )
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    return extra


def submit_jobs(cluster: Any, namespace: str, total: int) -> float:
    from controller.kube.client import Cluster

    api = Cluster(kubeconfig=str(cluster.kubeconfig))
    t0 = time.monotonic()
    for i in range(total):
        api.create_job(job_manifest(f"bench-q-{i:03d}", namespace, "bench-queue"))
    return time.monotonic() - t0


def workload_states(cluster: Any, namespace: str) -> dict[str, int]:
    from controller.jobs.read.queue import state

    items = json.loads(cluster.kubectl("get", "workloads", "-n", namespace, "-o", "json").stdout)
    out: dict[str, int] = {}
    for w in items["items"]:
        out[state(w)] = out.get(state(w), 0) + 1
    return out


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the command itself, the finished process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def median_s(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Median wall and CPU seconds of RUNS runs, and the last run's output."""
    walls, cpus, out = [], [], ""
    for _ in range(RUNS):
        wall, cpu, proc = timed(argv, env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr[-2000:]}")
        walls.append(wall)
        cpus.append(cpu)
        out = proc.stdout
    return statistics.median(walls), statistics.median(cpus), out


def main(argv: list[str] | None = None) -> int:
    # No options: the parser is there so that --help explains the bench instead of running it.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    from localkube.handle import start_or_reuse, wait_until

    cluster = start_or_reuse()
    namespace = f"bench-queue-{uuid.uuid4().hex[:6]}"
    queue = namespace  # the ClusterQueue's name
    cluster.kubectl("create", "namespace", namespace)
    extra: list[str] = []
    missed = True
    env = cluster.env
    py = [sys.executable, "-m", "controller"]
    kubectl = [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig)]
    try:
        extra = setup(cluster, namespace, queue)
        wait_until(
            f"{NODES} kwok nodes Ready",
            lambda: (
                len(
                    [
                        n
                        for n in json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)[
                            "items"
                        ]
                        if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"
                        and any(
                            c["type"] == "Ready" and c["status"] == "True"
                            for c in n.get("status", {}).get("conditions", [])
                        )
                    ]
                )
                >= NODES
            ),
            120,
        )
        took = submit_jobs(cluster, namespace, ADMITTED + QUEUED)
        states = wait_until(
            f"{ADMITTED} admitted and {QUEUED} pending",
            lambda: (
                (s := workload_states(cluster, namespace)).get("admitted") == ADMITTED
                and s.get("pending") == QUEUED
                and s
            ),
            300,
            1.0,
        )
        print(
            f"setup: {NODES} kwok nodes x 8 GPUs, {ADMITTED + QUEUED} jobs submitted in {took:.1f}s"
        )
        print(f"workloads: {states}")
        last = f"bench-q-{ADMITTED + QUEUED - 1:03d}"  # queued last: the most ahead of it
        rows = []
        load = os.getloadavg()[0]
        for what, argv in (
            ("ddpjob list", [*py, "list", "-n", namespace]),
            ("kubectl get pytorchjobs", [*kubectl, "get", "pytorchjobs", "-n", namespace]),
            (f"ddpjob status {last}", [*py, "status", last, "-n", namespace]),
            ("kubectl get workloads", [*kubectl, "get", "workloads", "-n", namespace]),
        ):
            wall, cpu, out = median_s(argv, env)
            rows.append((what, wall, cpu))
            if what.startswith("ddpjob status"):
                status_out = out
        load = (load + os.getloadavg()[0]) / 2
        print(f"\n{'command (median of ' + str(RUNS) + ')':40s} {'wall s':>8s} {'CPU s':>8s}")
        for what, wall, cpu in rows:
            print(f"{what:40s} {wall:8.3f} {cpu:8.3f}")
        print(f"(machine load average during the runs: {load:.1f} on {os.cpu_count()} cores)")
        by = {what: (wall, cpu) for what, wall, cpu in rows}
        for ours, theirs in (
            ("ddpjob list", "kubectl get pytorchjobs"),
            (f"ddpjob status {last}", "kubectl get workloads"),
        ):
            print(
                f"ratio {ours} / {theirs}: wall {by[ours][0] / by[theirs][0]:.2f}, "
                f"CPU {by[ours][1] / by[theirs][1]:.2f}"
            )
        print("\nstatus of the last queued job:\n" + status_out)
        for what, argv in (
            ("list", [*py, "--debug", "list", "-n", namespace]),
            ("status", [*py, "--debug", "status", last, "-n", namespace]),
        ):
            _, _, proc = timed(argv, env)
            counted = [line for line in proc.stderr.splitlines() if "API request" in line]
            print(f"{what}: {counted[-1] if counted else 'no request count printed'}")
        counts = {}
        for wait_s in WAIT_S:
            t, _, proc = timed(
                [*py, "--debug", "wait", last, "-n", namespace, "--timeout", str(wait_s)], env
            )
            counted = [line for line in proc.stderr.splitlines() if "API request" in line]
            said = [line for line in proc.stderr.splitlines() if line.startswith("job ")]
            counts[wait_s] = int(counted[-1].split()[1]) if counted else -1  # "debug: N API ..."
            print(f"wait on {last}, --timeout {wait_s}: {t:.1f}s, exit {proc.returncode}")
            print("  " + "\n  ".join(said))
            print(f"  {counted[-1] if counted else 'no request count printed'}")
        (short, n_short), (long, n_long) = sorted(counts.items())
        per_s = (n_long - n_short) / (long - short)
        print(
            f"requests per second while queued: ({n_long} - {n_short}) / ({long} - {short} s) = "
            f"{per_s:.3f}"
        )
        missed = per_s > 0  # the target: waiting in the queue costs no request per second
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterqueue", queue, "--wait=false", check=False)
        if extra:
            cluster.kubectl("delete", "nodes", *extra, "--wait=false", check=False)
        cluster.control_plane.release()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
