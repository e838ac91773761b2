"""What the controller says of a job that heals itself: ``status`` names each restart's cause
(from the trainer's ledger), the nodes the job's ranks failed on and those it avoids (its
annotations), and the ranks its pre-flight found slow; ``wait`` and ``--follow`` say a restart,
a failed save, a bad node and a slow pre-flight as they come. The trainer's side as real
processes: tests/trainer/test_restart.py, test_save_faults.py, test_preflight.py; on the real
node: tests/e2e/test_heal.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from controller.jobs.read.goodput import format_goodput
from controller.jobs.status import job_status
from controller.progress import describe, is_urgent, urgent_lines
from tests.controller.test_checkpoint_status_unit import FakeCluster, stamped
from trainer.contract import (
    AVOIDED_NODES_ANNOTATION,
    NODE_FAULTS_ANNOTATION,
    format_event,
)

CAUSE = "stuck: rank 1 in tasks.py:hang_here on node node-a"
SLOW = {"rank": 3, "pod": "j-worker-2", "node": "node-c", "what": "matmul", "seconds": 0.2,
        "median_s": 0.05, "factor": 4.0}  # fmt: skip


def _run(launched: float, ended: float, end: str | None, cause: str | None = None) -> dict:
    """A run of the ledger as the trainer prints it (its seconds all start-up: enough here)."""
    return {
        "id": f"r{launched:.0f}", "launched_at": launched, "first_step_at": None,
        "ended_at": ended, "start_step": 0, "last_step": 23, "kept_step": 20, "lost_steps": 3,
        "startup_s": ended - launched, "productive_s": 0.0, "stall_s": 0.0, "eval_s": 0.0,
        "lost_s": 0.0, "other_s": 0.0, "end": end, "cause": cause,
    }  # fmt: skip


class HealedCluster(FakeCluster):
    """A running job that restarted itself once, whose faults are on its annotations."""

    def get_job(self, name, namespace, api=None):
        job = super().get_job(name, namespace, api)
        faults = [
            {"node": "node-a", "rank": 1, "pod": "p1", "cause": CAUSE, "at": 1.0, "run": "r1"},
            {"node": "node-b", "rank": 2, "pod": "p2", "cause": "lost: rank 2 (...)", "at": 2.0,
             "run": "r1"},
            {"node": "node-a", "rank": 1, "pod": "p1", "cause": "lost: rank 1 (...)", "at": 3.0,
             "run": "r2"},
        ]  # fmt: skip
        job["metadata"]["annotations"] = {
            NODE_FAULTS_ANNOTATION: json.dumps(faults),
            AVOIDED_NODES_ANNOTATION: json.dumps(["node-a"]),
        }
        return job


def _log(now: datetime) -> list[str]:
    t = now.timestamp()
    runs = [_run(t - 300, t - 200, "restart", CAUSE), _run(t - 150, t - 20, None)]
    train = format_event("train", step=30, max_steps=100, loss=0.5, preflight=[SLOW])
    return [
        stamped(60, train, now=now),
        stamped(20, format_event("goodput", at=t - 20, runs=runs), now=now),
    ]


def test_status_names_the_restarts_cause_the_nodes_it_avoids_and_the_slow_rank(monkeypatch, capsys):
    from controller.cli import cluster as cli_cluster
    from controller.cli.main import main

    fake = HealedCluster(_log(datetime.now(timezone.utc)))
    st = job_status(fake, "j", "ml", "pytorchjob")
    (restart,) = st["restarts"]
    assert (restart["cause"], restart["step"]) == (CAUSE, 23)
    assert st["nodes"] == {
        "avoided": ["node-a"],
        "faults": [
            {"node": "node-a", "faults": 2, "causes": [CAUSE, "lost: rank 1 (...)"]},
            {"node": "node-b", "faults": 1, "causes": ["lost: rank 2 (...)"]},
        ],
    }
    assert st["preflight"] == [SLOW]

    monkeypatch.setattr(cli_cluster, "cluster_of", lambda args: fake)
    assert main(["status", "j", "-n", "ml"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"restarted itself at step 23: {CAUSE}" in out
    assert f"avoids node node-a: 2 fault(s) of this job there ({CAUSE}; lost: rank 1 (...))" in out
    assert "fault on node node-b: 1 of this job there (lost: rank 2 (...))" in out
    assert (
        "preflight: rank 3's matmul took 4x the other ranks' median (pod j-worker-2, node node-c)"
        in out
    )


def test_goodput_counts_each_restart_with_its_cause():
    fake = HealedCluster(_log(datetime.now(timezone.utc)))
    g = job_status(fake, "j", "ml", "pytorchjob")["goodput"]
    assert g["runs"] == 2 and [r["cause"] for r in g["restarts"]] == [CAUSE]
    assert f"restarted itself at step 23: {CAUSE}" in format_goodput("PyTorchJob ml/j", g)


def test_a_restart_a_failed_save_a_bad_node_and_a_slow_rank_are_said_at_once():
    restart = {"event": "done", "step": 23, "max_steps": 100, "reason": "restart", "cause": CAUSE}
    failed = {
        "event": "checkpoint_failed", "step": 40, "path": "s3://b/r/step_00000040",
        "error": "s3://b/r/step_00000040/manifest.json: SlowDown: Please reduce your request "
        "rate.", "failed_in_row": 1, "limit": 3,
    }  # fmt: skip
    bad = {
        "event": "bad_node", "node": "node-a", "rank": 1, "pod": "p1", "cause": CAUSE,
        "faults": 2, "after": 2, "avoided": True, "nodes": ["node-a"], "problem": None,
    }  # fmt: skip
    unrecorded = {**bad, "faults": None, "avoided": False, "nodes": [], "problem": "403 ..."}
    preflight = {"event": "preflight", "ranks": [{}, {}], "slow": [SLOW]}
    lines = [format_event(e.pop("event"), **e) for e in map(dict, (restart, failed, bad))]
    assert urgent_lines(["plain", *lines, format_event("train", step=1)]) == [
        f"restarts itself at step 23/100: {CAUSE} (exit 138; the next run resumes from the "
        "last complete checkpoint)",
        "checkpoint @ step 40 failed: s3://b/r/step_00000040/manifest.json: SlowDown: Please "
        "reduce your request rate. (s3://b/r/step_00000040); 1 in a row, the job restarts at 3; "
        "training goes on",
        f"bad node node-a: rank 1, {CAUSE}; 2 fault(s) of this job there; its next pods avoid "
        "node-a",
    ]
    assert (
        describe(unrecorded)
        == f"bad node node-a: rank 1, {CAUSE}; not recorded on the job: 403 ..."
    )
    assert is_urgent(preflight) and not is_urgent({**preflight, "slow": []})
    assert describe(preflight) == (
        "preflight: rank 3's matmul took 4x the other ranks' median (pod j-worker-2, node node-c)"
    )
    completed = {"event": "done", "step": 100, "max_steps": 100, "reason": "completed"}
    assert not is_urgent(completed)
