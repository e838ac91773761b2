"""The sharded strategy: FSDP2 (``torch.distributed.fsdp.fully_shard``). Each rank holds
1/world_size of every parameter, its gradient and its optimizer state (DTensors sharded on dim 0);
a block's parameters are all-gathered for its forward and backward and freed after, and its
gradients are reduce-scattered, so that each rank keeps the gradient of its own shard.

``fully_shard`` is applied to each block (``trainer.parts.blocks``), then to the root (which takes
what no block holds: embeddings, the head, final norms), as torchtitan does. With bf16 the
gathered parameters and the compute are bf16 and the gradients are reduced in fp32
(``MixedPrecisionPolicy``); the sharded parameters the optimizer steps stay fp32. With compile,
each block is compiled on its own before it is sharded (the root's forward between blocks runs
eagerly).

What the step needs of the strategy differs from DDP's in three places:

- accumulation: the micro-batches before the last run with ``set_requires_gradient_sync(False)``:
  gradients accumulate whole and unreduced, and the last backward reduce-scatters once (with
  ``fsdp.reduce_each_micro_batch``, every backward reduce-scatters: sharded gradients accumulate,
  at one reduce-scatter per micro-batch);
- the step's ``[loss, stop]`` flags: there is no gradient all-reduce to ride in (DDP's StepFlags
  comm hook), so they are one all-reduce of two floats after backward;
- the gradient norm: the norm of sharded gradients is a DTensor, whose whole value (one
  all-reduce of a scalar) is what clipping and the log window read.

Buffers (BatchNorm statistics) are not sharded: every rank keeps its own, and rank 0's are
broadcast before each evaluation and each checkpoint, as DDP's are before evaluation.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainer import distributed as dist_
from trainer.config import TrainConfig
from trainer.distributed import DistEnv
from trainer.parts.blocks import blocks_of
from trainer.parts.optimizer import Ema

_DTYPES = {"bf16": torch.bfloat16}

#: The name the watchdog gives the flags' all-reduce (``trainer.distributed.COLLECTIVES``).
STEP_FLAGS = "step flags all-reduce"


def wrap(raw_model: nn.Module, task: Any, cfg: TrainConfig, env: DistEnv) -> Sharded:
    """``raw_model`` (on the CPU) sharded over the job's ranks onto this rank's device."""
    shard(raw_model, task, cfg, env, compile_blocks=cfg.compile)
    return Sharded(raw_model, task, cfg, env)


def shard(
    model: nn.Module, task: Any, cfg: TrainConfig, env: DistEnv, *, compile_blocks: bool
) -> None:
    """``fully_shard`` ``model`` over every rank of the job, per block and at the root, in place
    (each rank's shards go to its device; the whole model never does); with ``compile_blocks``,
    each block compiled first. With a process group of one rank (a one-replica job) the model is
    sharded all the same, one shard, so that the code that runs is the one eight ranks run;
    without a process group (``python -m trainer`` alone) the model goes to the device whole."""
    blocks = blocks_of(task, model)
    if compile_blocks:
        for block in blocks:
            block.compile(mode=cfg.compile_mode)
    if not env.distributed:
        model.to(env.device)
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    low = _DTYPES.get(cfg.precision)
    mixed = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
    for block in blocks:
        fully_shard(
            block,
            mesh=mesh,
            mp_policy=mixed,
            reshard_after_forward=cfg.fsdp.reshard_after_forward,
        )
    # The root's own parameters are needed first in backward: FSDP keeps them (its default).
    fully_shard(model, mesh=mesh, mp_policy=mixed)


class Sharded:
    """What the loop asks of strategy fsdp (``trainer.parts.strategy.Strategy``; see the module
    docstring)."""

    #: FSDP's gradients are new DTensors each step: none to reuse.
    grads_to_none = True
    #: No gradient all-reduce to carry the flags (nor to time a rank's share of the step by).
    step_flags = None

    def __init__(self, raw_model: nn.Module, task: Any, cfg: TrainConfig, env: DistEnv):
        from torch.distributed.fsdp import FSDPModule

        self.raw_model = self.fwd_model = self.model = raw_model
        self.task, self.cfg, self.env = task, cfg, env
        self.sharded = isinstance(raw_model, FSDPModule)
        self.sync_norms_at_eval = self.sharded and any(True for _ in raw_model.buffers())

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """Reduce-scatter the gradients in the ``last`` micro-batch's backward only (before,
        they accumulate whole), unless ``fsdp.reduce_each_micro_batch``."""
        if self.sharded and not self.cfg.fsdp.reduce_each_micro_batch:
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def before_last_backward(self, flags: torch.Tensor) -> None:
        """Nothing: the flags are reduced after backward."""

    def after_backward(self, flags: torch.Tensor) -> torch.Tensor:
        """The step's flags summed over the ranks: one all-reduce of two floats."""
        return dist_.all_reduce_sum(flags, what=STEP_FLAGS)

    def make_ema(self, task: Any, decay: float) -> Ema:
        """The average in a model of its own, sharded as the model is (a sharded module cannot
        be copied); the first update copies the weights into it."""
        module = task.build_model()
        shard(module, task, self.cfg, self.env, compile_blocks=False)
        return Ema(self.raw_model, decay, module=module)

    def state(self, optimizer: torch.optim.Optimizer, ema: Ema | None) -> dict[str, Any]:
        """This rank's shards of the model, optimizer and EMA states (DCP's sharded state
        dicts), with rank 0's buffers on every rank first: FSDP does not keep them equal."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        models = [self.raw_model] + ([ema.module] if ema is not None else [])
        buffers = [b for m in models for b in m.buffers()]
        if buffers:
            dist_.broadcast_tensors(buffers, what="buffer broadcast")
        weights, moments = get_state_dict(self.raw_model, optimizer)
        state = {"model": weights, "optimizer": moments}
        if ema is not None:
            state["ema"] = ema.state_dict()
        return state

    def load_state(
        self,
        optimizer: torch.optim.Optimizer,
        ema: Ema | None,
        state: dict[str, Any],
        path: str | None,
    ) -> None:
        """Put the shards a checkpoint was loaded into (``state``, from :meth:`state`) in place."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.raw_model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        if ema is not None and "ema" in state:
            ema.load_state_dict(state["ema"])
