"""The Prometheus metrics (trainer/telemetry/metrics.py), read as Prometheus reads them: scraped
over HTTP and parsed by the client library's own text-format parser.

The trainer-level tests (a real run scraped while it trains, torchrun's workers served by their
launcher) are in test_telemetry_runs.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.trainer.conftest import REPO, base_env, free_port
from trainer.contract import (
    CHECKPOINT,
    GOODPUT,
    JOB_NAME_ENV,
    METRICS_DIR_ENV,
    NAMESPACE_ENV,
    NODE_NAME_ENV,
    START,
    TRAIN,
)
from trainer.telemetry import metrics as m

LABELS = {"job_name": "j", "namespace": "ns", "rank": "3", "node": "n1"}


def scrape(url: str) -> dict[str, list]:
    """Every sample at ``url``, by sample name: [(labels, value), ...]."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def local(url: str) -> str:
    """``url`` (by this host's address) on 127.0.0.1: the server listens on every address."""
    return "http://127.0.0.1:" + url.rsplit(":", 1)[1]


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    (found,) = [v for got, v in samples[name] if labels.items() <= got.items()]
    return found


def exercise(metrics: m.Metrics) -> None:
    """Every call the loop and its parts make, with figures a test can check."""
    config = {"max_steps": 100}
    metrics.event(START, {"step": 10, "config": config, "world_size": 4})
    metrics.stepped(11, seconds=0.2, data_s=0.05)
    metrics.stepped(12, seconds=3.0, data_s=0.0)
    # The train event's rates are the job's, over 4 ranks.
    train = {"loss": 2.5, "lr": 1e-3, "samples_per_s": 160.0, "tokens_per_s": 10240.0}
    metrics.event(TRAIN, {**train, "data_wait": 0.1, "step": 12})
    metrics.health(busy_s=0.15, straggler=True)
    metrics.event(CHECKPOINT, {"step": 12, "stall_s": 0.5, "write_s": 2.0, "path": "p"})
    run0 = {"launched_at": 0.0, "ended_at": 100.0, "startup_s": 10.0, "productive_s": 60.0}
    run0 |= {"stall_s": 5.0, "eval_s": 5.0, "lost_s": 20.0, "other_s": 0.0}
    run1 = {"launched_at": 130.0, "ended_at": 150.0, "startup_s": 8.0, "productive_s": 12.0}
    metrics.event(GOODPUT, {"runs": [run0, run1]})
    metrics.stuck(True)


def test_every_family_is_exported_with_the_labels_and_the_figures_given():
    gpu = {"util_pct": 87.0, "mem_used_gib": 2.0, "power_w": 250.0}
    metrics = m.Metrics(LABELS, samples=8, tokens=512, world_size=4, gpu_reading=lambda: gpu)
    exercise(metrics)
    url = m.serve(free_port(), metrics.registry)
    assert url is not None and url.endswith(m.PATH)
    got = scrape(local(url))

    # Every name the module declares is there, and nothing else of ours.
    ours = {n for n in got if n.startswith("ddpjob_") and not n.endswith("_created")}
    assert ours == m.NAMES
    for name, samples in got.items():
        if name.startswith("ddpjob_"):
            for labels, _ in samples:
                assert {k: labels[k] for k in m.LABELS} == LABELS, name

    assert value(got, "ddpjob_step") == 12
    assert value(got, "ddpjob_max_steps") == 100 and value(got, "ddpjob_world_size") == 4
    assert value(got, "ddpjob_step_seconds_count") == 2
    assert value(got, "ddpjob_step_seconds_sum") == pytest.approx(3.2)
    assert value(got, "ddpjob_step_seconds_bucket", le="0.25") == 1  # 0.2 s, not 3.0 s
    assert value(got, "ddpjob_step_seconds_bucket", le="5.0") == 2
    assert value(got, "ddpjob_samples_total") == 16 and value(got, "ddpjob_tokens_total") == 1024
    assert value(got, "ddpjob_data_wait_seconds_total") == pytest.approx(0.05)
    assert value(got, "ddpjob_loss") == 2.5 and value(got, "ddpjob_busy_seconds") == 0.15
    assert value(got, "ddpjob_samples_per_second") == 40.0  # this rank's share
    assert value(got, "ddpjob_tokens_per_second") == 2560.0
    assert value(got, "ddpjob_data_wait_ratio") == 0.1
    assert value(got, "ddpjob_checkpoints_total") == 1
    assert value(got, "ddpjob_checkpoint_stall_seconds_total") == 0.5
    assert value(got, "ddpjob_checkpoint_write_seconds_total") == 2.0
    # The ledger's parts summed over the runs; the 30 s between the runs is the restart's.
    parts = {labels["part"]: v for labels, v in got["ddpjob_goodput_seconds_total"]}
    assert parts == {
        "startup": 18.0,
        "productive": 72.0,
        "checkpoint": 5.0,
        "evaluation": 5.0,
        "lost": 20.0,
        "restart": 30.0,
    }
    assert value(got, "ddpjob_restarts") == 1
    assert value(got, "ddpjob_stuck") == 1 and value(got, "ddpjob_straggler") == 1
    assert value(got, "ddpjob_gpu_utilization_ratio") == pytest.approx(0.87)
    assert value(got, "ddpjob_gpu_memory_used_bytes") == 2 * 2**30
    assert value(got, "ddpjob_gpu_power_watts") == 250.0


def test_goodput_counters_never_go_down_when_the_ledger_revises_a_part():
    metrics = m.Metrics(LABELS)
    run = {"launched_at": 0.0, "ended_at": 50.0, "productive_s": 40.0, "lost_s": 0.0}
    metrics.goodput([run])
    metrics.goodput([{**run, "productive_s": 30.0, "lost_s": 10.0}])
    metrics.goodput([{**run, "productive_s": 45.0, "lost_s": 10.0}])
    samples = {
        s.labels["part"]: s.value
        for f in metrics.registry.collect()
        if f.name == "ddpjob_goodput_seconds"
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert samples["productive"] == 45.0 and samples["lost"] == 10.0


def test_served_in_a_pod_by_default_and_elsewhere_when_asked():
    pod = {m.IN_A_POD: "10.0.0.1"}
    assert m.serving_port("auto", 9464, pod) == 9464 and m.serving_port("auto", 9464, {}) is None
    assert m.serving_port(True, 9100, {}) == 9100 and m.serving_port(False, 9464, pod) is None


def test_labels_come_from_the_pods_env():
    env = {JOB_NAME_ENV: "mnist", NAMESPACE_ENV: "team-a", NODE_NAME_ENV: "gpu-7"}
    assert m.labels_from_env(2, env) == {
        "job_name": "mnist",
        "namespace": "team-a",
        "rank": "2",
        "node": "gpu-7",
    }
    # Outside Kubernetes: no job, no namespace, this host as the node.
    assert m.labels_from_env(0, {})["node"] and m.labels_from_env(0, {})["job_name"] == ""


def test_a_port_in_use_is_one_warning_and_no_metrics(caplog):
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            assert m.serve(port, CollectorRegistry()) is None
    (record,) = [r for r in caplog.records if r.name == m.__name__]
    assert f"port {port}" in record.getMessage() and "in use" in record.getMessage()


WORKER = textwrap.dedent(
    """
    import sys
    from trainer.telemetry import metrics as m
    rank, steps = int(sys.argv[1]), int(sys.argv[2])
    metrics = m.Metrics(m.labels_from_env(rank), samples=4, world_size=2)
    metrics.started(0, 10)
    for step in range(1, steps + 1):
        metrics.stepped(step, seconds=0.1, data_s=0.0)
    print("written", flush=True)
    sys.stdin.readline()  # alive until told
    """
)


def test_a_launcher_serves_what_its_workers_wrote_and_lets_go_of_gone_workers_gauges():
    """Two worker processes write into the launcher's folder (the client's multiprocess mode);
    the launcher's one port serves both ranks. A worker that ended keeps its counters (they
    only grow) but not its gauges."""
    env = base_env(**m.worker_environment(free_port()), **{JOB_NAME_ENV: "j"})
    assert m.served_by_launcher(env) and not m.served_by_launcher({})
    folder = env[METRICS_DIR_ENV]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), str(3 + rank)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        for w in workers:
            assert w.stdout.readline().strip() == "written"
        url = m.serve(free_port(), workers_dir=folder)
        assert url is not None
        got = scrape(local(url))
        assert value(got, "ddpjob_step", rank="0") == 3
        assert value(got, "ddpjob_step", rank="1") == 4
        assert value(got, "ddpjob_samples_total", rank="1") == 16
        assert value(got, "ddpjob_step_seconds_count", rank="0") == 3

        workers[1].communicate("\n", timeout=30)
        got = scrape(local(url))
        assert [labels["rank"] for labels, _ in got["ddpjob_step"]] == ["0"]
        assert value(got, "ddpjob_samples_total", rank="1") == 16
    finally:
        for w in workers:
            if w.poll() is None:
                w.communicate("\n", timeout=30)
    assert os.path.isdir(folder)


def test_a_second_run_in_one_process_is_served_on_the_same_port():
    """Tests and benches build several trainers in one process: each run's metrics replace the
    last run's behind the one server (no second bind, no duplicate series)."""
    port = free_port()
    first = m.Metrics(LABELS, samples=1)
    first.stepped(5, seconds=0.1, data_s=0.0)
    url = m.serve(port, first.registry)
    second = m.Metrics(LABELS, samples=1)
    second.stepped(2, seconds=0.1, data_s=0.0)
    assert m.serve(port, second.registry) == url
    assert value(scrape(local(url)), "ddpjob_step") == 2
