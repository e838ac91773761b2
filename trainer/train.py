"""The training run. ``Trainer.__init__`` builds the parts in dependency order; ``fit`` trains;
``run`` is one rank's whole run (join, fit, leave) as ``python -m trainer`` makes it.

Runbook (all of these run the same code; see trainer/__main__.py for the launch contract)::

    python -m trainer task=vision max_steps=200                     # one process
    torchrun --nproc-per-node 2 -m trainer task=lm batch_size=16    # two ranks, one machine
    python -m trainer --config run.yaml lr=3e-4                     # in a PyTorchJob/TrainJob pod

The loop runs one optimizer step (``trainer.parts.step``: micro-batches, the update, the step's
one read of the host) and then asks each part whether this step is its own: the log window
(``trainer.parts.window``), evaluation (``trainer.parts.evaluation``), checkpoints
(``trainer.checkpoint.cadence``), and the stop decisions (``trainer.parts.stop``: a non-finite
loss, SIGTERM). Each part keeps its own cadence; the checkpoint composes their state. What is
not a step (an evaluation, a save, the wait for the last write) is a phase
(``trainer.parts.phases``), entered once, which the goodput ledger times and the watchdog
pauses for (``trainer.health``). Beside the loop, the watchdog names a rank that makes no
progress, and each log window ``trainer.health.stragglers`` names a rank that lags. What leaves
the process goes through ``trainer.telemetry``: rank 0's events (and its MLflow run), every
rank's Prometheus metrics. The model is shared by the strategy (``trainer.parts.strategy``): DDP
(``trainer.parts.ddp``; at world size 1 no wrapper, nothing to all-reduce, and
``torch.compile`` sees the model whole) or FSDP (``trainer.parts.fsdp``: sharded, with sharded
checkpoints).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

import torch
from torch import nn

from trainer import distributed as dist_
from trainer import sizing
from trainer.checkpoint.cadence import CheckpointCadence, SavesFailed
from trainer.checkpoint.sharded import checkpoint_manager
from trainer.config import ConfigError, TrainConfig
from trainer.contract import (
    COMPLETED,
    DONE,
    ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    NONFINITE,
    PEER_LOST,
    PREEMPTED,
    RESTART,
    RESUME,
    START,
)
from trainer.distributed import DistEnv
from trainer.health.ledger import Ledger
from trainer.health.nodes import BadNodes, track_nodes
from trainer.health.preflight import run_preflight
from trainer.health.restart import Restart, leave
from trainer.health.stragglers import Stragglers
from trainer.health.watchdog import Watchdog
from trainer.launch import record_exit
from trainer.parts.blocks import blocks_of, recompute_activations
from trainer.parts.evaluation import Evaluator
from trainer.parts.loader import MicroBatches, build_loader
from trainer.parts.optimizer import build_optimizer, build_scheduler
from trainer.parts.phases import EVALUATION, LAST_WRITE, SAVE, Phases
from trainer.parts.precision import forward_context_of, set_numerics
from trainer.parts.rng import get_rng_state, seed_everything, set_rng_state
from trainer.parts.step import TrainStep
from trainer.parts.stop import NonfiniteSkips, StopRequest
from trainer.parts.strategy import wrap
from trainer.parts.window import LogWindow
from trainer.tasks import Task, load_task, tokens_per_sample
from trainer.telemetry import metrics as metrics_
from trainer.telemetry.events import Reporter
from trainer.telemetry.tracker import Settings, Tracker

log = logging.getLogger(__name__)

#: How long a run that did not complete waits for the progress API's last post at its end.
UNFINISHED_CLOSE_S = 2.0
#: How long a completed run waits for its tracker to send what it still holds.
TRACKING_CLOSE_S = 10.0


class Trainer:
    """One rank's training run: model, optimizer, data, the loop's parts, and the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: DistEnv,
        task: Task,
        reporter: Reporter,
        bad_nodes: BadNodes | None = None,
    ):
        self.cfg, self.env, self.task, self.report = cfg, env, task, reporter
        self.bad_nodes = bad_nodes or BadNodes(0, False, reporter, [])
        dev = env.device
        set_numerics(cfg, dev)  # before any kernel runs

        # Model: initialised from the base seed, so every rank builds identical weights; then
        # on the device as the strategy shares it (trainer.parts.strategy).
        seed_everything(cfg.seed)
        self.strategy = wrap(_build_model(task, cfg, env), task, cfg, env)
        self.raw_model = self.strategy.raw_model  # what checkpoints hold: no prefixes
        self.fwd_model, self.model = self.strategy.fwd_model, self.strategy.model
        self.step_flags = self.strategy.step_flags
        self.ddp = self.step_flags is not None
        _log_model_state(self.raw_model, cfg, env)

        # Optimizer, schedule, loss scaling (only fp16 needs it: bf16 has fp32's range), EMA.
        self.optimizer = build_optimizer(self.raw_model, cfg, env.world_size, dev)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self._autocast = forward_context_of(cfg, dev)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        self.ema = self.strategy.make_ema(task, cfg.ema_decay) if cfg.ema_decay else None

        # Data: each rank its own shard; the sampler seed is shared so shards partition an epoch.
        self.train_loader, self.eval_loader = _build_loaders(task, cfg, env)
        # Per-rank seeds for everything random from here on (dropout, augmentation).
        seed_everything(cfg.seed + env.rank)

        self._build_loop_parts(self.strategy.sync_norms_at_eval)
        self._build_metrics()
        stuck = self.metrics.stuck if self.metrics is not None else None
        self.watchdog = Watchdog(
            cfg.watchdog,
            env.rank,
            env.world_size,
            on_stuck=stuck,
            on_restart=self._restart_stuck if env.is_main else None,
        )
        self.stragglers = Stragglers(
            cfg.watchdog, env.rank, env.world_size, dev, reporter, self.step_flags
        )
        # Checkpoints, and resume (which overrides RNG, data position and all state).
        self._resume_and_checkpoint()
        self.phase = Phases(self.ledger, self.watchdog)
        self.last_loss = math.nan
        self.preflight: dict[str, Any] = {}  # the pre-flight's slow ranks, in every train event

    def _build_loop_parts(self, sync_norms_at_eval: bool) -> None:
        """The loop's parts: the stop decisions, the step, the log window, evaluation."""
        cfg, env, dev = self.cfg, self.env, self.env.device
        self.stop = StopRequest()
        self.skips = NonfiniteSkips(cfg.max_nonfinite_skips)
        params = [p for p in self.raw_model.parameters() if p.requires_grad]
        self.train_step = TrainStep(
            self.strategy,
            params,
            self.task,
            self.optimizer,
            self.scaler,
            self._autocast,
            self.stop,
            grad_accum=cfg.grad_accum,
            grad_clip=cfg.grad_clip,
            fused_clip=cfg.fused_clip,
            world_size=env.world_size,
            device=dev,
        )
        self.window = LogWindow(
            self.report,
            log_every=cfg.log_every,
            max_steps=cfg.max_steps,
            samples_per_step=cfg.batch_size * cfg.grad_accum * env.world_size,
            tokens_per_sample=tokens_per_sample(self.task),
            scaler=self.scaler,
            device=dev,
        )
        self.evaluator = Evaluator(
            self.task,
            self.eval_loader,
            self.fwd_model,
            self.raw_model,
            self.ema,
            self.report,
            self._autocast,
            dev,
            eval_every=cfg.eval_every,
            eval_batches=cfg.eval_batches,
            max_steps=cfg.max_steps,
            sync_norms=sync_norms_at_eval,
        )

    def _build_metrics(self) -> None:
        """This rank's Prometheus metrics, where served (``prometheus.serve``); they read the
        events this rank's reporter sees."""
        cfg, env = self.cfg, self.env
        samples = cfg.batch_size * cfg.grad_accum
        self.metrics, self.metrics_url = metrics_.start(
            cfg.prometheus.serve,
            cfg.prometheus.port,
            rank=env.rank,
            local_rank=env.local_rank,
            world_size=env.world_size,
            samples=samples,
            tokens=samples * (tokens_per_sample(self.task) or 0),
            gpu_index=env.device.index if env.device.type == "cuda" else None,
        )
        self.report.metrics = self.metrics

    def _resume_and_checkpoint(self) -> None:
        """Open the checkpoint location (once: the ledger keeps its record in the same store),
        resume from it, and set up the ledger, the save cadence and the data position."""
        cfg, env = self.cfg, self.env
        manager = checkpoint_manager(cfg, env)
        self.step = 0
        epoch, batch_in_epoch = 0, 0
        # Under fsdp each rank's shards are loaded into its own model's, optimizer's and EMA's.
        state, path, skipped = manager.load(
            cfg.resume, into=lambda: self.strategy.state(self.optimizer, self.ema)
        )
        if state is not None:
            epoch, batch_in_epoch = self._restore(state, path)
            self.report.event(RESUME, step=self.step, path=path, skipped=skipped)
            self.report.say(f"resumed from {path} at step {self.step}")
        elif skipped:
            self.report.event(RESUME, step=0, path=None, skipped=skipped)
            self.report.say("no readable checkpoint; starting from scratch")
        resumed = state is not None
        if env.is_main:  # the job's MLflow run, its id kept beside the checkpoints
            settings = Settings.from_env(
                cfg.mlflow.tracking_uri, cfg.mlflow.experiment, cfg.checkpoint.dir
            )
            self.report.tracker = Tracker.start(
                settings,
                manager.store,
                resume=cfg.resume != "never",
                max_points=cfg.mlflow.max_points,
            )
        # What each run of the job cost, carried across restarts (trainer.health.ledger).
        self.ledger = Ledger(
            manager.store,
            env.is_main,
            self.report,
            resumed_step=self.step if resumed else 0,
            state=state,
            keep=cfg.checkpoint.keep,
        )
        self.checkpoints = CheckpointCadence(
            manager,
            self.report,
            every_steps=cfg.checkpoint.every_steps,
            saved_step=self.step if resumed else None,
            max_failed_saves=cfg.checkpoint.max_failed_saves,
        )
        # CPU batches are already where they belong.
        on_device = env.device if env.device.type != "cpu" else None
        self.batches = MicroBatches(self.train_loader, epoch, batch_in_epoch, on_device)

    # ------------------------------------------------------------------------------------------
    # State

    def state_dict(self) -> dict[str, Any] | None:
        """The training state as this rank holds it; collective: every rank must call it. Under
        ddp all of it on rank 0 (None elsewhere); under fsdp every rank's shards of the model,
        optimizer and EMA, and the rest on rank 0."""
        rngs = dist_.gather_objects(get_rng_state(), what="checkpoint gather")
        held = self.strategy.state(self.optimizer, self.ema)
        if not self.env.is_main:
            return held or None
        epoch, batch_in_epoch = self.batches.position()
        return {
            **held,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
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
        self.strategy.load_state(self.optimizer, self.ema, state, path)
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
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
        except Restart as restart:
            self._end_for_restart(restart)
            raise
        except SavesFailed as e:
            restart = Restart(str(e))
            self._end_for_restart(restart)
            raise restart from None
        finally:
            # The watchdog's hook holds this trainer (a cycle that would keep the process group
            # past its teardown until a garbage collection).
            self.watchdog.on_restart = None
            # A run that ends on an error still finishes the write in flight: a complete
            # checkpoint of a step every rank completed.
            self.checkpoints.close()
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
        found = run_preflight(
            cfg.preflight, self.env.rank, self.env.world_size, self.env.device, self.report
        )
        if found and found["slow"]:
            self.preflight = {"preflight": found["slow"]}
        self.window.reset()
        self.model.train()
        reason = COMPLETED
        while self.step < cfg.max_steps:
            want_norm = self.window.wants_norm(self.step + 1)
            self.stragglers.step_started()
            begun, waited = time.perf_counter(), self.window.data_s
            loss, stop, norm = self.train_step.run(self.batches, self.window, want_norm)
            self.step, self.last_loss = self.step + 1, loss
            if self.metrics is not None:
                took = time.perf_counter() - begun
                self.metrics.stepped(self.step, took, self.window.data_s - waited)
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
                if self.metrics is not None:
                    self.metrics.health(self.stragglers.busy_s, self.stragglers.slow)
                self.window.log(
                    self.step, self.batches.epoch, self.skips.count, **slow, **self.preflight
                )
                self.ledger.window()
            if self.evaluator.should_evaluate(self.step):
                with self.phase(EVALUATION, self.step):
                    self.evaluator.run(self.step)
            if stop:
                reason = PREEMPTED
                break
            if self.checkpoints.should_save(self.step):
                with self.phase(SAVE, self.step):
                    self.checkpoints.save(self.step, self.state_dict)
            self.checkpoints.report_completed()

        if reason == COMPLETED:
            with self.phase(EVALUATION, self.step):
                self.evaluator.run(self.step)
        if reason != NONFINITE and self.checkpoints.should_save(self.step, last=True):
            with self.phase(SAVE, self.step):
                self.checkpoints.save(self.step, self.state_dict)
        # Preempted or done: the last checkpoint is complete before the run says so and exits.
        with self.phase(LAST_WRITE, self.step):
            self.checkpoints.report_completed(wait=True, final=reason == COMPLETED)
        self.ledger.end(reason)
        self._report_done(reason, time.perf_counter() - started)
        return reason

    # ------------------------------------------------------------------------------------------
    # The job restarts itself (trainer.health.restart)

    def _end_for_restart(self, restart: Restart, write_wait_s: float | None = None) -> None:
        """Before the job restarts (rank 0): the save in flight (waited for at most
        ``write_wait_s``), the bad node where a rank's fault it is, the ledger's end and the
        ``done`` event, with the cause."""
        self.checkpoints.close(write_wait_s)
        if restart.rank is not None:
            self.bad_nodes.fault(
                restart.cause, rank=restart.rank, node=restart.node, pod=restart.pod
            )
        self.ledger.end(RESTART, restart.cause)
        tracking = _dropped(self.report.end_tracking(RESTART, UNFINISHED_CLOSE_S))
        self.report.event(
            DONE,
            step=self.step,
            max_steps=self.cfg.max_steps,
            loss=self.last_loss,
            elapsed_s=None,
            reason=RESTART,
            cause=restart.cause,
            **tracking,
        )

    #: How long a stuck job's restart waits for the checkpoint write in flight.
    RESTART_WRITE_WAIT_S = 60.0

    def _restart_stuck(self, cause: str, verdict: dict[str, Any]) -> None:
        """Rank 0's watchdog thread, before a stuck job restarts (its loop's thread hangs): as
        :meth:`_end_for_restart`, the stuck rank's node at fault, a write in flight given up
        after a while; then the ledger's record and the progress are sent."""
        culprit = verdict.get("culprit")
        restart = Restart(cause, rank=culprit, node=verdict.get("node"), pod=verdict.get("pod"))
        self._end_for_restart(restart, self.RESTART_WRITE_WAIT_S)
        self.ledger.close()
        self.report.close(wait_s=UNFINISHED_CLOSE_S)

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
            # Rank 0's Prometheus metrics (null: not served).
            metrics_url=self.metrics_url,
        )
        return time.perf_counter()

    def _report_done(self, reason: str, elapsed_s: float) -> None:
        max_steps, loss = self.cfg.max_steps, self.last_loss
        wait_s = TRACKING_CLOSE_S if reason == COMPLETED else UNFINISHED_CLOSE_S
        tracking = _dropped(self.report.end_tracking(reason, wait_s))
        self.report.event(
            DONE,
            step=self.step,
            max_steps=max_steps,
            loss=loss,
            elapsed_s=elapsed_s,
            reason=reason,
            **tracking,
        )
        self.report.say(
            f"{reason} at step {self.step}/{max_steps}, loss {loss:.4f}, {elapsed_s:.1f}s"
        )


def _dropped(count: int | None) -> dict[str, int]:
    """The ``done`` event's ``tracking_dropped``: metric points that never reached the tracking
    server (none where nothing is tracked)."""
    return {} if count is None else {"tracking_dropped": count}


def _build_model(task: Task, cfg: TrainConfig, env: DistEnv) -> nn.Module:
    """The task's model on the CPU (the strategy puts it on the device), with SyncBatchNorm
    where asked and possible and its blocks' activations recomputed with
    activation_checkpointing."""
    model = task.build_model()
    if cfg.sync_batchnorm and env.world_size > 1:
        if env.device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            log.warning("sync_batchnorm: SyncBatchNorm needs CUDA; keeping per-rank BatchNorm")
    if cfg.activation_checkpointing:
        recompute_activations(blocks_of(task, model))
    return model


def _log_model_state(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> None:
    """The model's size, and its training state per rank against the device's memory
    (``trainer.sizing``'s rule, which validate applies before submit to the built-in tasks):
    a warning when it cannot fit."""
    count = sum(p.numel() for p in model.parameters())
    log.info("model: %.3fM parameters", count / 1e6)
    gpu = (
        torch.cuda.get_device_properties(env.device).total_memory
        if env.device.type == "cuda"
        else None
    )
    estimate = sizing.estimate(cfg, env.world_size, gpu, parameters=count)
    assert estimate is not None
    if estimate.fits is False:
        log.warning("%s", estimate.line())
    else:
        log.info("%s", estimate.line())


def _build_loaders(task: Task, cfg: TrainConfig, env: DistEnv) -> tuple[Any, Any]:
    """The training and evaluation loaders: each rank its own shard of each."""
    train_set, eval_set = task.build_datasets()
    loader_args = dict(
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.seed,
        num_workers=cfg.num_workers,
        pin_memory=env.device.type == "cuda",
    )
    return (
        build_loader(train_set, cfg.batch_size, shuffle=True, **loader_args),
        build_loader(eval_set, cfg.batch_size, shuffle=False, **loader_args),
    )


def _fit(
    cfg: TrainConfig, env: DistEnv, task: Task, reporter: Reporter, bad_nodes: BadNodes
) -> str:
    """Build the trainer and train. The trainer, whose DDP module holds the process group, is
    garbage once this returns: nothing else may keep it."""
    trainer = Trainer(cfg, env, task, reporter, bad_nodes)
    # From fit on until the group is gone, SIGTERM only asks the trainer to stop (fit restores
    # this handler, its own). A rank whose pod is deleted just after another rank stopped the
    # run waits past fit in the barrier for a rank still writing its checkpoint or its last
    # progress; the default action would kill it there, and that rank would lose its peer in
    # the barrier and report peer_lost after preempted. The handler holds only the stop flag.
    signal.signal(signal.SIGTERM, trainer.stop.on_sigterm)
    return trainer.fit()


def run(cfg: TrainConfig) -> int:
    """Join the job, train, and map the outcome to an exit code. Always leaves the group."""
    task = load_task(cfg.task, cfg.task_args)  # a bad task is a config error: before joining
    env = dist_.setup(cfg.device, cfg.backend, cfg.timeout_s)
    logging.basicConfig(
        level=logging.INFO if env.is_main else logging.WARNING,
        format=f"[rank {env.rank}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if not env.is_main:
        # Rank 0 says who it is in its `start` event; the other ranks print nothing else unless
        # something goes wrong, so one line here tells every rank's log (`logs --all`, `kubectl
        # logs` of a worker) that the rank started, joined and where.
        print(
            f"[rank {env.rank}] joined: rank {env.rank} of {env.world_size} (local rank "
            f"{env.local_rank}) on {socket.gethostname()}, device {env.device}",
            file=sys.stderr,
            flush=True,
        )
    reporter = Reporter(env.is_main, cfg.max_steps, cfg.progress, cfg.tensorboard_dir)
    bad_nodes: BadNodes | None = None
    previous = signal.getsignal(signal.SIGTERM)
    try:
        # The job's first collective (rank 0 learns where every rank runs): a peer lost here, as
        # when a restarted pod joins a group whose other end is leaving, is a lost peer (138,
        # retried), as anywhere in training, not a failure of the job (1).
        bad_nodes = track_nodes(cfg.watchdog.avoid_node_after, env, reporter)
        reason = _fit(cfg, env, task, reporter, bad_nodes)
        # Leave together: a rank that destroys its group while a peer is still talking to it
        # can make the peer abort (exit 134) after a run that had finished well.
        dist_.barrier()
    except Exception as e:
        # The traceback's frames hold the trainer, whose DDP module holds the process group:
        # their locals go, so that teardown can free the group (the lines stay printable).
        traceback.clear_frames(e.__traceback__)
        if isinstance(e, ConfigError):
            raise
        if isinstance(e, Restart):  # the done event and the ledger said it already
            leave(env.rank, e.cause, "restarting the job")
        lost = dist_.is_peer_lost(e)
        if lost and bad_nodes is not None:
            # Rank 0 names the rank that was lost (with its node), before its done event.
            bad_nodes.peer_lost(f"{type(e).__name__}: {str(e)[:120]}")
        reason = PEER_LOST if lost else ERROR
        tracking = _dropped(reporter.end_tracking(reason, UNFINISHED_CLOSE_S))
        reporter.event(
            DONE,
            step=None,
            max_steps=cfg.max_steps,
            loss=None,
            elapsed_s=None,
            reason=reason,
            error=f"{type(e).__name__}: {e}",
            **tracking,
        )
        if lost:
            print(
                f"[rank {env.rank}] lost a peer ({type(e).__name__}: {str(e)[:200]}); exiting "
                f"{EXIT_PEER_LOST} so the job is retried and resumes from its last checkpoint",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            # Skip the group's teardown: destroying it with a dead peer can hang or abort.
            os._exit(record_exit(EXIT_PEER_LOST))
        raise
    finally:
        dist_.teardown()
        signal.signal(signal.SIGTERM, previous)
    code = {COMPLETED: EXIT_OK, PREEMPTED: EXIT_PREEMPTED}.get(reason, EXIT_FAILED)
    if code == EXIT_OK:
        dist_.leave_after_the_other_agents()  # under torchrun: no traceback after a good run
    return code
