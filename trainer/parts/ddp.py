"""The strategy that shares the work between the ranks: DDP, a full copy of the model on each rank
and its gradients all-reduced. :func:`wrap` is where the model is wrapped; another strategy (FSDP)
sits beside it with the same shape: the forward model in, :class:`Wrapped` out.

DDP only where there is someone to all-reduce with. At world size 1 (a one-replica job still has
a process group) the wrapper would add its hooks and a one-rank all-reduce per bucket, and under
compile Dynamo's DDPOptimizer would split the graph at every bucket boundary
(``torch._dynamo.config.optimize_ddp``), limiting fusion.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.config import TrainConfig
from trainer.distributed import DistEnv, StepFlags


@dataclass(frozen=True)
class Wrapped:
    """The model as the step runs it, and what the strategy adds to the loop."""

    #: What the step calls forward and backward: the DDP module, or the forward model itself.
    model: nn.Module
    #: The step's ``[loss, stop]``, reduced with the gradients (None without DDP).
    step_flags: StepFlags | None
    #: BatchNorm statistics are rank 0's, broadcast before each evaluation, not before every
    #: forward (see :func:`batchnorm_statistics_only`).
    sync_norms_at_eval: bool

    @property
    def ddp(self) -> bool:
        return self.step_flags is not None


def wrap(raw_model: nn.Module, fwd_model: nn.Module, cfg: TrainConfig, env: DistEnv) -> Wrapped:
    """``fwd_model`` (``raw_model``, compiled or not) in DDP when the job has more than one
    rank, with the step's flags riding in its gradient all-reduce (one round per step)."""
    if not (env.distributed and env.world_size > 1):
        return Wrapped(fwd_model, None, sync_norms_at_eval=False)
    sync_norms_at_eval = cfg.ddp.broadcast_buffers and batchnorm_statistics_only(raw_model)
    dev = env.device
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
    return Wrapped(model, step_flags, sync_norms_at_eval)


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
