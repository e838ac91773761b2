"""DDP is the same math as one big process, and talks once per optimizer step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    TEST_TASK,
    checkpoints,
    common_args,
    free_port,
    one_of_two_ranks,
    read_checkpoint,
    run,
    spawn_ranks,
    torchrun_cmd,
    trainer_cmd,
)
from trainer import distributed as trainer_dist


def _final_params(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(checkpoints(ckpt_dir)[-1])["model"]


@pytest.mark.slow
# Two ranks with accumulation and four without: each holds the plain two-rank case too.
@pytest.mark.parametrize(("nproc", "grad_accum"), [(2, 3), (4, 1)])
def test_n_ranks_of_b_equal_one_process_of_n_times_b(
    tmp_path: Path, nproc: int, grad_accum: int
) -> None:
    # 256 samples / (16 x grad_accum) per step: 10 steps cross at least one epoch boundary.
    args = dict(max_steps=10, grad_accum=grad_accum, **{"checkpoint.every_steps": 0})
    one = run(trainer_cmd(*common_args(tmp_path / "one", batch_size=16, **args)))
    two = run(torchrun_cmd(nproc, *common_args(tmp_path / "two", batch_size=16 // nproc, **args)))
    assert one.rc == 0, one.stderr[-2000:]
    assert two.rc == 0, two.stderr[-2000:]
    assert two.of("start")[0]["world_size"] == nproc
    a, b = _final_params(tmp_path / "one" / "ckpt"), _final_params(tmp_path / "two" / "ckpt")
    assert a.keys() == b.keys()
    init = torch.nn.Linear(8, 16)  # sanity: training moved the weights far from any init
    assert not torch.allclose(a["0.weight"], init.weight, atol=1e-2)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    # The logged global loss agrees too (mean over ranks == mean over the big batch).
    la = [e["loss"] for e in one.of("train")]
    lb = [e["loss"] for e in two.of("train")]
    assert la == pytest.approx(lb, rel=1e-5)


def _hook_worker(rank: int, port: int, out_dir: str, grad_accum: int, max_steps: int) -> None:
    settings = {
        "task": TEST_TASK,
        "max_steps": max_steps,
        "batch_size": 4,
        "grad_accum": grad_accum,
        "checkpoint": {"dir": f"{out_dir}/ckpt", "every_steps": 0},
        "log_every": 1,
    }
    trainer = one_of_two_ranks(rank, port, settings)
    try:
        # Every all-reduce DDP does goes through the trainer's hook (StepFlags), which also
        # carries the step's [loss, stop]: there is no other per-step collective to count.
        calls = []
        real_all_reduce = torch.distributed.all_reduce

        def counting_all_reduce(*args, **kwargs):
            calls.append(1)
            return real_all_reduce(*args, **kwargs)

        real_eval = trainer.evaluator.run

        def uncounted_eval(step: int) -> None:  # the final evaluation's all-reduces are not steps
            torch.distributed.all_reduce = real_all_reduce
            try:
                real_eval(step)
            finally:
                torch.distributed.all_reduce = counting_all_reduce

        trainer.evaluator.run = uncounted_eval
        torch.distributed.all_reduce = counting_all_reduce
        try:
            assert trainer.fit() == "completed"
        finally:
            torch.distributed.all_reduce = real_all_reduce
        flags = trainer.step_flags
        counts = {"calls": flags.calls, "rounds": flags.rounds, "all_reduces": len(calls)}
        counts["micro_batches"] = trainer.batches.position()[1]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(counts))
    finally:
        trainer_dist.teardown()


@pytest.mark.slow
def test_one_allreduce_round_per_optimizer_step(tmp_path: Path) -> None:
    max_steps, grad_accum = 5, 3
    spawn_ranks(_hook_worker, (free_port(), str(tmp_path), grad_accum, max_steps))
    for rank in (0, 1):
        counts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert counts["micro_batches"] == max_steps * grad_accum  # 15 backward passes ...
        assert counts["rounds"] == max_steps  # ... but only 5 all-reduce rounds
        # The tiny model fits one bucket: no all-reduce at all in the no_sync micro-batches,
        # and none besides DDP's own (the loss and stop flag ride in its bucket).
        assert counts["calls"] == max_steps
        assert counts["all_reduces"] == max_steps


class _VisionWithACounter:
    """The vision task whose model also holds a buffer that is not a BatchNorm statistic."""

    def __new__(cls, **kwargs):
        from trainer.tasks.vision import VisionTask

        task = VisionTask(**kwargs)
        build = task.build_model

        def build_model():
            model = build()
            model.register_buffer("seen", torch.zeros(()))
            return model

        task.build_model = build_model
        return task


def _buffers_worker(rank: int, port: int, out_dir: str, task: str) -> None:
    settings = {
        "task": task,
        "task_args": {"image_size": 8, "width": 8, "train_size": 256, "eval_size": 64},
        "max_steps": 4,
        "batch_size": 8,
        "eval_batches": 1,
        "ema_decay": 0.5,
        "checkpoint": {"dir": f"{out_dir}/ckpt", "every_steps": 0},
    }
    trainer = one_of_two_ranks(rank, port, settings)
    try:
        seen: dict[str, list[list[float]]] = {"before_eval": [], "at_eval": []}

        def stats(model) -> list[float]:
            return [float(b.double().sum()) for b in model.buffers()]

        evaluator = trainer.evaluator
        real_run, real_evaluate = evaluator.run, evaluator.evaluate

        def run(step: int) -> None:
            seen["before_eval"].append(stats(trainer.raw_model))
            real_run(step)

        def evaluate(model):
            seen["at_eval"].append(stats(model))
            return real_evaluate(model)

        evaluator.run, evaluator.evaluate = run, evaluate
        assert trainer.fit() == "completed"
        out = {"per_forward": trainer.model.will_sync_module_buffers(), **seen}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        trainer_dist.teardown()


@pytest.mark.slow
def test_batchnorm_statistics_are_rank_0s_at_eval_without_a_broadcast_every_forward(
    tmp_path: Path,
) -> None:
    """DDP's broadcast of the buffers before every forward is a collective a step (about a
    quarter of the bench's step on CPU); a BatchNorm-only model has rank 0's statistics
    broadcast before each evaluation instead, so every rank evaluates the checkpointed model."""
    spawn_ranks(_buffers_worker, (free_port(), str(tmp_path), "vision"))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert not r0["per_forward"] and not r1["per_forward"]
    # Each rank's statistics moved with its own batches: they differ before the evaluation ...
    assert r0["before_eval"] != r1["before_eval"]
    # ... and at it, both ranks' model and EMA hold rank 0's.
    (final,) = r0["before_eval"]
    assert r0["at_eval"] == r1["at_eval"] == [final, final]


@pytest.mark.slow
def test_a_buffer_that_is_not_a_batchnorm_statistic_is_broadcast_every_forward(
    tmp_path: Path,
) -> None:
    task = "tests.trainer.test_ddp_equivalence:_VisionWithACounter"
    spawn_ranks(_buffers_worker, (free_port(), str(tmp_path), task))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["per_forward"] and r1["per_forward"]
