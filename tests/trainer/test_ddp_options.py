"""What each ``ddp.*`` field does to a real 2-rank gloo run: ``find_unused_parameters``,
``broadcast_buffers: false``, and ``bucket_cap_mb`` with ``gradient_as_bucket_view``.

The runs are the real ``Trainer.fit`` in two processes (``spawn_ranks``, or torchrun where the run
is to fail); what each test reads is DDP's own doing: the buckets its communication hook is
given, where the gradients the optimizer steps with live, the buffers each rank evaluates with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.conftest import (
    TEST_TASK,
    common_args,
    free_port,
    one_of_two_ranks,
    read_checkpoint,
    run,
    spawn_ranks,
    torchrun_cmd,
)
from tests.trainer.tasks import build as build_task
from trainer import distributed
from trainer.distributed import StepFlags
from trainer.tasks.vision import VisionTask

VISION = {"image_size": 8, "width": 8, "train_size": 256, "eval_size": 64}


def _observing_worker(rank: int, port: int, out_dir: str, settings: dict[str, Any]) -> None:
    """One rank trains with ``settings`` and writes what it saw to ``rank<R>.json``: each step's
    buckets (their buffers, from inside DDP's communication hook) against the storage of the
    gradients the optimizer steps with; the hook's calls and all-reduce rounds; whether DDP
    broadcasts the buffers before every forward; the buffers as each evaluation starts."""
    buckets: set[int] = set()
    hook = StepFlags.hook

    def watching_hook(self, state, bucket):  # no annotations: DDP inspects them
        buckets.add(bucket.buffer().untyped_storage().data_ptr())
        return hook(self, state, bucket)

    StepFlags.hook = watching_hook  # before the trainer registers its hook with DDP
    trainer = one_of_two_ranks(rank, port, settings)
    try:
        steps: list[dict[str, int]] = []

        def before_step(*_) -> None:
            grads = [p.grad.untyped_storage().data_ptr() for p in trainer.raw_model.parameters()]
            in_buckets = sum(g in buckets for g in grads)
            steps.append({"grads": len(grads), "in_buckets": in_buckets, "buckets": len(buckets)})
            buckets.clear()

        trainer.optimizer.register_step_pre_hook(before_step)
        at_eval: list[list[float]] = []
        evaluate = trainer.evaluator.evaluate

        def observed_evaluate(model):
            at_eval.append([float(b.double().sum()) for b in model.buffers()])
            return evaluate(model)

        trainer.evaluator.evaluate = observed_evaluate
        assert trainer.fit() == "completed"
        flags = trainer.step_flags
        out = {
            "steps": steps,
            "calls": flags.calls,
            "rounds": flags.rounds,
            "per_forward": trainer.model.will_sync_module_buffers(),
            "at_eval": at_eval,
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        distributed.teardown()


def _train_two_ranks(out: Path, **settings: Any) -> list[dict[str, Any]]:
    settings = {
        "task": TEST_TASK,
        "max_steps": 4,
        "batch_size": 8,
        "eval_batches": 1,
        "checkpoint": {"dir": str(out / "ckpt"), "every_steps": 0},
        **settings,
    }
    out.mkdir(parents=True, exist_ok=True)
    spawn_ranks(_observing_worker, (free_port(), str(out), settings))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_find_unused_parameters_lets_a_model_with_an_unused_layer_train(tmp_path: Path) -> None:
    """A layer that gets no gradient: without the field DDP waits for it and refuses the second
    step (its "Expected to have finished reduction in the prior iteration"); with it, the run
    completes and the layer is left as it was built."""
    unused = {"task_args.unused_layer": True, "ddp.find_unused_parameters": True}
    trained = run(torchrun_cmd(2, *common_args(tmp_path, max_steps=2, **unused)))
    assert trained.rc == 0, trained.stderr[-3000:]
    done = trained.of("done")[-1]
    assert (done["reason"], done["step"]) == ("completed", 2)
    state = read_checkpoint(tmp_path / "ckpt" / "step_00000002")["model"]
    torch.manual_seed(0)  # as the trainer built it (seed=0)
    init = build_task(unused_layer=True).build_model().state_dict()
    assert torch.equal(state["spare.weight"], init["spare.weight"])
    assert not torch.equal(state["model.0.weight"], init["model.0.weight"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "task", ["vision", "tests.trainer.test_ddp_equivalence:_VisionWithACounter"]
)
def test_broadcast_buffers_false_leaves_each_rank_its_own_buffers(tmp_path: Path, task) -> None:
    """BatchNorm statistics move with each rank's own batches. By default rank 0's reach every
    rank, before each evaluation (BatchNorm's only) or before every forward (a model with any
    other buffer): tests/trainer/test_ddp_equivalence.py. With the field false nothing is
    broadcast, and the ranks evaluate with buffers of their own."""
    ranks = _train_two_ranks(
        tmp_path, task=task, task_args=VISION, ddp={"broadcast_buffers": False}
    )
    assert [r["per_forward"] for r in ranks] == [False, False]
    (r0,), (r1,) = (r["at_eval"] for r in ranks)
    assert len(r0) == len(r1) >= len(list(VisionTask(**VISION).build_model().buffers()))
    assert r0 != r1


@pytest.mark.slow
def test_a_smaller_bucket_cap_cuts_the_gradients_into_more_buckets_and_they_hold_the_grads(
    tmp_path: Path,
) -> None:
    """The test task's model (hidden=64: 3.3 KiB of fp32 gradients) fits one default bucket
    (25 MiB): one hook call a step. Capped at 1 KiB it takes more from the second step on (DDP
    starts with one bucket and sizes them after the first step), each a call of the trainer's
    hook, and the step's flags still ride in the last one only (one round a step).

    ``gradient_as_bucket_view`` (true by default): in the default run every gradient the
    optimizer steps with lives in one of the buckets DDP all-reduced that step; the capped run
    sets it false, and none does (DDP copies the buckets into gradients of their own)."""
    wide = {"task_args": {"hidden": 64}}
    default = _train_two_ranks(tmp_path / "default", **wide)
    capped = _train_two_ranks(
        tmp_path / "capped",
        **wide,
        ddp={"bucket_cap_mb": 1 / 1024, "gradient_as_bucket_view": False},
    )
    for d, c in zip(default, capped, strict=True):
        assert [s["buckets"] for s in d["steps"]] == [1, 1, 1, 1]
        assert all(s["buckets"] >= 2 for s in c["steps"][1:]), c["steps"]
        assert d["calls"] == d["rounds"] == c["rounds"] == 4
        assert c["calls"] == sum(s["buckets"] for s in c["steps"])
        assert all(s["in_buckets"] == s["grads"] for s in d["steps"]), d["steps"]
        assert [s["in_buckets"] for s in c["steps"]] == [0, 0, 0, 0], c["steps"]
