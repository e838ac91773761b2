"""nanoGPT's training loop, written out here: the GPU check's baseline (not vendored).

    python -m bench.gpu.baseline --model nanogpt task=lm task_args.n_layer=12 batch_size=32 \
        precision=bf16 compile=true device=cuda                 # nanoGPT's model and loop
    python -m bench.gpu.baseline --model ddpjob ...             # the lm task's model, this loop

The settings are the trainer's own ``key=value`` (validated by the same ``TrainConfig``), so
``bench/gpu/check.py`` hands each bare run exactly the settings of the trainer run it is compared
with. Of those, this loop uses what nanoGPT's ``train.py`` has: the model's shape and dropout
(``task_args``), ``batch_size``, ``grad_accum``, ``max_steps``, ``precision``, ``compile``,
``tf32``, ``lr``/``warmup_steps``/``min_lr_ratio`` (nanoGPT's ``get_lr``: linear warmup, then
cosine down to the floor), ``betas``, ``weight_decay``, ``grad_clip``, ``seed``, ``device`` and
``log_every``. Nothing else: one process, no DDP, no checkpoint, no eval, no EMA.

One iteration, as nanoGPT's ``train.py`` runs it: set the lr of every param group; for each
micro-step, forward under autocast to ``(logits, loss)``, draw the next batch (random windows of
the corpus, pinned, copied with ``non_blocking``) while the GPU works, backward through a
GradScaler (enabled for fp16 only); then unscale, clip, step, update, ``zero_grad(set_to_none)``.
AdamW is nanoGPT's: decay on 2-D weights only, fused on CUDA. The host reads the loss once per
log window (nanoGPT's ``loss.item()`` every ``log_interval``). Windows are timed with the
trainer's own clock (``trainer.parts.window.StepClock``: a device synchronize, then the time) at the
same point of a step as the trainer's: after the window's last update, before its event is
printed, and the next window starts at that reading.

It prints the trainer's JSON-lines events (``start``, ``train``, ``done``) through
``trainer.telemetry.events.Reporter`` (so ``train`` events carry NVML readings), and
``gpu_check`` reads them as it reads the trainer's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODELS = ("nanogpt", "ddpjob")
# The task name each model's runs report in their `start` event (gpu_check counts FLOPs by it).
TASK_OF = {"nanogpt": "bench.gpu.nanogpt:build", "ddpjob": "lm"}


def get_lr(it: int, lr: float, warmup_iters: int, lr_decay_iters: int, min_lr: float) -> float:
    """nanoGPT's schedule: linear warmup, then cosine decay to ``min_lr``."""
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (lr - min_lr)


def configure_optimizer(model, weight_decay: float, lr: float, betas, device_type: str):
    """nanoGPT's ``configure_optimizers``: 2-D weights decay, the rest not; fused on CUDA."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)


def build_task(model: str, task_args: dict):
    """The task whose data (the lm corpus) and model this run trains."""
    from bench.gpu.nanogpt import NanoGPTTask
    from trainer.tasks.lm import LMTask

    return (NanoGPTTask if model == "nanogpt" else LMTask)(**task_args)


def train(model_name: str, cfg, stream=None) -> dict:
    """Run the loop; print the events; return the ``done`` event's fields."""
    import torch

    from trainer.parts.window import StepClock
    from trainer.telemetry.events import Reporter

    device_type = "cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    device = torch.device(device_type)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.manual_seed(cfg.seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    ctx = (
        torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    )

    task = build_task(model_name, cfg.task_args)
    block_size, batch_size = task.block_size, cfg.batch_size
    data = task.ids[: int(len(task.ids) * (1 - task.eval_fraction))]

    def get_batch():
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([data[i : i + block_size] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
                device, non_blocking=True
            )
        return x, y

    with device:  # initialised where it trains: start-up time is not what is measured
        model = task.build_model()
    scaler = torch.amp.GradScaler(device_type, enabled=cfg.precision == "fp16")
    optimizer = configure_optimizer(model, cfg.weight_decay, cfg.lr, cfg.betas, device_type)
    if cfg.compile:
        model = torch.compile(model)

    report = Reporter(True, cfg.max_steps, "never", None, stream=stream)
    config = cfg.model_dump(mode="json") | {"task": TASK_OF[model_name], "loop": "nanogpt"}
    report.event(
        "start",
        world_size=1,
        device=str(device),
        step=0,
        config=config,
        hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
    )
    clock = StepClock(device)
    started = clock()
    window_start, data_s, window_steps = started, 0.0, 0
    loss_sum = torch.zeros((), device=device)
    tokens_per_step = batch_size * block_size * cfg.grad_accum
    last_loss = math.nan
    model.train()
    x, y = get_batch()
    for it in range(cfg.max_steps):
        lr = get_lr(it, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.lr * cfg.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for _ in range(cfg.grad_accum):
            with ctx:
                _, loss = model(x, y)
                loss = loss / cfg.grad_accum
            t = time.perf_counter()
            x, y = get_batch()  # async prefetch of the next batch while the GPU runs forward
            data_s += time.perf_counter() - t
            scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        if cfg.grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        window_steps += 1
        step = it + 1
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            now = clock()  # the window's end: after this step's update, on the device too
            last_loss = loss_sum.item() / window_steps  # the window's one host read
            elapsed = now - window_start
            report.event(
                "train",
                step=step,
                max_steps=cfg.max_steps,
                loss=last_loss,
                lr=lr,
                samples_per_s=window_steps * batch_size * cfg.grad_accum / elapsed,
                tokens_per_s=window_steps * tokens_per_step / elapsed,
                step_time_s=elapsed / window_steps,
                data_wait=data_s / elapsed,
            )
            window_start, data_s, window_steps = now, 0.0, 0
            loss_sum.zero_()
    done = dict(
        step=cfg.max_steps,
        max_steps=cfg.max_steps,
        loss=last_loss,
        elapsed_s=time.perf_counter() - started,
        reason="completed",
    )
    report.event("done", **done)
    report.close()
    return done


def main(argv: list[str] | None = None) -> int:
    from trainer.config import ConfigError, load_config

    p = argparse.ArgumentParser(prog="python -m bench.gpu.baseline", description=__doc__)
    p.add_argument("--model", choices=MODELS, default="nanogpt", help="whose model to train")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="trainer settings")
    args = p.parse_args(argv)
    try:
        cfg = load_config(None, args.overrides)
        if cfg.task not in ("lm", "bench.gpu.nanogpt:build"):
            raise ConfigError([f"task: the baseline trains the lm corpus (got {cfg.task})"])
        build_task(args.model, cfg.task_args)  # a bad task argument fails here, in one line
    except (ConfigError, TypeError) as e:
        lines = e.problems if isinstance(e, ConfigError) else [f"task_args: {e}"]
        for line in lines:
            print(f"baseline: {line}", file=sys.stderr)
        return 2
    train(args.model, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
