"""A job that heals itself, as real processes: a stuck job restarts itself (every rank exits 138,
naming the stuck rank, its node and frame) and the next run resumes from the last checkpoint and
ends at ``max_steps``; a lost rank is named, with its node, by rank 0. The restart's wording on
its own: ``trainer.health.restart.stuck_cause``."""

from __future__ import annotations

import inspect
import json
import socket
from pathlib import Path

import pytest

from tests.trainer import tasks
from tests.trainer.conftest import common_args, follow_pods, kubeflow_env, run, trainer_cmd
from trainer.contract import BAD_NODE, EXIT_PEER_LOST, EXIT_RESTART, GOODPUT
from trainer.health.restart import stuck_cause

HANG_LINE = next(
    n
    for n, text in enumerate(
        inspect.getsourcelines(tasks.hang_here)[0], tasks.hang_here.__code__.co_firstlineno
    )
    if "time.sleep" in text
)
NODE = "node-x"


def _pod(tmp_path: Path, **task_args: object) -> tuple[dict[str, str], list[str]]:
    """One pod of two processes (its own torchrun), on node ``NODE``: rank 1 hangs in its 10th
    step for ten minutes when asked; a checkpoint every 4 steps."""
    env = kubeflow_env(nproc_per_node=2, world_size=2) | {"NODE_NAME": NODE}
    args = common_args(
        tmp_path,
        max_steps=12,
        log_every=2,
        timeout_s=300,
        **{
            "checkpoint.every_steps": 4,
            "watchdog.stuck_after_s": 2,
            "watchdog.restart_after_s": 3,
            "watchdog.straggler_factor": 0,
        },
    )
    return env, [*args, "task_args=" + json.dumps(task_args)]


@pytest.mark.slow
def test_a_stuck_job_restarts_itself_and_the_next_run_ends_at_max_steps(tmp_path: Path) -> None:
    env, args = _pod(tmp_path, hang_rank=1, hang_call=10, hang_s=600)
    stuck = run(trainer_cmd(*args), env=env, timeout=240)
    assert stuck.rc == EXIT_RESTART, stuck.stderr[-3000:]
    (verdict,) = [e for e in stuck.of("stuck") if "culprit" in e]
    cause = f"stuck: rank 1 in tasks.py:hang_here on node {NODE}"
    (done,) = stuck.of("done")
    assert done["reason"] == "restart" and done["cause"] == cause and done["step"] == 9
    assert stuck.events.index(done) > stuck.events.index(verdict)
    (ended,) = [r for r in stuck.of(GOODPUT)[-1]["runs"] if r["end"] is not None]
    assert (ended["end"], ended["cause"]) == ("restart", cause)
    assert [c["step"] for c in stuck.of("checkpoint")] == [4, 8]
    # Every rank's last words name the stuck rank, its node, pod and line, and the setting.
    host = socket.gethostname()
    words = f"{cause} (pod {host}, line {HANG_LINE}, no progress for "
    for rank in (0, 1):
        (line,) = [x for x in stuck.stderr.splitlines() if x.startswith(f"[rank {rank}] {cause}")]
        assert line.startswith(f"[rank {rank}] {words}"), line
        assert line.endswith(
            "watchdog.restart_after_s: 3); exiting 138 so that the job restarts and resumes "
            "from its last complete checkpoint"
        )

    resumed = run(trainer_cmd(*args), env=env, timeout=240)
    assert resumed.rc == 0, resumed.stderr[-3000:]
    (note,) = resumed.of("resume")
    assert note["step"] == 8
    assert [e["step"] for e in resumed.of("train")] == [10, 12]
    assert resumed.of("done")[0]["reason"] == "completed"
    runs = resumed.of(GOODPUT)[-1]["runs"]
    assert [(r["end"], r["cause"]) for r in runs] == [("restart", cause), ("completed", None)]


@pytest.mark.slow
def test_with_restart_after_s_0_the_process_groups_timeout_ends_a_stuck_job(
    tmp_path: Path,
) -> None:
    """Off: the verdict stands until the collective fails after ``timeout_s`` (a lost peer),
    and nothing restarts the job before."""
    env, args = _pod(tmp_path, hang_rank=1, hang_call=10, hang_s=600)
    args += ["watchdog.restart_after_s=0", "timeout_s=20"]
    r = run(trainer_cmd(*args), env=env, timeout=240)
    assert r.rc == EXIT_PEER_LOST, r.stderr[-3000:]
    assert [e for e in r.of("stuck") if "culprit" in e]  # named, as ever
    (done,) = r.of("done")
    assert done["reason"] == "peer_lost" and "cause" not in done
    assert "exiting 138 so that the job restarts" not in r.stderr


def test_the_cause_names_the_rank_where_it_is_and_its_node() -> None:
    frame = {"file": "/code/hangtask.py", "line": 3, "function": "_stuck_here"}
    verdict = {"culprit": 1, "frame": frame, "node": "X", "pod": "p", "waiting": [0]}
    assert stuck_cause(verdict) == "stuck: rank 1 in hangtask.py:_stuck_here on node X"
    assert stuck_cause({**verdict, "node": None}) == (
        "stuck: rank 1 in hangtask.py:_stuck_here on host p"
    )
    silent = {"culprit": 2, "silent": [2], "frame": None, "waiting": [0, 1]}
    assert stuck_cause(silent) == "stuck: rank 2 does not answer"
    level = {"culprit": None, "waiting": [0, 1], "in_collective": "barrier", "frame": None}
    assert stuck_cause(level) == "stuck: every rank waits in barrier, none behind"
    alone = {"culprit": None, "waiting": [], "frame": frame, "node": "X"}
    assert stuck_cause(alone) == (
        "stuck: every rank, in its own code; rank 0 in hangtask.py:_stuck_here on node X"
    )


@pytest.mark.slow
def test_a_lost_rank_is_named_with_its_node_by_rank_0(tmp_path: Path) -> None:
    """Two pods of one process each on two nodes; rank 1's process is killed (-9) mid-run: rank
    0 exits 138 and names rank 1 and its node in a ``bad_node`` event (outside a cluster it
    cannot record it on a job, and says why)."""
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    envs = [
        master | {"NODE_NAME": "node-a"},
        master | {"RANK": "1", "PET_NODE_RANK": "1", "NODE_NAME": "node-b"},
    ]
    args = common_args(tmp_path, max_steps=400, log_every=1, timeout_s=120)
    args.append("task_args=" + json.dumps({"sleep_s": 0.05}))

    def kill_rank_1(event: dict, procs: list) -> None:
        if event["event"] == "train" and event["step"] == 3:
            procs[1].kill()

    r0, _ = follow_pods(envs, args, kill_rank_1, timeout=120)
    assert r0.rc == EXIT_PEER_LOST, r0.stderr[-3000:]
    (bad,) = r0.of(BAD_NODE)
    assert (bad["rank"], bad["node"], bad["pod"]) == (1, "node-b", socket.gethostname())
    assert bad["cause"].startswith("lost: rank 1 (")
    assert bad["problem"].startswith("not in a ddpjob pod")
