"""The training run. ``Trainer.__init__`` builds the parts in dependency order; ``fit`` trains.

Runbook (all of these run the same code; see trainer/__main__.py for the launch contract)::

    python -m trainer task=vision max_steps=200                     # one process
    torchrun --nproc-per-node 2 -m trainer task=lm batch_size=16    # two ranks, one machine
    python -m trainer --config run.yaml lr=3e-4                     # in a PyTorchJob/TrainJob pod

The loop runs one optimizer step (``trainer.parts.step``: micro-batches, the update, the step's
one read of the host) and then asks each part whether this step is its own: the log window
(``trainer.parts.window``), evaluation (``trainer.parts.evaluation``), checkpoints
(``trainer.checkpoint.cadence``), and the stop decisions (``trainer.parts.stop``: a non-finite
loss, SIGTERM). Each part keeps its own cadence; the checkpoint composes their state. Beside the
loop, the watchdog (``trainer.health.watchdog``) names a rank that makes no progress, and each
log window ``trainer.health.stragglers`` names a rank that lags. At world size 1 there is no DDP
wrapper: nothing to all-reduce, and ``torch.compile`` sees the model whole.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import signal
import socket
import time
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import distributed as dist_
from trainer.checkpoint.cadence import Checkpointer
from trainer.checkpoint.manager import CheckpointManager
from trainer.config import ConfigError, TrainConfig
from trainer.contract import COMPLETED, DONE, NONFINITE, PREEMPTED, RESUME, START
from trainer.health.ledger import EVAL, STALL, Ledger
from trainer.health.stragglers import Stragglers
from trainer.health.watchdog import Watchdog
from trainer.parts.evaluation import Evaluator
from trainer.parts.loader import MicroBatches, build_loader
from trainer.parts.optimizer import Ema, build_optimizer, build_scheduler
from trainer.parts.rng import get_rng_state, seed_everything, set_rng_state
from trainer.parts.step import TrainStep
from trainer.parts.stop import NonfiniteSkips, StopRequest
from trainer.parts.window import LogWindow
from trainer.tasks import Task, tokens_per_sample
from trainer.telemetry.events import Reporter

log = logging.getLogger(__name__)

#: How long a run that did not complete waits for the progress API's last post at its end.
UNFINISHED_CLOSE_S = 2.0

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# The `attention` setting's names for SDPA's kernels (torch.nn.attention.SDPBackend).
_SDPA = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def _forward_context(
    device_type: str, dtype: torch.dtype | None, attention: str = "auto"
) -> contextlib.AbstractContextManager:
    """What every forward runs under: mixed precision's autocast for ``dtype`` (nothing for
    fp32), and with ``attention`` other than auto, SDPA limited to that one kernel. Scoped to
    the forward, not set for the process: the kernel is chosen when SDPA runs (or when compile
    traces it), and nothing else in the process is changed."""
    stack = contextlib.ExitStack()
    if dtype is not None:
        stack.enter_context(torch.autocast(device_type, dtype=dtype))
    if attention != "auto":
        stack.enter_context(sdpa_kernel([_SDPA[attention]]))
    return stack


def _batchnorm_statistics_only(model: nn.Module) -> bool:
    """True when ``model`` has buffers and all of them are BatchNorm running statistics.

    A BatchNorm layer in training mode normalises with the batch's own statistics and only
    writes its running ones; in eval mode it reads them but does not change them. So no
    training forward reads a statistic that differs between ranks, and rank 0's, which
    checkpoints hold, move exactly as with DDP's broadcast before every forward: that
    broadcast is a collective every step that only evaluation needs. Any other buffer may be
    read by a forward, so it keeps DDP's."""
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


class Trainer:
    """One rank's training run: model, optimizer, data, the loop's parts, and the loop."""

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
        self.fwd_model: nn.Module = (
            torch.compile(self.raw_model, mode=cfg.compile_mode) if cfg.compile else self.raw_model
        )
        self.model: nn.Module = self.fwd_model
        # DDP only where there is someone to all-reduce with. At world size 1 (a one-replica
        # job still has a process group) the wrapper would add its hooks and a one-rank
        # all-reduce per bucket, and under compile Dynamo's DDPOptimizer would split the graph
        # at every bucket boundary (torch._dynamo.config.optimize_ddp), limiting fusion.
        self.ddp = env.distributed and env.world_size > 1
        # BatchNorm statistics (a model's only buffers): rank 0's, broadcast before each
        # evaluation rather than before every forward (see _batchnorm_statistics_only).
        sync_norms_at_eval = (
            self.ddp and cfg.ddp.broadcast_buffers and _batchnorm_statistics_only(model)
        )
        self.step_flags: dist_.StepFlags | None = None
        if self.ddp:
            self.model = DDP(
                self.fwd_model,
                device_ids=[dev.index] if dev.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp.bucket_cap_mb,
                find_unused_parameters=cfg.ddp.find_unused_parameters,
                gradient_as_bucket_view=cfg.ddp.gradient_as_bucket_view,
                static_graph=cfg.ddp.static_graph,
                **_buffer_sync_kwargs(cfg.ddp.broadcast_buffers and not sync_norms_at_eval),
            )
            # The step's [loss, stop] flags travel with the gradients (one all-reduce round).
            self.step_flags = dist_.StepFlags(dev)
            self.model.register_comm_hook(None, self.step_flags.hook)
        log.info("model: %.3fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)

        # Optimizer, schedule, loss scaling, EMA.
        self.optimizer = build_optimizer(self.raw_model, cfg, env.world_size, dev)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        # A plain function, not a method: the parts that hold it must not hold the trainer.
        self._autocast = functools.partial(
            _forward_context, dev.type, _DTYPES.get(cfg.precision), cfg.attention
        )
        # Only fp16 needs loss scaling: bf16 has fp32's exponent range.
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        self.ema = Ema(self.raw_model, cfg.ema_decay) if cfg.ema_decay else None

        # Data: each rank its own shard; the sampler seed is shared so shards partition an epoch.
        train_set, eval_set = task.build_datasets()
        loader_args = dict(
            rank=env.rank,
            world_size=env.world_size,
            seed=cfg.seed,
            num_workers=cfg.num_workers,
            pin_memory=dev.type == "cuda",
        )
        self.train_loader = build_loader(train_set, cfg.batch_size, shuffle=True, **loader_args)
        self.eval_loader = build_loader(eval_set, cfg.batch_size, shuffle=False, **loader_args)

        # Per-rank seeds for everything random from here on (dropout, augmentation).
        seed_everything(cfg.seed + env.rank)

        # The loop's parts.
        self.stop = StopRequest()
        self.skips = NonfiniteSkips(cfg.max_nonfinite_skips)
        params = [p for p in self.raw_model.parameters() if p.requires_grad]
        self.train_step = TrainStep(
            self.model,
            params,
            task,
            self.optimizer,
            self.scaler,
            self._autocast,
            self.stop,
            self.step_flags,
            grad_accum=cfg.grad_accum,
            grad_clip=cfg.grad_clip,
            fused_clip=cfg.fused_clip,
            world_size=env.world_size,
            device=dev,
            gradient_as_bucket_view=cfg.ddp.gradient_as_bucket_view,
        )
        self.window = LogWindow(
            reporter,
            log_every=cfg.log_every,
            max_steps=cfg.max_steps,
            samples_per_step=cfg.batch_size * cfg.grad_accum * env.world_size,
            tokens_per_sample=tokens_per_sample(task),
            scaler=self.scaler,
            device=dev,
        )
        self.evaluator = Evaluator(
            task,
            self.eval_loader,
            self.fwd_model,
            self.raw_model,
            self.ema,
            reporter,
            self._autocast,
            dev,
            eval_every=cfg.eval_every,
            eval_batches=cfg.eval_batches,
            max_steps=cfg.max_steps,
            sync_norms=sync_norms_at_eval,
        )
        self.watchdog = Watchdog(cfg.watchdog, env.rank, env.world_size)
        self.stragglers = Stragglers(
            cfg.watchdog, env.rank, env.world_size, dev, reporter, self.step_flags
        )

        # Checkpoints, and resume (which overrides RNG, data position and all state).
        storage = CheckpointManager(cfg.checkpoint.dir, cfg.checkpoint.keep, env.is_main, dev)
        self.step = 0
        epoch, batch_in_epoch = 0, 0
        state, path, skipped = storage.load(cfg.resume)
        if state is not None:
            epoch, batch_in_epoch = self._restore(state, path)
            self.report.event(RESUME, step=self.step, path=path, skipped=skipped)
            self.report.say(f"resumed from {path} at step {self.step}")
        elif skipped:
            self.report.event(RESUME, step=0, path=None, skipped=skipped)
            self.report.say("no readable checkpoint; starting from scratch")
        # What each run of the job cost, carried across restarts (trainer.health.ledger).
        self.ledger = Ledger(
            cfg.checkpoint.dir,
            env.is_main,
            reporter,
            resumed_step=self.step if state is not None else 0,
            state=state,
            keep=cfg.checkpoint.keep,
        )
        self.checkpointer = Checkpointer(
            storage,
            reporter,
            every_steps=cfg.checkpoint.every_steps,
            saved_step=self.step if state is not None else None,
        )
        # CPU batches are already where they belong.
        on_device = dev if dev.type != "cpu" else None
        self.batches = MicroBatches(self.train_loader, epoch, batch_in_epoch, on_device)
        self.last_loss = math.nan

    # ------------------------------------------------------------------------------------------
    # State

    def state_dict(self) -> dict[str, Any] | None:
        """Full training state on rank 0 (None elsewhere); collective: every rank must call it."""
        rngs = dist_.gather_objects(get_rng_state(), what="checkpoint gather")
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
            **self.skips.state_dict(),
            "world_size": self.env.world_size,
            "rng": rngs,
            "config": self.cfg.model_dump(mode="json"),
            "ledger": self.ledger.state_dict(),
        }

    def _restore(self, state: dict[str, Any], path: str | None) -> tuple[int, int]:
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
        self.skips.load_state_dict(state)
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

    # ------------------------------------------------------------------------------------------
    # Training

    def fit(self) -> str:
        """Train to ``max_steps``; return COMPLETED, PREEMPTED or NONFINITE.

        SIGTERM only sets :attr:`stop`'s flag: the current step finishes, then every rank
        agrees to stop together."""
        previous = signal.signal(signal.SIGTERM, self.stop.on_sigterm)
        reason = None
        try:
            with self.watchdog, self.watchdog.while_compiling(self.cfg.compile):
                reason = self._loop()
            return reason
        finally:
            # A run that ends on an error still finishes the write in flight: a complete
            # checkpoint of a step every rank completed.
            self.checkpointer.close()
            self.ledger.close()
            signal.signal(signal.SIGTERM, previous)
            # A run that did not complete (preempted: the pod's grace period is running, and
            # every other rank waits for this one in the barrier after fit) gives the progress
            # API a moment for its last state, not its full wait.
            self.report.close(wait_s=None if reason == COMPLETED else UNFINISHED_CLOSE_S)

    def _loop(self) -> str:
        """One optimizer step at a time; after each, every part is asked whether it is its step.
        The parts run on every rank at the same steps, as their collectives need."""
        cfg = self.cfg
        started = self._report_start()
        self.ledger.started()
        self.window.reset()
        self.model.train()
        reason = COMPLETED
        while self.step < cfg.max_steps:
            want_norm = self.window.wants_norm(self.step + 1)
            self.stragglers.step_started()
            loss, stop, norm = self.train_step.run(self.batches, self.window, want_norm)
            self.step, self.last_loss = self.step + 1, loss
            self.ledger.stepped(self.step)
            if self.skips.over_budget(loss, self.step):
                self.report.say(self.skips.advice(loss, self.step))
                reason = NONFINITE
                break
            finite = math.isfinite(loss)  # if not, the device skipped the update (found_inf)
            if finite and self.ema is not None:
                self.ema.update()
            self.window.add_step(loss, self.scheduler.get_last_lr()[0], norm if finite else None)
            self.scheduler.step()
            self.report.advance(self.step, loss)
            self.watchdog.step_done(self.step)

            if self.window.due(self.step):
                slow = self.stragglers.compare(self.step)
                self.window.log(self.step, self.batches.epoch, self.skips.count, **slow)
                self.ledger.window()
            if self.evaluator.should_evaluate(self.step):
                with self.ledger.part(EVAL), self.watchdog.paused("evaluation"):
                    self.evaluator.run(self.step)
            if stop:
                reason = PREEMPTED
                break
            if self.checkpointer.should_save(self.step):
                with self.ledger.saving(self.step), self.watchdog.paused("checkpoint"):
                    self.checkpointer.save(self.step, self.state_dict)
            self.checkpointer.report_completed()

        if reason == COMPLETED:
            with self.ledger.part(EVAL), self.watchdog.paused("evaluation"):
                self.evaluator.run(self.step)
        if reason != NONFINITE and self.checkpointer.should_save(self.step, last=True):
            with self.ledger.saving(self.step), self.watchdog.paused("checkpoint"):
                self.checkpointer.save(self.step, self.state_dict)
        # Preempted or done: the last checkpoint is complete before the run says so and exits.
        with self.ledger.part(STALL), self.watchdog.paused("checkpoint"):
            self.checkpointer.report_completed(wait=True)
        self.ledger.end(reason)
        self._report_done(reason, time.perf_counter() - started)
        return reason

    def _report_start(self) -> float:
        """The ``start`` event; returns the run's start time."""
        self.report.event(
            START,
            world_size=self.env.world_size,
            device=str(self.env.device),
            step=self.step,
            config=self.cfg.model_dump(mode="json"),
            # Which pod runs global rank 0: in an elastic job the rendezvous decides it.
            hostname=os.environ.get("HOSTNAME") or socket.gethostname(),
        )
        return time.perf_counter()

    def _report_done(self, reason: str, elapsed_s: float) -> None:
        max_steps, loss = self.cfg.max_steps, self.last_loss
        self.report.event(
            DONE, step=self.step, max_steps=max_steps, loss=loss, elapsed_s=elapsed_s, reason=reason
        )
        self.report.say(
            f"{reason} at step {self.step}/{max_steps}, loss {loss:.4f}, {elapsed_s:.1f}s"
        )
