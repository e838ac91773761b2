"""Strategy fsdp is the same math as ddp and as one process of n times the batch, on real gloo
ranks: the same losses step by step and the same weights at the end, within fp32's rounding
(the gradients are summed in another order: a reduce-scatter, not an all-reduce).

Every two-rank case runs in one launch, one Trainer after another on the same process group; the
one-process references run in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import TEST_TASK, free_port, spawn_ranks
from tests.trainer.trainers import alone, result, run_all, same, train

#: fp32 on CPU: the gradients' sum in another order moves a weight by a few ulps a step.
RTOL, ATOL = 1e-5, 1e-6

LM = {"task": "lm", "task_args": {"n_layer": 2, "n_embd": 32, "block_size": 16, "dropout": 0.0}}
VISION = {
    "task": "vision",
    "task_args": {"image_size": 8, "width": 8, "train_size": 256, "eval_size": 64},
}
#: A NaN loss at the fifth micro-batch (step 3's first), one skip allowed.
NAN = {"task": TEST_TASK, "task_args": {"nan_calls": [5]}, "max_nonfinite_skips": 1}

#: The runs on two ranks.
CASES: dict[str, dict[str, Any]] = {
    "lm-ddp": {**LM, "ema_decay": 0.9},
    "lm-fsdp": {**LM, "ema_decay": 0.9, "strategy": "fsdp"},
    # Recomputed activations and the clip folded into fused AdamW's step: the same update.
    "lm-fsdp-recomputed": {
        **LM,
        "ema_decay": 0.9,
        "strategy": "fsdp",
        "activation_checkpointing": True,
        "fused_clip": True,
    },
    # Each micro-batch's gradients reduce-scattered: sharded gradients accumulate.
    "lm-fsdp-reduce-each": {
        **LM,
        "ema_decay": 0.9,
        "strategy": "fsdp",
        "fsdp": {"reduce_each_micro_batch": True},
    },
    "vision-ddp": VISION,
    "vision-fsdp": {**VISION, "strategy": "fsdp"},
    "nan-ddp": NAN,
    "nan-fsdp": {**NAN, "strategy": "fsdp"},
}


def _settings(case: dict[str, Any], ckpt: Path, batch_size: int) -> dict[str, Any]:
    """Six steps of two micro-batches of ``batch_size`` a rank, the gradient clipped."""
    return {
        "max_steps": 6,
        "batch_size": batch_size,
        "grad_accum": 2,
        "grad_clip": 0.5,
        "lr": 3e-3,
        "log_every": 1,
        "eval_batches": 1,
        "checkpoint": {"dir": str(ckpt), "every_steps": 0},
        **case,
    }


@pytest.mark.slow
def test_fsdp_on_two_ranks_is_ddp_and_one_process_of_twice_the_batch(tmp_path: Path) -> None:
    runs = [(name, _settings(case, tmp_path / name, 4)) for name, case in CASES.items()]
    spawn_ranks(run_all, (free_port(), 2, str(tmp_path), runs))
    got = {name: result(tmp_path, name) for name in CASES}
    lm_one = train(_settings(CASES["lm-ddp"], tmp_path / "lm-one", 8), alone())
    nan_one = train(_settings(NAN, tmp_path / "nan-one", 8), alone())

    for name in CASES:
        assert got[name]["sharded"] == name.startswith(("lm-fsdp", "vision-fsdp", "nan-fsdp"))
    assert lm_one["losses"][-1] < lm_one["losses"][0] - 0.1  # the lm runs learn something

    for name in ("lm-fsdp", "lm-fsdp-recomputed", "lm-fsdp-reduce-each"):
        for ref, what in ((got["lm-ddp"], "ddp"), (lm_one, "one process")):
            run = got[name]
            assert run["losses"] == pytest.approx(ref["losses"], rel=RTOL), (name, what)
            same(run["weights"], ref["weights"], f"{name} vs {what}", RTOL, ATOL)
            same(run["ema"], ref["ema"], f"{name}'s EMA vs {what}", RTOL, ATOL)

    # BatchNorm normalises each rank's batch by its own statistics: two ranks of b are not one
    # process of 2b, but fsdp's two ranks are ddp's.
    vision, ddp = got["vision-fsdp"], got["vision-ddp"]
    assert vision["losses"] == pytest.approx(ddp["losses"], rel=RTOL)
    same(vision["weights"], ddp["weights"], "vision fsdp vs ddp", RTOL, ATOL)

    # A NaN loss on one micro-batch: the step is skipped on every rank alike, and counted.
    for run in (got["nan-fsdp"], got["nan-ddp"], nan_one):
        assert run["skips"] == 1
        assert [x != x for x in run["losses"]] == [False, False, True, False, False, False]
    same(got["nan-fsdp"]["weights"], got["nan-ddp"]["weights"], "nan fsdp vs ddp", RTOL, ATOL)
    same(got["nan-fsdp"]["weights"], nan_one["weights"], "nan fsdp vs one", RTOL, ATOL)
