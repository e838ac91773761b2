"""Mixed precision, loss scaling, EMA, torch.compile, and what happens when the loss goes NaN."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    base_env,
    checkpoints,
    common_args,
    kubeflow_env,
    read_checkpoint,
    run,
    torchrun_cmd,
    trainer_cmd,
)


def _last_ckpt(tmp: Path) -> dict:
    return read_checkpoint(checkpoints(tmp / "ckpt")[-1])


def _dtypes(record_dir: Path) -> set[str]:
    lines = (record_dir / "rank0.jsonl").read_text().splitlines()
    return {json.loads(line)["dtype"] for line in lines}


@pytest.mark.slow
@pytest.mark.parametrize("overflow", [False, True])
def test_fp16_grad_scaler_skips_overflowing_steps(tmp_path: Path, overflow: bool) -> None:
    extra = {"precision": "fp16", "task_args.record_dir": str(tmp_path / "rec")}
    if overflow:
        extra["task_args.overflow_calls"] = "[3]"
    r = run(trainer_cmd(*common_args(tmp_path, max_steps=6, **extra)))
    assert r.rc == 0, r.stderr[-2000:]
    assert _dtypes(tmp_path / "rec") == {"torch.float16"}  # autocast really ran in fp16
    state = _last_ckpt(tmp_path)
    # One overflow halves the scale (and that step's update is skipped); none keeps it.
    assert state["scaler"]["scale"] == (32768.0 if overflow else 65536.0)
    assert r.of("train")[-1]["loss_scale"] == state["scaler"]["scale"]
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # A skipped step does not count as an Adam step: 6 steps, 5 updates.
    assert int(state["optimizer"]["state"][0]["step"]) == (5 if overflow else 6)


@pytest.mark.slow
def test_bf16_autocast_trains(tmp_path: Path) -> None:
    r = run(
        trainer_cmd(
            *common_args(
                tmp_path,
                max_steps=20,
                precision="bf16",
                log_every=10,
                **{"task_args.record_dir": str(tmp_path / "rec")},
            )
        )
    )
    assert r.rc == 0, r.stderr[-2000:]
    assert _dtypes(tmp_path / "rec") == {"torch.bfloat16"}
    losses = [e["loss"] for e in r.of("train")]
    assert losses[-1] < losses[0]
    assert _last_ckpt(tmp_path)["model"]["0.weight"].dtype == torch.float32  # master weights


@pytest.mark.slow
def test_ema_is_an_exponential_average_of_the_weights(tmp_path: Path) -> None:
    r = run(
        trainer_cmd(
            *common_args(
                tmp_path,
                max_steps=3,
                ema_decay=0.5,
                **{"checkpoint.every_steps": 1, "checkpoint.keep": 5},
            )
        )
    )
    assert r.rc == 0, r.stderr[-2000:]
    s1, s2, s3 = (read_checkpoint(tmp_path / "ckpt" / f"step_{i:08d}") for i in (1, 2, 3))
    w = "0.weight"
    torch.testing.assert_close(s1["ema"]["model"][w], s1["model"][w])  # first update copies
    want = 0.5 * s1["ema"]["model"][w] + 0.5 * s2["model"][w]
    torch.testing.assert_close(s2["ema"]["model"][w], want)
    want = 0.5 * s2["ema"]["model"][w] + 0.5 * s3["model"][w]
    torch.testing.assert_close(s3["ema"]["model"][w], want)
    assert not torch.equal(s3["ema"]["model"][w], s3["model"][w])
    assert "module.0.weight" not in s3["ema"]["model"]  # no wrapper prefixes
    metrics = r.of("eval")[-1]["metrics"]
    assert {"loss", "accuracy", "ema_loss", "ema_accuracy"} <= set(metrics)


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_exit_1(tmp_path: Path) -> None:
    r = run(trainer_cmd(*common_args(tmp_path, **{"task_args.nan_calls": "[3]"})))
    assert r.rc == 1
    assert "step 3: loss is nan; stopping" in r.stdout
    done = r.of("done")[-1]
    assert done["reason"] == "nonfinite" and done["step"] == 3 and done["loss"] is None
    assert checkpoints(tmp_path / "ckpt") == []  # no checkpoint (the ledger's record is none)


@pytest.mark.slow
def test_nan_on_one_rank_is_skipped_by_all_ranks(tmp_path: Path) -> None:
    """Rank 1 alone sees NaN at steps 3 and 4: both ranks skip both steps, then go on."""
    r = run(
        torchrun_cmd(
            2,
            *common_args(
                tmp_path,
                max_nonfinite_skips=2,
                log_every=8,
                **{"task_args.nan_calls": "[3, 4]", "task_args.nan_ranks": "[1]"},
            ),
        )
    )
    assert r.rc == 0, r.stderr[-2000:]
    assert "step 3: loss is nan; skipping this step (1/2)" in r.stderr
    assert r.of("train")[-1]["nonfinite_skips"] == 2
    state = _last_ckpt(tmp_path)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert int(state["optimizer"]["state"][0]["step"]) == 6  # 8 steps, 2 skipped


@pytest.mark.slow
def test_nan_beyond_the_skip_budget_stops(tmp_path: Path) -> None:
    r = run(
        trainer_cmd(
            *common_args(tmp_path, max_nonfinite_skips=1, **{"task_args.nan_calls": "[2, 5]"})
        )
    )
    assert r.rc == 1
    assert "step 5: loss is nan; stopping (max_nonfinite_skips=1)" in r.stdout


@pytest.mark.slow
def test_failure_exit_code_survives_the_kubeflow_relaunch(tmp_path: Path) -> None:
    """nprocPerNode=2: the NaN stop (exit 1) comes back through torchrun as 1, not 143 or 0."""
    r = run(
        trainer_cmd(*common_args(tmp_path, **{"task_args.nan_calls": "[2]"})),
        env=kubeflow_env(nproc_per_node=2, world_size=2),
    )
    assert r.rc == 1
    assert "step 2: loss is nan; stopping" in r.stdout
    assert r.of("done")[-1]["reason"] == "nonfinite"


@pytest.mark.long
@pytest.mark.slow
def test_compiled_model_trains_to_a_finite_loss(tmp_path: Path) -> None:
    """compile=true for real: Dynamo hands the training step's forward and backward graphs to
    inductor, which compiles them (or loads them from its FX graph cache, where a run on this
    machine compiled the same graphs before: the C++ compile is most of a cold run's CPU), and
    two steps end at a finite loss. Dynamo's and inductor's INFO logs say which."""
    args = common_args(tmp_path, compile="true", max_steps=2, log_every=1, eval_batches=1)
    r = run(trainer_cmd(*args), env=base_env(TORCH_LOGS="dynamo,inductor"), timeout=600)
    assert r.rc == 0, r.stderr[-3000:]
    assert r.of("start")[0]["config"]["compile"] is True
    done = r.of("done")[-1]
    assert done["reason"] == "completed" and done["step"] == 2
    assert math.isfinite(done["loss"]) and all(math.isfinite(e["loss"]) for e in r.of("train"))
    step = [line for line in r.stderr.splitlines() if "] [0/0] " in line]  # the first frame
    assert any("Step 2: done compiler function inductor" in line for line in step), r.stderr
    graphs = [line for line in step if re.search(r"fx graph cache (hit|miss) for key", line)]
    assert len(graphs) == 2, r.stderr  # forward and backward, each compiled or loaded
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # imports inductor: 1 s

    assert list(Path(cache_dir()).rglob("*.py")), "inductor's cache holds no generated code"
