"""What ``timeout_s`` and ``grad_clip: 0`` do to a real run: how and when a stuck rank's peer
fails (two Kubeflow-style pods), and what reaches the optimizer (its state in the checkpoint).
``deterministic`` and ``num_workers`` ride in test_resume.py's kill -9 run.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import (
    REPO,
    checkpoints,
    common_args,
    kubeflow_env,
    parse_events,
    read_checkpoint,
    run,
    trainer_cmd,
)
from tests.trainer.tasks import HANGS


def _final_state(ckpt_dir: Path) -> dict:
    return read_checkpoint(checkpoints(ckpt_dir)[-1])


@pytest.mark.slow
def test_a_collective_stuck_past_timeout_s_fails_as_a_lost_peer_after_about_that_long(
    tmp_path: Path,
) -> None:
    """Rank 1 hangs before its third step's all-reduce (it says when on stderr, then sleeps);
    rank 0 waits in that all-reduce, which fails after ``timeout_s``, and exits 138 (retryable)
    on the peer-lost path.

    The bounds: rank 0 cannot fail before the timeout has run from when it entered the
    all-reduce, which is at most the few milliseconds of rank 1's step bookkeeping before the
    hang is said (5 s of slack here). After the timeout it only prints two lines and exits,
    without training or teardown: 120 s is room for a heavily loaded 2-core machine, and
    still far below the 600 s default a run that ignored the field would wait."""
    timeout_s = 10
    extra = {"task_args.hang_rank": 1, "task_args.hang_call": 3, "task_args.hang_s": 3600}
    args = common_args(tmp_path, max_steps=50, log_every=1, timeout_s=timeout_s, **extra)
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
    procs = [
        subprocess.Popen(
            trainer_cmd(*args),
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for env in (master, worker)
    ]
    try:
        out, err = procs[0].communicate(timeout=300)
        ended = time.time()
    finally:
        for p in procs:
            p.kill()
        said = [p.communicate()[1] for p in procs]
    assert procs[0].returncode == 138, err[-3000:]
    (hung,) = [line for line in said[1].splitlines() if line.startswith(HANGS)]
    waited = ended - float(hung.removeprefix(HANGS))
    assert timeout_s - 5 <= waited < timeout_s + 120, waited
    assert "lost a peer" in err and "Traceback" not in err
    events = parse_events(out)
    assert [e["step"] for e in events if e["event"] == "train"] == [1, 2]
    assert events[-1]["event"] == "done" and events[-1]["reason"] == "peer_lost"


@pytest.mark.slow
def test_grad_clip_0_lets_a_gradient_above_the_clip_reach_the_optimizer(tmp_path: Path) -> None:
    """One step with a gradient norm far above the default clip of 1 (the loss scaled by 50).
    AdamW's first moment after one step is (1 - beta1) * the gradient it got, so the checkpoint
    says what reached the optimizer: the whole gradient, not one clipped to norm 1."""
    extra = {"task_args.loss_scale": 50, "eval_batches": 1}
    args = common_args(tmp_path, max_steps=1, log_every=1, grad_clip=0, **extra)
    r = run(trainer_cmd(*args))
    assert r.rc == 0, r.stderr[-3000:]
    (train,) = r.of("train")
    assert train["grad_norm"] > 10  # the norm backward produced (before any clipping)
    state = _final_state(tmp_path / "ckpt")
    beta1 = state["optimizer"]["param_groups"][0]["betas"][0]
    moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
    reached = math.sqrt(sum(float(m.square().sum()) for m in moments)) / (1 - beta1)
    assert reached == pytest.approx(train["grad_norm"], rel=1e-4)
