"""The cluster commands' flags that docs/on-a-cluster.md promises, each on the real local cluster
and each asserting the flag's effect (an assertion that fails when the flag is ignored):

- ``--context``: a kubeconfig whose current context points at a server that does not answer;
  ``--context`` names a context of the real server and its namespace, and every command reaches
  the job there (a third context, the real server in another namespace, does not find it);
- ``logs --since``: rank 0's log from the real kubelet, followed and not, holds the lines
  stamped after the cutoff and none before it (the kubelet's own timestamps are the truth);
- ``plot`` of a TrainJob: the PNG's series is rank 0's ``train`` events, read from node 0's pod;
- ``--api`` on wait, logs, events, plot and delete: a name that is both a PyTorchJob and a
  TrainJob reaches the kind named, and a name of one kind asked as the other fails with one line.
"""

from __future__ import annotations

import calendar
import json
import math
import struct
import time
from pathlib import Path

import pytest
import yaml

from controller import kubeflow
from localkube.handle import wait_until
from tests.e2e.helpers import (
    Background,
    ddpjob,
    events,
    latest_step,
    paced_spec,
    where_things_stand,
    write_spec,
)
from trainer.contract import is_event, parse_event

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def _one_error_line(r, *, code: int = 1) -> str:
    """The single ``error:`` line a refused command printed (and nothing else on stdout)."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def _trainjob_rank_pod(cluster, name: str, namespace: str, rank: int) -> dict:
    pods = cluster.get_json("pods", "-n", namespace, "-l", f"{JOBSET_NAME}={name}")["items"]
    (pod,) = [
        p
        for p in pods
        if p["metadata"]["labels"].get(kubeflow.LABEL_JOB_COMPLETION_INDEX) == str(rank)
    ]
    return pod


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------------------------
# --context


def test_context_picks_the_server_and_namespace(cluster, namespace, tmp_path):
    """Three contexts in one kubeconfig: ``dead`` (current: a server that refuses connections),
    ``elsewhere`` (the real server, another namespace) and ``here`` (the real server, the job's
    namespace). No command passes ``-n``: the namespace is the context's."""
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    real = doc["clusters"][0]["cluster"]
    dead = {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "real", "cluster": real}, {"name": "dead", "cluster": dead}],
                "users": doc["users"],
                "contexts": [
                    {
                        "name": name,
                        "context": {"cluster": c, "user": doc["users"][0]["name"], "namespace": ns},
                    }
                    for name, c, ns in (
                        ("dead", "dead", namespace),
                        ("elsewhere", "real", f"{namespace}-elsewhere"),
                        ("here", "real", namespace),
                    )
                ],
                "current-context": "dead",
            }
        )
    )
    kubeconfig.chmod(0o600)

    def cli(*args: str, context: str | None = None):
        extra = ["--context", context] if context else []
        return ddpjob(cluster, *args, "--kubeconfig", str(kubeconfig), *extra)

    spec = write_spec(cluster, tmp_path, "ctx", namespace, suspend=True)

    # Through the current context nothing answers: every command below reached the cluster only
    # because --context named it.
    r = cli("submit", str(spec))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    refused = "error: submit: preflight cluster reachable failed: cluster: the API server at "
    assert refused + "https://127.0.0.1:1 does not answer" in r.stderr, r.stderr
    line = _one_error_line(cli("status", "ctx"))
    assert "https://127.0.0.1:1 does not answer" in line, line

    r = cli("submit", str(spec), context="here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"submitted pytorchjob {namespace}/ctx" in r.stdout
    assert cluster.get_json("pytorchjob", "ctx", "-n", namespace)["spec"]["runPolicy"]["suspend"]

    r = cli("status", "ctx", context="here")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"PyTorchJob {namespace}/ctx: Suspended"), r.stdout
    r = cli("list", context="here")
    assert r.returncode == 0, r.stderr
    assert [x.split()[:3] for x in r.stdout.splitlines()[1:]] == [
        ["ctx", "PyTorchJob", "Suspended"]
    ], r.stdout
    r = cli("events", "ctx", context="here")
    assert r.returncode == 0, r.stderr
    r = cli("wait", "ctx", "--timeout", "3", context="here")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"error: wait: job {namespace}/ctx has not ended after 3 s (got Suspended" in r.stderr
    r = cli("doctor", context="here")
    assert f"[  ok] cluster reachable: {real['server']} " in r.stdout, r.stdout + r.stderr
    r = cli("doctor")
    assert "[FAIL] cluster reachable: " in r.stdout and "127.0.0.1:1" in r.stdout, r.stdout

    # The real server, the other namespace: the context's namespace is the one asked.
    png = tmp_path / "ctx.png"
    for command in ("status", "wait", "logs", "events", "plot", "delete"):
        args = [command, "ctx", *(["-o", str(png)] * (command == "plot"))]
        line = _one_error_line(cli(*args, context="elsewhere"))
        assert f"{namespace}-elsewhere" in line and "ctx" in line, (command, line)
    line = _one_error_line(cli("list", context="dead"))
    assert "https://127.0.0.1:1 does not answer" in line, line
    line = _one_error_line(cli("status", "ctx", context="nosuch"), code=2)
    assert "context 'nosuch' is not in it" in line, line

    r = cli("delete", "ctx", "--wait", context="here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"deleted pytorchjob {namespace}/ctx and its pods" in r.stdout
    gone = cluster.kubectl("get", "pytorchjob", "ctx", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout


# ---------------------------------------------------------------------------------------------
# logs --since


def _stamped_log(cluster, pod: str, namespace: str) -> list[tuple[float, str]]:
    """Every line of the pod's training container as the kubelet serves it: (its timestamp as
    Unix seconds, the line)."""
    text = cluster.core_api().read_namespaced_pod_log(
        pod, namespace, container=kubeflow.CONTAINER, timestamps=True
    )
    out = []
    for line in text.splitlines():
        stamp, _, body = line.partition(" ")
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        out.append((seconds + float(f"0.{fraction or 0}"), body))
    return out


def _assert_cut(got: str, log: list[tuple[float, str]], lo: float, hi: float, what: str) -> int:
    """``got`` is the log's lines stamped from a cutoff on, the cutoff in [lo, hi] (what the
    command computed lies there): every line at or after ``hi`` is shown, none before ``lo``,
    and the lines shown are the log's last ones in order. Returns how many were left out."""
    lines = got.splitlines()
    bodies = [body for _, body in log]
    skipped = len(bodies) - len(lines)
    assert skipped >= 0 and bodies[skipped:] == lines, (
        f"{what}: not the log's last {len(lines)} lines: {lines[:3]} ... vs {bodies[-3:]}"
    )
    assert skipped > 0, f"{what}: every line shown, as without --since ({len(lines)} lines)"
    kept, dropped = log[skipped][0], log[skipped - 1][0]
    assert kept >= lo, f"{what}: a line stamped {kept} is shown, {lo - kept:.2f} s too old"
    assert dropped < hi, f"{what}: a line stamped {dropped} is left out, {dropped - hi:.2f} s new"
    return skipped


def test_logs_since_against_the_kubelet(cluster, namespace, tmp_path):
    """Rank 0 prints a line every step (0.5 s each). ``logs -f --since 3s`` started mid-run and
    ``logs --since Ns`` after the end, with N putting the cutoff mid-run, show the lines the
    kubelet stamped after the cutoff and none before."""
    name = "since"
    spec = paced_spec(
        cluster, tmp_path, name, namespace, max_steps=60, step_s=0.5, nodes=1, log_every=1
    )
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    wait_until(
        "rank 0 at step 20",
        lambda: latest_step(cluster, name, namespace) >= 20,
        300,
        0.5,
    )
    t0 = time.time()
    follow = Background(
        cluster, tmp_path, "since-f", "logs", name, "-n", namespace, "-f", "--since", "3s"
    )
    try:
        wait_until("the first followed line", lambda: follow.out_path.stat().st_size > 0, 60, 0.1)
        t1 = time.time()
        w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "300", timeout=320)
        assert w.returncode == 0, w.stdout + w.stderr + where_things_stand(cluster, namespace)
        rc, followed, err = follow.result(timeout=120)
    finally:
        follow.stop()
    assert rc == 0, err[-3000:]
    log = _stamped_log(cluster, f"{name}-master-0", namespace)
    assert [e["step"] for e in events("\n".join(b for _, b in log), "train")] == list(range(1, 61))
    # The command's cutoff is its start less 3 s, rounded down to the second: at or after
    # floor(t0 - 3), and before t1 - 3 (it had started when its first line came).
    skipped = _assert_cut(followed, log, math.floor(t0 - 3), t1 - 3, "logs -f --since 3s")
    assert not events(followed, "start") and events(followed, "done")
    # Step 20 was out before the command started, steps come at most every 0.5 s, and the
    # cutoff is at most 4 s before the start: nothing before step 12.
    assert events(followed, "train")[0]["step"] >= 12, followed[:500]

    # After the end: a cutoff at rank 0's 30th step.
    (step30,) = [t for t, b in log if is_event(b, "train") and parse_event(b)["step"] == 30]
    since = math.ceil(time.time() - step30)
    before = time.time()
    r = ddpjob(cluster, "logs", name, "-n", namespace, "--since", f"{since}s")
    after = time.time()
    assert r.returncode == 0, r.stderr
    cut = _assert_cut(r.stdout, log, math.floor(before - since), after - since, "logs --since")
    assert cut > skipped  # a later cutoff than the follow's
    steps = [e["step"] for e in events(r.stdout, "train")]
    assert steps == list(range(steps[0], 61)) and steps[0] > 20, steps
    assert not events(r.stdout, "start") and events(r.stdout, "done")


# ---------------------------------------------------------------------------------------------
# plot of a TrainJob, and --api on a name of one kind


def test_plot_of_a_trainjob_reads_rank_0(cluster, namespace, tmp_path):
    """A 2-node TrainJob: only rank 0 prints ``train`` events, so the series plotted is node 0's
    pod's. Then ``--api`` on the name, which is only a TrainJob: ``trainjob`` reaches it,
    ``pytorchjob`` fails in one line for every command."""
    from controller.plot import train_series

    name = "tj-plot"
    spec = write_spec(cluster, tmp_path, name, namespace, api="trainjob", max_steps=20, log_every=5)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "400", timeout=420)
    assert w.returncode == 0, w.stdout + w.stderr + where_things_stand(cluster, namespace)

    png = tmp_path / "curves.png"
    r = ddpjob(cluster, "plot", name, "-n", namespace, "-o", str(png))
    assert r.returncode == 0, r.stderr
    pod0 = _trainjob_rank_pod(cluster, name, namespace, 0)["metadata"]["name"]
    series = train_series(cluster.pod_log_lines(namespace, pod0))
    assert series["step"] == [5.0, 10.0, 15.0, 20.0], series
    assert all(x == x and x > 0 for x in series["loss"] + series["samples_per_s"]), series
    assert r.stdout == f"wrote {png} ({len(series['step'])} train events)\n", r.stdout
    assert _png_size(png) == (800, 600)
    pod1 = _trainjob_rank_pod(cluster, name, namespace, 1)["metadata"]["name"]
    assert train_series(cluster.pod_log_lines(namespace, pod1))["step"] == []  # rank 0's only

    # --api trainjob: the TrainJob, as without --api.
    again = tmp_path / "again.png"
    r = ddpjob(cluster, "plot", name, "-n", namespace, "-o", str(again), "--api", "trainjob")
    assert r.returncode == 0 and r.stdout == f"wrote {again} (4 train events)\n", r.stderr
    r = ddpjob(cluster, "wait", name, "-n", namespace, "--api", "trainjob")
    assert r.returncode == 0 and f"job {namespace}/{name} Succeeded" in r.stdout, r.stderr
    r = ddpjob(cluster, "logs", name, "-n", namespace, "--api", "trainjob")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == cluster.pod_log_lines(namespace, pod0)
    r = ddpjob(cluster, "events", name, "-n", namespace, "--api", "trainjob")
    assert r.returncode == 0 and f"jobset/{name} " in r.stdout, r.stdout + r.stderr

    # --api pytorchjob: no such PyTorchJob, one line each, and nothing deleted.
    refused = tmp_path / "refused.png"
    for command in ("wait", "logs", "events", "plot", "delete"):
        args = [command, name, "-n", namespace, "--api", "pytorchjob"]
        line = _one_error_line(
            ddpjob(cluster, *args, *(["-o", str(refused)] * (command == "plot")))
        )
        assert f"PyTorchJob {namespace}/{name}" in line and "not found" in line, (command, line)
    assert not refused.exists()
    cluster.get_json("trainjob", name, "-n", namespace)  # still there

    r = ddpjob(cluster, "delete", name, "-n", namespace, "--api", "trainjob", "--wait", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"deleted trainjob {namespace}/{name} and its pods" in r.stdout


# ---------------------------------------------------------------------------------------------
# --api on a name that is both kinds


def test_api_picks_one_of_two_jobs_of_the_same_name(cluster, namespace, tmp_path):
    """``twin`` is a PyTorchJob that runs to the end and a suspended TrainJob (no pods). Without
    ``--api`` each command refuses (exit 2, one line); with it, each reaches the kind named."""
    name = "twin"
    for api, fields in (("trainjob", {"suspend": True}), ("pytorchjob", {"nodes": 1})):
        spec = write_spec(
            cluster, tmp_path, name, namespace, api=api, max_steps=20, log_every=5, **fields
        )
        r = ddpjob(cluster, "submit", str(spec), "--no-preflight")
        assert r.returncode == 0, r.stdout + r.stderr

    for command in ("wait", "logs", "events", "plot", "delete"):
        line = _one_error_line(ddpjob(cluster, command, name, "-n", namespace), code=2)
        assert f"{namespace}/{name} is both a PyTorchJob and a TrainJob" in line, (command, line)

    # wait: the PyTorchJob ends; the TrainJob stays suspended.
    r = ddpjob(cluster, "wait", name, "-n", namespace, "--api", "pytorchjob", "--timeout", "400",
               timeout=420)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr + where_things_stand(cluster, namespace)
    assert f"job {namespace}/{name} Succeeded" in r.stdout
    r = ddpjob(cluster, "wait", name, "-n", namespace, "--api", "trainjob", "--timeout", "3")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"error: wait: job {namespace}/{name} has not ended after 3 s (got Suspended" in (
        r.stderr
    )

    # logs and plot: the PyTorchJob's master; the TrainJob has no pod.
    r = ddpjob(cluster, "logs", name, "-n", namespace, "--api", "pytorchjob")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == cluster.pod_log_lines(namespace, f"{name}-master-0")
    assert [e["step"] for e in events(r.stdout, "train")] == [5, 10, 15, 20]
    line = _one_error_line(ddpjob(cluster, "logs", name, "-n", namespace, "--api", "trainjob"))
    assert f"logs: job {namespace}/{name} has no pod for rank 0" in line, line
    assert f"{JOBSET_NAME}={name}" in line, line
    png = tmp_path / "twin.png"
    r = ddpjob(cluster, "plot", name, "-n", namespace, "-o", str(png), "--api", "pytorchjob")
    assert r.returncode == 0 and r.stdout == f"wrote {png} (4 train events)\n", r.stderr
    png.unlink()
    line = _one_error_line(
        ddpjob(cluster, "plot", name, "-n", namespace, "-o", str(png), "--api", "trainjob")
    )
    assert f"plot: job {namespace}/{name} has no pod of rank 0" in line, line
    assert not png.exists()

    # events: each kind's own objects only.
    def objects(api: str) -> set[str]:
        r = ddpjob(cluster, "events", name, "-n", namespace, "--api", api)
        assert r.returncode == 0, r.stderr
        rows = [x.split() for x in r.stdout.splitlines()[1:]]
        return {row[3] for row in rows if len(row) > 3}

    mine = objects("pytorchjob")
    assert {f"pytorchjob/{name}", f"pod/{name}-master-0"} <= mine, mine
    assert not any(o.startswith(("trainjob/", "jobset/")) for o in mine), mine
    theirs = objects("trainjob")
    assert not any(o.startswith("pytorchjob/") or o == f"pod/{name}-master-0" for o in theirs), (
        theirs
    )

    # delete: the TrainJob only; then the name is one kind, found without --api.
    r = ddpjob(cluster, "delete", name, "-n", namespace, "--api", "trainjob", "--wait", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"deleted trainjob {namespace}/{name} and its pods" in r.stdout
    gone = cluster.kubectl("get", "trainjob", name, "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert cluster.get_json("pytorchjob", name, "-n", namespace)["metadata"]["name"] == name
    line = _one_error_line(ddpjob(cluster, "delete", name, "-n", namespace, "--api", "trainjob"))
    assert f"TrainJob {namespace}/{name}" in line and "not found" in line, line
    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert (st["kind"], st["condition"]) == ("PyTorchJob", "Succeeded")
