"""Real Trainers, one after another, on one process group: what the strategy tests run inside the
ranks of ``spawn_ranks`` (and in the test's own process, for one rank), so that many runs cost one
start of their processes.

    spawn_ranks(run_all, (port, world_size, out_dir, runs, env), nprocs=world_size)

``runs`` is a list of ``(name, settings)``; ``run_all`` writes rank 0's results to
``out_dir/<name>.json``: every step's loss, the counted non-finite skips, the resume event's step
and the checkpoints it skipped,
the whole weights (and EMA's) right after the Trainer was built and at the end.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import torch

from tests.trainer.conftest import CPU


def join(rank: int, world_size: int, port: int, env: dict[str, str] | None = None) -> Any:
    """This process as rank ``rank`` of ``world_size`` gloo ranks (plus ``env``)."""
    from trainer import distributed

    os.environ |= {
        **(env or {}),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return distributed.setup("cpu", "gloo", 60)


def alone() -> Any:
    """This process as the one rank of a run without a process group."""
    from trainer.distributed import DistEnv

    return DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def train(settings: dict[str, Any], env: Any, preempt_at: int | None = None) -> dict[str, Any]:
    """Build a Trainer for ``settings`` on ``env`` and train it to the end, or with
    ``preempt_at`` until that step, as a SIGTERM during it would stop it (and checkpoint)."""
    from trainer.config import build_config
    from trainer.tasks import load_task
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    cfg = build_config({**CPU, "progress": "never", **settings})
    task = load_task(cfg.task, cfg.task_args)
    reporter = Reporter(False, 0, "never", None)
    events: list[tuple[str, dict[str, Any]]] = []
    reporter.event = lambda name, **fields: events.append((name, fields))
    trainer = Trainer(cfg, env, task, reporter)
    resumes = [fields for name, fields in events if name == "resume"]
    start = whole(trainer.raw_model)
    losses: list[float] = []
    advance = trainer.report.advance

    def advanced(step: int, loss: float) -> None:
        losses.append(loss)
        advance(step, loss)
        if step + 1 == preempt_at:  # the next step carries the stop flag to every rank
            trainer.stop.on_sigterm(signal.SIGTERM, None)

    trainer.report.advance = advanced
    assert trainer.fit() == ("completed" if preempt_at is None else "preempted")
    return {
        "resumed": resumes[0]["step"] if resumes else None,
        "skipped": resumes[0]["skipped"] if resumes else [],
        "losses": losses,
        "skips": trainer.skips.count,
        "start": start,
        "weights": whole(trainer.raw_model),
        "ema": whole(trainer.ema.module) if trainer.ema is not None else None,
        "sharded": type(trainer.raw_model).__name__.startswith("FSDP"),
    }


def whole(model: torch.nn.Module) -> dict[str, list]:
    """The model's whole floating-point weights, gathered from the shards under fsdp (on rank 0;
    collective), as lists."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if torch.distributed.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
    else:
        state = model.state_dict()
    return {k: v.tolist() for k, v in state.items() if v.is_floating_point()}


def run_all(
    rank: int,
    port: int,
    world_size: int,
    out_dir: str,
    runs: list[tuple[str, dict[str, Any]]] | list[tuple[str, dict[str, Any], int | None]],
    env: dict[str, str] | None = None,
) -> None:
    """A ``spawn_ranks`` worker: every run of ``runs`` (``(name, settings)``, or with the step
    to preempt it at, as :func:`train` takes it) in turn on one process group."""
    from trainer import distributed

    dist_env = join(rank, world_size, port, env)
    try:
        for name, settings, *preempt_at in runs:
            result = train(settings, dist_env, *preempt_at)
            if rank == 0:
                Path(out_dir, f"{name}.json").write_text(json.dumps(result))
    finally:
        distributed.teardown()


def result(out_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((out_dir / f"{name}.json").read_text())


def same(a: dict[str, list], b: dict[str, list], what: str, rtol: float, atol: float) -> None:
    """Two sets of whole weights agree, tensor by tensor."""
    assert a.keys() == b.keys(), what
    for k in a:
        torch.testing.assert_close(
            torch.tensor(a[k]), torch.tensor(b[k]), rtol=rtol, atol=atol, msg=f"{what}: {k}"
        )
