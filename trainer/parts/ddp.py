"""Strategy ddp: DistributedDataParallel, a full copy of the model on each rank and its
gradients all-reduced; checkpoints hold the whole state, written by rank 0. :func:`wrap` is where
the model is wrapped; strategy fsdp (``trainer.parts.fsdp``) sits beside it with the same shape
(``trainer.parts.strategy``).

DDP only where there is someone to all-reduce with. At world size 1 (a one-replica job still has
a process group) the wrapper would add its hooks and a one-rank all-reduce per bucket, and under
compile Dynamo's DDPOptimizer would split the graph at every bucket boundary
(``torch._dynamo.config.optimize_ddp``), limiting fusion.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.config import TrainConfig, other_model
from trainer.distributed import DistEnv, StepFlags
from trainer.parts.optimizer import Ema


@dataclass(frozen=True)
class Wrapped:
    """The model as the step runs it, and what the strategy adds to the loop
    (``trainer.parts.strategy.Strategy``)."""

    #: The model as checkpoints hold it: no ``module.``/``_orig_mod.`` prefixes.
    raw_model: nn.Module
    #: ``raw_model``, compiled or not: what evaluation runs.
    fwd_model: nn.Module
    #: What the step calls forward and backward: the DDP module, or the forward model itself.
    model: nn.Module
    #: The step's ``[loss, stop]``, reduced with the gradients (None without DDP).
    step_flags: StepFlags | None
    #: BatchNorm statistics are rank 0's, broadcast before each evaluation, not before every
    #: forward (see :func:`batchnorm_statistics_only`).
    sync_norms_at_eval: bool
    #: With gradient_as_bucket_view the gradients *are* DDP's all-reduce buckets: zeroing them
    #: in place lets backward accumulate straight into the buckets. Setting them to None would
    #: make every backward allocate fresh gradients and copy them into the buckets.
    grads_to_none: bool
    is_main: bool

    @property
    def ddp(self) -> bool:
        return self.step_flags is not None

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients accumulate locally; DDP all-reduces once per step, in the last backward."""
        return self.model.no_sync() if self.ddp and not last else contextlib.nullcontext()

    def before_last_backward(self, flags: torch.Tensor) -> None:
        """Into the last bucket: they travel with the gradients."""
        if self.step_flags is not None:
            self.step_flags.values.copy_(flags)

    def after_backward(self, flags: torch.Tensor) -> torch.Tensor:
        """With DDP, the flags were reduced over the ranks by the time backward returned."""
        return self.step_flags.values if self.step_flags is not None else flags

    def make_ema(self, task: Any, decay: float) -> Ema:
        return Ema(self.raw_model, decay)

    def state(self, optimizer: torch.optim.Optimizer, ema: Ema | None) -> dict[str, Any]:
        """The whole model, optimizer and EMA state, on rank 0 (copied off the device by the
        checkpoint manager); nothing elsewhere."""
        if not self.is_main:
            return {}
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
        }

    def load_state(
        self,
        optimizer: torch.optim.Optimizer,
        ema: Ema | None,
        state: dict[str, Any],
        path: str | None,
    ) -> None:
        try:
            self.raw_model.load_state_dict(state["model"])
        except RuntimeError as e:  # missing/unexpected keys or other shapes: not this model
            lines = str(e).strip().splitlines()
            detail = (lines[1] if len(lines) > 1 else lines[0]).strip()
            raise other_model(path, detail) from None
        optimizer.load_state_dict(state["optimizer"])
        if ema is not None and state.get("ema"):
            ema.load_state_dict(state["ema"])


def wrap(raw_model: nn.Module, cfg: TrainConfig, env: DistEnv) -> Wrapped:
    """``raw_model`` on this rank's device (compiled whole with compile), in DDP when the job
    has more than one rank, with the step's flags riding in its gradient all-reduce (one round
    per step)."""
    dev = env.device
    raw_model = raw_model.to(dev)
    fwd_model = torch.compile(raw_model, mode=cfg.compile_mode) if cfg.compile else raw_model
    if not (env.distributed and env.world_size > 1):
        return Wrapped(raw_model, fwd_model, fwd_model, None, False, True, env.is_main)
    sync_norms_at_eval = cfg.ddp.broadcast_buffers and batchnorm_statistics_only(raw_model)
    model = DDP(
        fwd_model,
        device_ids=[dev.index] if dev.type == "cuda" else None,
        bucket_cap_mb=cfg.ddp.bucket_cap_mb,
        find_unused_parameters=cfg.ddp.find_unused_parameters,
        gradient_as_bucket_view=cfg.ddp.gradient_as_bucket_view,
        static_graph=cfg.ddp.static_graph,
        **_buffer_sync_kwargs(cfg.ddp.broadcast_buffers and not sync_norms_at_eval),
    )
    step_flags = StepFlags(dev)
    model.register_comm_hook(None, step_flags.hook)
    grads_to_none = not cfg.ddp.gradient_as_bucket_view
    return Wrapped(
        raw_model, fwd_model, model, step_flags, sync_norms_at_eval, grads_to_none, env.is_main
    )


def batchnorm_statistics_only(model: nn.Module) -> bool:
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
