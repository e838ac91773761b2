"""How the ranks share the model: strategy ``ddp`` (``trainer.parts.ddp``: every rank holds it
all, gradients all-reduced) or ``fsdp`` (``trainer.parts.fsdp``: every rank holds a shard,
checkpoints sharded). :func:`wrap` chooses once; the step, the EMA, evaluation and the checkpoint
ask the :class:`Strategy` what differs, and nothing else in the loop knows which it is.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.distributed import DistEnv, StepFlags

if TYPE_CHECKING:
    from trainer.parts.optimizer import Ema


class Strategy(Protocol):
    """What the loop asks of the strategy."""

    #: The model as checkpoints hold it (its parameters are the optimizer's).
    raw_model: nn.Module
    #: What evaluation runs: the model, compiled or not, without the DDP wrapper.
    fwd_model: nn.Module
    #: What the step runs forward and backward.
    model: nn.Module
    #: DDP's comm hook state (the step's flags ride in its gradient all-reduce); None otherwise.
    step_flags: StepFlags | None
    #: Rank 0's buffers are broadcast before each evaluation.
    sync_norms_at_eval: bool
    #: ``zero_grad(set_to_none=...)``: False where the gradients are DDP's buckets.
    grads_to_none: bool

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of a micro-batch's forward and backward: the gradients are reduced in
        the ``last`` one's backward only."""

    def before_last_backward(self, flags: torch.Tensor) -> None:
        """This rank's ``[loss, stop]``, given before the step's last backward."""

    def after_backward(self, flags: torch.Tensor) -> torch.Tensor:
        """The step's ``[loss, stop]`` summed over the ranks, once the last backward is done."""

    def make_ema(self, task: Any, decay: float) -> Ema:
        """An EMA of the model's weights, kept as the model is (whole or sharded)."""

    def state(self, optimizer: torch.optim.Optimizer, ema: Ema | None) -> dict[str, Any]:
        """The model's, optimizer's and EMA's part of a checkpoint, as this rank holds it
        (collective): ddp's whole on rank 0 (nothing elsewhere), fsdp's shards on every rank."""

    def load_state(
        self,
        optimizer: torch.optim.Optimizer,
        ema: Ema | None,
        state: dict[str, Any],
        path: str | None,
    ) -> None:
        """Put a checkpoint's model, optimizer and EMA state in place."""


def wrap(raw_model: nn.Module, task: Any, cfg: TrainConfig, env: DistEnv) -> Strategy:
    """``raw_model`` (built on the CPU) on this rank's device, wrapped by ``cfg.strategy``."""
    if cfg.strategy == "fsdp":
        from trainer.parts import fsdp

        return fsdp.wrap(raw_model, task, cfg, env)
    from trainer.parts import ddp

    return ddp.wrap(raw_model, cfg, env)
