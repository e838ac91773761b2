"""`wait` watches the job, it does not poll it: its API requests, counted where the client
makes them (`--debug` prints them at exit), are a small constant whatever the job's duration.
And when the watch's resourceVersion has expired (410 Gone: the API server restarted while etcd
moved on and compacted its history) `wait` lists again and still returns the right answer."""

from __future__ import annotations

import re
import time

import pytest
import yaml

from localkube.handle import wait_until
from tests.e2e.helpers import (
    Background,
    ddpjob,
    debug_requests,
    etcd_compacted,
    etcd_move_on_and_compact,
    latest_step,
    paced_spec,
    restart_apiserver,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_wait_makes_the_same_few_requests_however_long_the_job_runs(real_node, namespace, tmp_path):
    cluster = real_node
    # `wait` is about the job's life, not its training: a container that sleeps S seconds.
    jobs = {"short": 15, "long": 60}  # seconds: the short one still runs when its wait starts
    waiters, started = {}, {}
    try:
        for name, sleep_s in jobs.items():
            spec = tmp_path / f"{name}.yaml"
            spec.write_text(
                yaml.safe_dump(
                    {
                        "name": name,
                        "namespace": namespace,
                        "image": "ghcr.io/ddpjob/trainer:0.1.0",
                        # Both jobs' pods fit the node's 2 CPUs at once.
                        "resources": {"cpu": "200m", "memory": "256Mi"},
                        "shm_size": "64Mi",  # counts against memory; the default is 1Gi
                        "command": ["python3", "-c", f"import time; time.sleep({sleep_s})"],
                        "args": [],
                    }
                )
            )
            r = ddpjob(cluster, "submit", str(spec))
            assert r.returncode == 0, r.stderr
            started[name] = time.monotonic()
            waiters[name] = Background(
                cluster, tmp_path, f"wait-{name}", "wait", name, "-n", namespace, "--debug"
            )
        took, counts = {}, {}
        for name, waiter in waiters.items():
            code, out, err = waiter.result(300)
            took[name] = time.monotonic() - started[name]
            assert code == 0, out + err
            assert f"job {namespace}/{name} Succeeded" in out
            assert "Running" in err, err  # it saw the job run: it waited, and watched
            counts[name] = debug_requests(err)
    finally:
        for waiter in waiters.values():
            waiter.stop()
    print(f"wait took {took}, requests {counts}")
    # The long wait lasted long enough that a poll every few seconds would show.
    assert took["long"] - took["short"] >= 30, took
    # Finding the job (a get in each API), then a list and a watch of the job, of its pods (the
    # history that explains a failure) and of the namespace's events (why a pod waits), and rank
    # 0's log followed for the trainer's verdicts (a log stream and a get of its pod): the same
    # for a job of seconds and one of most of a minute. A poll every few seconds would add a get
    # each time.
    assert counts["long"] == counts["short"], counts
    total, kinds, relists = counts["long"]
    assert total <= 10 and "watch 3" in kinds and "log 1" in kinds and relists == 0, counts


@pytest.mark.disruptive
def test_wait_lists_again_when_its_watch_has_expired_and_still_answers(
    real_node, namespace, tmp_path
):
    cluster, name = real_node, "relist"
    max_steps = 400  # at 0.1 s a step: ends well after the API server is back (checked below)
    spec = paced_spec(
        cluster, tmp_path, name, namespace, max_steps=max_steps, step_s=0.1,
        every_steps=200, log_every=20,
    )  # fmt: skip
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stderr
    waiter = Background(cluster, tmp_path, "wait", "wait", name, "-n", namespace, "--debug")
    compacted: list[int] = []
    try:
        wait_until(
            "training past step 20", lambda: latest_step(cluster, name, namespace) >= 20, 120, 0.5
        )
        # While the API server is down nothing can hand out a newer resourceVersion, so once
        # etcd has moved on and compacted, every resourceVersion `wait` holds is gone for good.
        down_s = restart_apiserver(
            cluster,
            down_s=2.0,
            while_down=lambda: compacted.append(etcd_move_on_and_compact(cluster)),
        )
        assert down_s >= 2.0, "the API server never stopped answering"
        assert etcd_compacted(cluster, compacted[0] - 1)
        assert latest_step(cluster, name, namespace) < max_steps, "it ended during the outage"
        code, out, err = waiter.result(600)
    finally:
        waiter.stop()
    assert code == 0, out + err
    assert f"job {namespace}/{name} Succeeded" in out
    assert "lost the API server" in err and "reconnected" in err
    _, kinds, relists = debug_requests(err)
    assert relists >= 1, err
    lists = int(re.search(r"get (\d+)", kinds)[1])
    assert lists >= 2, kinds  # the first list, and the one after 410 Gone
    assert "Traceback" not in err
