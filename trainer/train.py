"""The training loop. ``Trainer.__init__`` builds the parts in dependency order; ``fit`` trains.

Runbook (all of these run the same code; see trainer/__main__.py for the launch contract)::

    python -m trainer task=vision max_steps=200                     # one process
    torchrun --nproc-per-node 2 -m trainer task=lm batch_size=16    # two ranks, one machine
    python -m trainer --config run.yaml lr=3e-4                     # in a PyTorchJob/TrainJob pod

Per optimizer step: ``grad_accum`` micro-batches (all but the last under ``no_sync``, so DDP
all-reduces gradients once, and the step's [loss, stop flag] ride along in its last bucket so
every rank takes the same branch: NaN skip, preemption), then unscale -> clip -> step -> EMA ->
schedule. The update is queued before the host looks at the step's loss: a step whose loss is
not finite is skipped on the device (``found_inf``), and the host's one read per step waits for
the end of backward, not for an empty queue (``HostFlags``). At world size 1 there is no DDP
wrapper: nothing to all-reduce, and ``torch.compile`` sees the model whole.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import distributed as dist_
from trainer.checkpoint import CheckpointManager
from trainer.config import ConfigError, TrainConfig
from trainer.contract import (
    CHECKPOINT,
    COMPLETED,
    DONE,
    EVAL,
    NONFINITE,
    PREEMPTED,
    RESUME,
    START,
    TRAIN,
)
from trainer.loader import MicroBatches, batch_len, build_loader, to_device
from trainer.metrics import Reporter, Throughput
from trainer.optim import Ema, build_optimizer, build_scheduler
from trainer.rng import get_rng_state, seed_everything, set_rng_state
from trainer.tasks import Task, tokens_per_sample

log = logging.getLogger(__name__)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _batchnorm_statistics_only(model: nn.Module) -> bool:
    """True when ``model`` has buffers and all of them are BatchNorm running statistics.

    A BatchNorm layer in training mode normalises with the batch's own statistics and only
    writes its running ones; in eval mode it reads them but does not change them. So no
    training forward reads a statistic that differs between ranks, and rank 0's, which
    checkpoints hold, move exactly as with DDP's broadcast before every forward: that
    broadcast is a collective a step (about a quarter of a small CNN's step on CPU, gloo) that
    only evaluation needs. Any other buffer may be read by a forward, so it keeps DDP's."""
    norms = {
        id(b)
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for b in m.buffers(recurse=False)
    }
    buffers = list(model.buffers())
    return bool(buffers) and all(id(b) in norms for b in buffers)


def _buffer_sync_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """DDP's per-forward buffer broadcast switch (newer torch calls it ``forward_sync_buffers``)."""
    if broadcast_buffers:
        return {}  # the default everywhere; passing it only triggers a deprecation warning
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


#: How long a run that did not complete waits for the progress API's last post at its end.
UNFINISHED_CLOSE_S = 2.0


class HostFlags:
    """The step's ``[loss, stop]`` on the host, read without draining the device's queue.

    ``start(flags)`` queues a copy into pinned host memory (and marks it with an event) right
    after backward; the loop then queues the update; ``read()`` waits for that copy only, so
    the GPU still has the clip and the optimizer step to run while the host decides and starts
    the next step. On CPU the copy is immediate.
    """

    def __init__(self, device: torch.device):
        cuda = device.type == "cuda"
        self.values = torch.zeros(2, pin_memory=cuda)
        self.copied = torch.cuda.Event() if cuda else None

    def start(self, flags: torch.Tensor) -> None:
        self.values.copy_(flags, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def read(self) -> list[float]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.values.tolist()


class Trainer:
    """One rank's training run: model, optimizer, data, checkpoints, and the loop."""

    def __init__(self, cfg: TrainConfig, env: dist_.DistEnv, task: Task, reporter: Reporter):
        self.cfg, self.env, self.task, self.report = cfg, env, task, reporter
        dev = env.device

        # Numerics switches first: they must be in place before any kernel runs.
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
            torch.backends.cudnn.allow_tf32 = cfg.tf32
            torch.backends.cudnn.benchmark = not cfg.deterministic
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)

        # Model: initialised from the base seed, so every rank builds identical weights.
        seed_everything(cfg.seed)
        model = task.build_model()
        if cfg.sync_batchnorm and env.world_size > 1:
            if dev.type == "cuda":
                model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            else:
                log.warning("sync_batchnorm: SyncBatchNorm needs CUDA; keeping per-rank BatchNorm")
        self.raw_model = model.to(dev)  # what checkpoints hold: no module./_orig_mod. prefixes
        self.fwd_model: nn.Module = torch.compile(self.raw_model) if cfg.compile else self.raw_model
        self.model: nn.Module = self.fwd_model
        # DDP only where there is someone to all-reduce with. At world size 1 (a one-replica
        # job still has a process group) the wrapper would add its hooks and a one-rank
        # all-reduce per bucket, and under compile Dynamo's DDPOptimizer would split the graph
        # at every bucket boundary (torch._dynamo.config.optimize_ddp), limiting fusion.
        self.ddp = env.distributed and env.world_size > 1
        # BatchNorm statistics (a model's only buffers): rank 0's, broadcast before each
        # evaluation rather than before every forward (see _batchnorm_statistics_only).
        self.sync_norms_at_eval = (
            self.ddp and cfg.ddp.broadcast_buffers and _batchnorm_statistics_only(model)
        )
        if self.ddp:
            self.model = DDP(
                self.fwd_model,
                device_ids=[dev.index] if dev.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp.bucket_cap_mb,
                find_unused_parameters=cfg.ddp.find_unused_parameters,
                gradient_as_bucket_view=cfg.ddp.gradient_as_bucket_view,
                static_graph=cfg.ddp.static_graph,
                **_buffer_sync_kwargs(cfg.ddp.broadcast_buffers and not self.sync_norms_at_eval),
            )
        # The step's [loss, stop] flags travel with the gradients (one all-reduce round a step).
        self.step_flags: dist_.StepFlags | None = None
        if self.ddp:
            self.step_flags = dist_.StepFlags(dev)
            self.model.register_comm_hook(None, self.step_flags.hook)
        self.host_flags = HostFlags(dev)
        # With gradient_as_bucket_view the gradients *are* DDP's all-reduce buckets: zeroing them
        # in place lets backward accumulate straight into the buckets. Setting them to None
        # would make every backward allocate fresh gradients and copy them into the buckets.
        self.grads_to_none = not (self.ddp and cfg.ddp.gradient_as_bucket_view)
        log.info("model: %.3fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)

        # Optimizer, schedule, loss scaling, EMA.
        self.optimizer = build_optimizer(self.raw_model, cfg, env.world_size, dev)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.autocast_dtype = _DTYPES.get(cfg.precision)
        # Only fp16 needs loss scaling: bf16 has fp32's exponent range.
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        self.ema = Ema(self.raw_model, cfg.ema_decay) if cfg.ema_decay else None

        # Data: each rank its own shard; the sampler seed is shared so shards partition an epoch.
        train_set, eval_set = task.build_datasets()
        pin = dev.type == "cuda"
        loader_args = dict(
            rank=env.rank,
            world_size=env.world_size,
            seed=cfg.seed,
            num_workers=cfg.num_workers,
            pin_memory=pin,
        )
        self.train_loader = build_loader(train_set, cfg.batch_size, shuffle=True, **loader_args)
        self.eval_loader = build_loader(eval_set, cfg.batch_size, shuffle=False, **loader_args)
        self.tokens_per_sample = tokens_per_sample(task)

        # Per-rank seeds for everything random from here on (dropout, augmentation).
        seed_everything(cfg.seed + env.rank)

        # Checkpoints, and resume (which overrides RNG, data position and all state).
        self.ckpt = CheckpointManager(cfg.checkpoint.dir, cfg.checkpoint.keep, env.is_main)
        self.step = 0
        self.nonfinite_skips = 0
        epoch, batch_in_epoch = 0, 0
        state, path, skipped = self.ckpt.load(cfg.resume)
        if state is not None:
            epoch, batch_in_epoch = self._restore(state, path)
            self.report.event(RESUME, step=self.step, path=str(path), skipped=skipped)
            self.report.say(f"resumed from {path} at step {self.step}")
        elif skipped:
            self.report.event(RESUME, step=0, path=None, skipped=skipped)
            self.report.say("no readable checkpoint; starting from scratch")
        # CPU batches are already where they belong.
        on_device = dev if dev.type != "cpu" else None
        self.batches = MicroBatches(self.train_loader, epoch, batch_in_epoch, on_device)
        self.stop_requested = False
        self.last_loss = math.nan

    # ------------------------------------------------------------------------------------------
    # State

    def state_dict(self) -> dict[str, Any] | None:
        """Full training state on rank 0 (None elsewhere); collective: every rank must call it."""
        rngs = dist_.gather_objects(get_rng_state())
        if not self.env.is_main:
            return None
        epoch, batch_in_epoch = self.batches.position()
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "step": self.step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "nonfinite_skips": self.nonfinite_skips,
            "world_size": self.env.world_size,
            "rng": rngs,
            "config": self.cfg.model_dump(mode="json"),
        }

    def _restore(self, state: dict[str, Any], path: Path | None) -> tuple[int, int]:
        """Load a checkpoint into every part; return the data position to continue from."""
        try:
            self.raw_model.load_state_dict(state["model"])
        except RuntimeError as e:  # missing/unexpected keys or other shapes: not this model
            lines = str(e).strip().splitlines()
            detail = (lines[1] if len(lines) > 1 else lines[0]).strip()
            detail = detail if len(detail) <= 100 else detail[:97] + "..."
            raise ConfigError(
                [
                    f"resume: {path} holds a model of another shape or version (got {detail}). "
                    "Resume with the task_args it was written with, or start fresh: "
                    "resume=never or another checkpoint.dir"
                ]
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.step = state["step"]
        self.nonfinite_skips = state.get("nonfinite_skips", 0)
        epoch, batch_in_epoch = state["epoch"], state["batch_in_epoch"]
        if state["world_size"] == self.env.world_size:
            set_rng_state(state["rng"][self.env.rank])
        else:
            # Another world size: shards differ, so keep the epoch and the fraction of it done.
            log.warning(
                "resuming %d ranks from a %d-rank checkpoint: data order and RNG differ",
                self.env.world_size,
                state["world_size"],
            )
            batch_in_epoch = batch_in_epoch * state["world_size"] // self.env.world_size
            seed_everything(self.cfg.seed + self.env.rank + self.step)
        return epoch, batch_in_epoch

    def save(self) -> Path:
        """Checkpoint now (collective) and report it."""
        path = self.ckpt.save(self.state_dict(), self.step)
        self.report.event(CHECKPOINT, step=self.step, path=str(path))
        return path

    # ------------------------------------------------------------------------------------------
    # Evaluation

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss and task metrics over ``eval_batches`` batches per rank, over all ranks."""
        was_training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for i, batch in enumerate(self.eval_loader):
            if i == self.cfg.eval_batches:
                break
            batch = to_device(batch, self.env.device)
            n = batch_len(batch)
            with self._autocast():
                loss, metrics = self.task.loss(model, batch)
            for k, v in {"loss": loss, **metrics}.items():
                sums[k] = sums.get(k, 0) + v.detach().float() * n
            count += n
        keys = sorted(sums)  # the same order on every rank, for one flat all-reduce
        total = torch.tensor(float(count), device=self.env.device)
        flat = torch.stack([*(sums[k] for k in keys), total])
        flat = dist_.all_reduce_sum(flat).tolist()
        model.train(was_training)
        return {k: v / flat[-1] for k, v in zip(keys, flat[:-1], strict=True)}

    def run_eval(self) -> None:
        if self.sync_norms_at_eval:
            # Every rank evaluates rank 0's model, the one its checkpoint holds.
            models = [self.raw_model] + ([self.ema.module] if self.ema is not None else [])
            dist_.broadcast_tensors([b for m in models for b in m.buffers()])
        metrics = self.evaluate(self.fwd_model)
        if self.ema is not None:
            metrics |= {f"ema_{k}": v for k, v in self.evaluate(self.ema.module).items()}
        self.report.event(EVAL, step=self.step, metrics=metrics)

    # ------------------------------------------------------------------------------------------
    # Training

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.autocast_dtype)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """SIGTERM's handler: only a flag. The current step finishes, then every rank agrees
        to stop together. After :meth:`fit` returned it changes nothing (``train`` keeps it
        until the group is gone)."""
        self.stop_requested = True

    def fit(self) -> str:
        """Train to ``max_steps``; return COMPLETED, PREEMPTED or NONFINITE."""
        previous = signal.signal(signal.SIGTERM, self.on_sigterm)
        reason = None
        try:
            reason = self._loop()
            return reason
        finally:
            signal.signal(signal.SIGTERM, previous)
            # A run that did not complete (preempted: the pod's grace period is running, and
            # every other rank waits in the barrier after fit for this one) gives the progress
            # API a moment for its last state, not the full wait (ci6: rank 0 waiting on a slow
            # status server kept a deleted pod's rank past its 30 s, and it was killed).
            self.report.close(wait_s=None if reason == COMPLETED else UNFINISHED_CLOSE_S)

    def _loop(self) -> str:
        cfg, env, report = self.cfg, self.env, self.report
        dev = env.device
        report.event(
            START,
            world_size=env.world_size,
            device=str(dev),
            step=self.step,
            config=cfg.model_dump(mode="json"),
            # Which pod runs global rank 0: in an elastic job the rendezvous decides it.
            hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
        )
        started = time.perf_counter()
        window = Throughput()
        samples_per_step = cfg.batch_size * cfg.grad_accum * env.world_size
        params = [p for p in self.raw_model.parameters() if p.requires_grad]
        grad_norm = torch.zeros((), device=dev)
        stop_flag = torch.zeros((), device=dev)
        self.model.train()
        reason = COMPLETED
        last_saved = self.step if self.step > 0 else -1

        while self.step < cfg.max_steps:
            loss_sum = None
            for micro in range(cfg.grad_accum):
                t_data = time.perf_counter()
                batch = next(self.batches)  # drawn during the previous backward
                window.data_s += time.perf_counter() - t_data
                # no_sync on all but the last micro-batch: gradients accumulate locally and
                # DDP all-reduces once per optimizer step, not once per micro-batch.
                last = micro == cfg.grad_accum - 1
                skip_sync = self.ddp and not last
                with self.model.no_sync() if skip_sync else contextlib.nullcontext():
                    with self._autocast():
                        loss, _ = self.task.loss(self.model, batch)
                    detached = loss.detach().float()
                    loss_sum = detached if loss_sum is None else loss_sum + detached
                    if last:
                        # [global loss, any rank told to stop], so every rank takes the same
                        # branch (NaN skip, preemption). With DDP the pair rides in the last
                        # gradient bucket (StepFlags); a lone process just keeps it.
                        stop_flag.fill_(float(self.stop_requested))
                        flags = torch.stack([loss_sum, stop_flag])
                        if self.step_flags is not None:
                            self.step_flags.values.copy_(flags)
                    if cfg.grad_accum > 1:
                        loss = loss / cfg.grad_accum
                    self.scaler.scale(loss).backward()
                # The next micro-batch's host work (indexing, collating, pinning, starting its
                # copy) while the GPU is still busy with this backward.
                t_data = time.perf_counter()
                self.batches.prefetch()
                window.data_s += time.perf_counter() - t_data

            if self.step_flags is not None:
                flags = self.step_flags.values  # reduced by the time backward returned
            self.host_flags.start(flags)
            # The update is queued before the host knows the loss: if it is not finite, fused
            # AdamW skips the step on the device (found_inf: the protocol GradScaler uses,
            # torch/amp/grad_scaler.py), step count included. With fp16, GradScaler sets it
            # from the gradients, which a non-finite loss makes non-finite too.
            # Unscale before clipping, so the threshold applies to the true gradients.
            self.scaler.unscale_(self.optimizer)
            norm = None
            if cfg.grad_clip > 0:
                norm = nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            elif (self.step + 1) % cfg.log_every == 0:
                norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            own_skip = not self.scaler.is_enabled()
            if own_skip:
                self.optimizer.found_inf = torch.isfinite(flags[0]).logical_not().float()
            # The scaler skips the update if fp16 gradients overflowed, and lowers the scale.
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if own_skip:
                del self.optimizer.found_inf
            self.optimizer.zero_grad(set_to_none=self.grads_to_none)

            global_loss, stop = self.host_flags.read()  # the step's one wait for the device
            global_loss /= env.world_size * cfg.grad_accum
            lr = self.scheduler.get_last_lr()[0]

            if not math.isfinite(global_loss):
                self.nonfinite_skips += 1
                if self.nonfinite_skips > cfg.max_nonfinite_skips:
                    self.step += 1
                    self.last_loss = global_loss
                    report.say(
                        f"step {self.step}: loss is {global_loss}; stopping "
                        f"(max_nonfinite_skips={cfg.max_nonfinite_skips}). Lower lr, raise "
                        "warmup_steps or grad_clip, or try precision=bf16."
                    )
                    reason = NONFINITE
                    break
                log.warning(
                    "step %d: loss is %s; skipping this step (%d/%d)",
                    self.step + 1,
                    global_loss,
                    self.nonfinite_skips,
                    cfg.max_nonfinite_skips,
                )
            else:
                if norm is not None:
                    grad_norm = norm
                if self.ema is not None:
                    self.ema.update()
            self.scheduler.step()
            self.step += 1
            self.last_loss = global_loss
            window.add_step(samples_per_step, global_loss)
            report.advance(self.step, global_loss)

            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                w = window.window()
                fields = dict(
                    step=self.step,
                    max_steps=cfg.max_steps,
                    loss=w["loss"],
                    lr=lr,
                    grad_norm=float(grad_norm),
                    samples_per_s=w["samples_per_s"],
                    step_time_s=w["step_time_s"],
                    data_wait=w["data_wait"],
                    epoch=self.batches.epoch,
                    nonfinite_skips=self.nonfinite_skips,
                )
                if self.tokens_per_sample:
                    fields["tokens_per_s"] = w["samples_per_s"] * self.tokens_per_sample
                if self.scaler.is_enabled():
                    fields["loss_scale"] = self.scaler.get_scale()
                report.event(TRAIN, **fields)
                window.reset()
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.max_steps:
                self.run_eval()
            if stop:
                reason = PREEMPTED
                break
            if cfg.checkpoint.every_steps and self.step % cfg.checkpoint.every_steps == 0:
                self.save()
                last_saved = self.step

        if reason == COMPLETED:
            self.run_eval()
        if reason != NONFINITE and last_saved != self.step:
            self.save()
        elapsed = time.perf_counter() - started
        report.event(
            DONE,
            step=self.step,
            max_steps=cfg.max_steps,
            loss=self.last_loss,
            elapsed_s=elapsed,
            reason=reason,
        )
        report.say(
            f"{reason} at step {self.step}/{cfg.max_steps}, loss {self.last_loss:.4f}, "
            f"{elapsed:.1f}s"
        )
        return reason
