"""An elastic job (Workers only, c10d rendezvous) on the local cluster: the CLI finds the worker
that runs global rank 0 (the rendezvous decides which), follows it, and never names a master
pod, which an elastic job does not have."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import ddpjob, write_spec
from trainer.contract import is_event, parse_event

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MAX_STEPS = 30


def _events(text: str, name: str) -> list[dict]:
    return [parse_event(line) for line in text.splitlines() if is_event(line, name)]


def test_an_elastic_job_is_followed_on_the_worker_that_runs_rank_0(real_node, namespace, tmp_path):
    cluster, name = real_node, "elastic"
    spec = write_spec(
        cluster,
        tmp_path,
        name,
        namespace,
        max_steps=MAX_STEPS,
        nodes=2,
        # The operator ends an elastic job as soon as any worker succeeded; its pods are kept
        # (clean_pod_policy's default for an elastic job), and the reads below need rank 0's.
        elastic={"min_nodes": 2, "max_nodes": 2},
    )
    r = ddpjob(cluster, "submit", str(spec), "--follow", "--timeout", "240", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # The hints name only pods that exist: no master in an elastic job.
    hints = [x.strip() for x in r.stdout.splitlines() if x.startswith("  ")]
    assert hints and not [h for h in hints if "master" in h], hints
    assert (
        f"kubectl logs -f -l training.kubeflow.org/job-name={name} -c pytorch -n {namespace} "
        "--prefix --max-log-requests 2" in hints
    )
    assert any(h.startswith(f"python -m controller logs -f {name} -n {namespace}") for h in hints)

    # submit --follow printed global rank 0's story: one start naming its pod, training, done.
    (start,) = _events(r.stdout, "start")
    rank0 = start["hostname"]
    assert rank0 in {f"{name}-worker-0", f"{name}-worker-1"}
    assert start["world_size"] == 2
    assert f"logs: global rank 0 is in pod {rank0}" in r.stderr
    assert _events(r.stdout, "done")[-1]["step"] == MAX_STEPS
    assert f"job {namespace}/{name} Succeeded" in r.stdout
    assert "no pod for rank 0" not in r.stderr

    # logs -f of the finished job: exactly that pod's log, every line once.
    f = ddpjob(cluster, "logs", name, "-n", namespace, "-f", "--timeout", "60")
    assert f.returncode == 0, f.stderr
    assert f.stdout.splitlines() == cluster.pod_log_lines(namespace, rank0)

    # logs (once), status and plot read the same pod.
    once = ddpjob(cluster, "logs", name, "-n", namespace)
    assert once.returncode == 0, once.stderr
    assert once.stdout == f.stdout
    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["rank0_pod"] == rank0 and st["elastic"] is True
    text = ddpjob(cluster, "status", name, "-n", namespace).stdout
    assert f"rank 0: pod {rank0} (the rendezvous placed it)" in text
    assert st["progress"]["step"] == MAX_STEPS
    png = tmp_path / "curves.png"
    plot = ddpjob(cluster, "plot", name, "-n", namespace, "-o", str(png))
    assert plot.returncode == 0, plot.stderr
    assert "(0 train events)" not in plot.stdout

    # Other node ranks are the rendezvous's to number: said plainly, exit 2.
    other = ddpjob(cluster, "logs", name, "-n", namespace, "--rank", "1")
    assert other.returncode == 2
    assert other.stderr.startswith(f"error: --rank: job {namespace}/{name} is elastic")
    assert "Traceback" not in other.stderr
