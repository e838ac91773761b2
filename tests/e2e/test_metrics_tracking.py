"""Metrics where teams look, on the real node: the local cluster's Prometheus scrapes a job's
pods by Kubernetes service discovery (their prometheus.io annotations) and answers for each
rank's step and throughput, every query of ddpjob's Grafana dashboard evaluates there; the
local cluster's MLflow server holds the job as one run through a deleted worker, contiguous to
max_steps and FINISHED; `status` names the run.

One job serves all of it (a 2-pod PyTorchJob, paced so the scrapes and the delete land while it
trains), and the recovery too: no volume holds its checkpoints (they go to the local cluster's
S3 server); the deleted worker's SIGTERM stops every rank at one step, rank 0 uploads that step
before both exit 143, and the re-created pods resume from it, every step trained once. A small
TrainJob shows the other API's pods are scraped the same way.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest

from controller import dashboard
from controller.kubeflow import LABEL_JOB_NAME
from localkube.addons import mlflow, prometheus
from localkube.handle import wait_until
from tests.controller.test_dashboard import GRAFANA
from tests.e2e.helpers import (
    ExitCodes,
    ddpjob,
    events,
    latest_step,
    paced,
    s3_checkpoints,
    s3_objects,
    s3_url,
    write_spec,
)
from tests.trainer.mlflow_server import MlflowApi

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: The tracked job: paced at STEP_S a step, its worker deleted once rank 0 reports step
#: DELETE_AT (checkpoints every 10 steps).
MAX_STEPS, LOG_EVERY, STEP_S, DELETE_AT = 160, 5, 0.15, 20


def query(promql: str) -> dict:
    """The local Prometheus' answer to an instant query (its HTTP API, from the host)."""
    url = f"{prometheus.HOST_ENDPOINT}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:  # a query Prometheus refuses: its error, to assert on
        return json.loads(e.read())


def by_rank(promql: str) -> dict[str, float]:
    answer = query(promql)
    assert answer["status"] == "success", answer
    return {r["metric"]["rank"]: float(r["value"][1]) for r in answer["data"]["result"]}


def tracked(cluster, namespace: str, name: str, fields: dict) -> dict:
    """``fields`` with the job's MLflow run on the local cluster's server."""
    env = {
        **fields.get("env", {}),
        "MLFLOW_TRACKING_URI": mlflow.ENDPOINT,
        "MLFLOW_EXPERIMENT_NAME": f"{namespace}-{name}",
    }
    return {**fields, "env": env}


def test_a_job_is_scraped_by_prometheus_and_one_mlflow_run_through_a_deleted_worker(
    real_node, namespace, tmp_path
):
    cluster, name = real_node, "watched"
    fields = s3_checkpoints(cluster, namespace, name, paced(cluster, namespace, STEP_S))
    spec = write_spec(
        cluster,
        tmp_path,
        name,
        namespace,
        max_steps=MAX_STEPS,
        log_every=LOG_EVERY,
        every_steps=10,
        **tracked(cluster, namespace, name, fields),
    )
    assert ddpjob(cluster, "submit", str(spec)).returncode == 0
    exits = ExitCodes(cluster, namespace, f"{LABEL_JOB_NAME}={name}")
    try:
        _scraped_through_a_deleted_worker(cluster, namespace, name)
    finally:
        runs = exits.stop()
    # The kubelet's SIGTERM to the worker; the stop rode in the step's all-reduce to rank 0,
    # which checkpointed: both exited 143 within the grace period, and their next runs 0.
    for replica in ("master", "worker"):
        codes = [code for pod, _, code in runs if pod == f"{name}-{replica}-0"]
        assert codes == [143, 0], runs

    # The delete landed mid-run: rank 0's first run stopped preempted at a step it uploaded to
    # S3 before exiting, its second resumed there (every step trained once), resumed the job's
    # MLflow run and completed.
    rank0 = "\n".join(cluster.pod_log_lines(namespace, f"{name}-master-0"))
    assert [d["reason"] for d in events(rank0, "done")] == ["preempted", "completed"], rank0
    first_run, second_run = rank0.split('{"event": "resume"', 1)
    (stopped,) = events(first_run, "done")
    assert events(first_run, "checkpoint")[-1]["step"] == stopped["step"] >= DELETE_AT
    (resumed,) = events(rank0, "resume")
    where = s3_url(namespace, name)
    assert (resumed["step"], resumed["path"]) == (
        stopped["step"], f"{where}/step_{stopped['step']:08d}",
    )  # fmt: skip
    assert all(e["step"] > stopped["step"] for e in events(second_run, "train"))
    assert events(rank0, "done")[-1]["step"] == MAX_STEPS
    final = f"step_{MAX_STEPS:08d}"  # complete on the server: its manifest is written last
    assert {f"{final}/state.pt", f"{final}/manifest.json"} <= set(
        s3_objects(cluster, namespace, name)
    )
    tracking = events(rank0, "tracking")
    assert [t["resumed"] for t in tracking] == [False, True], tracking

    # One MLflow run: the config as params, every log window's loss once, to max_steps; the
    # restart marked; FINISHED.
    api = MlflowApi(mlflow.HOST_ENDPOINT)
    (run,) = api.runs(f"{namespace}-{name}")
    run_id = run["info"]["run_id"]
    assert {t["run_id"] for t in tracking} == {run_id}
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == name
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["max_steps"] == str(MAX_STEPS) and params["log_every"] == str(LOG_EVERY)
    loss_steps = [step for step, _ in api.history(run_id, "loss")]
    assert loss_steps == list(range(LOG_EVERY, MAX_STEPS + 1, LOG_EVERY))
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["ddpjob.job"] == name and tags["ddpjob.namespace"] == namespace
    assert tags["ddpjob.api"] == "pytorchjob" and tags["ddpjob.restarts"] == "1"
    assert tags["ddpjob.checkpoint"].startswith(f"s3://ddpjob/{namespace}/{name}/")
    # The restart marked once, at the first step the run got after it.
    ((marked_at, restarts),) = api.history(run_id, "restarts")
    assert restarts == 1.0 and resumed["step"] <= marked_at <= MAX_STEPS

    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded" and st["progress"]["step"] == MAX_STEPS
    ckpt = st["checkpoint"]  # the newest, read from the server
    assert (ckpt["step"], ckpt["path"]) == (MAX_STEPS, f"{where}/{final}")
    assert ckpt["age_s"] is not None and ckpt["bytes"] > 0
    assert st["tracking"]["run_id"] == run_id
    assert (
        st["tracking"]["url"]
        == f"{mlflow.ENDPOINT}/#/experiments/{run['info']['experiment_id']}/runs/{run_id}"
    )


def _scraped_through_a_deleted_worker(cluster, namespace: str, name: str) -> None:
    """The job's worker deleted at step DELETE_AT; Prometheus' answers while it trains; the
    job waited for to Succeeded."""
    job = f'job_name="{name}", namespace="{namespace}"'

    # A worker deleted mid-run, placed by the step alone (as test_recovery places its faults):
    # the kubelet's SIGTERM stops every rank at one step, rank 0 saves it to S3 and both exit
    # 143; the re-created pods resume there and train the rest, at least
    # (MAX_STEPS - DELETE_AT) * STEP_S seconds, while Prometheus scrapes them.
    wait_until(
        f"training past step {DELETE_AT}",
        lambda: latest_step(cluster, name, namespace) >= DELETE_AT,
        120,
        0.5,
    )
    cluster.kubectl("delete", "pod", f"{name}-worker-0", "-n", namespace, "--wait=false")

    # Scraped by service discovery: every rank's step and throughput, from Prometheus' API. The
    # windows outlast the job's last scrape, so what it answers does not hang on how much of the
    # job is left.
    wait_until(
        "both ranks' steps in Prometheus",
        lambda: by_rank(f"last_over_time(ddpjob_step{{{job}}}[5m]) >= 1").keys() == {"0", "1"},
        120,
        1.0,
    )
    wait_until(
        "both ranks' throughput in Prometheus",
        lambda: by_rank(f"rate(ddpjob_samples_total{{{job}}}[1m]) > 0").keys() == {"0", "1"},
        120,
        1.0,
    )
    # Every query of the dashboard evaluates there, with Grafana's variables filled in.
    variables = {**GRAFANA, "$job": name, "$namespace": namespace}
    for expr in dashboard.queries():
        for var, value in variables.items():
            expr = expr.replace(var, value)
        answer = query(expr)
        assert answer["status"] == "success", (expr, answer)
    buckets = f"rate(ddpjob_step_seconds_bucket{{{job}}}[1m])"
    p90 = by_rank(f"histogram_quantile(0.9, sum by (le, rank) ({buckets}))")
    assert p90.keys() == {"0", "1"} and all(s >= STEP_S for s in p90.values()), p90

    w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "240", timeout=260)
    assert w.returncode == 0, w.stdout + w.stderr


def test_a_trainjobs_pods_are_scraped_the_same_way(real_node, namespace, tmp_path):
    cluster, name = real_node, "tj-watched"
    spec = write_spec(
        cluster,
        tmp_path,
        name,
        namespace,
        api="trainjob",
        max_steps=400,
        log_every=5,
        every_steps=0,
        **paced(cluster, namespace, 0.1),
    )
    assert ddpjob(cluster, "submit", str(spec)).returncode == 0
    job = f'job_name="{name}", namespace="{namespace}"'

    def pod_by_rank() -> dict[str, str]:
        """The pod each training rank's step is scraped from."""
        answer = query(f"ddpjob_step{{{job}}} > 0")
        assert answer["status"] == "success", answer
        return {r["metric"]["rank"]: r["metric"]["pod"] for r in answer["data"]["result"]}

    try:
        # Each node's pod serves its own rank.
        pods = wait_until(
            "both of the TrainJob's ranks in Prometheus",
            lambda: (got := pod_by_rank()).keys() == {"0", "1"} and got,
            180,
            1.0,
        )
    finally:
        ddpjob(cluster, "delete", name, "-n", namespace, "--api", "trainjob")
    assert pods["0"].startswith(f"{name}-node-0-0-"), pods
    assert pods["1"].startswith(f"{name}-node-0-1-"), pods
