"""Optimizer, learning-rate schedule and weight EMA: AdamW with decoupled decay, linear warmup +
cosine, and an exponential moving average of the weights updated with foreach kernels."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import TrainConfig


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, world_size: int, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over two groups: matrices decay, biases and norm weights (1-D) do not.

    With ``scale_lr`` the peak lr grows linearly with world size (the global batch does).
    Fused on CUDA and on CPU alike: one kernel per step instead of several per parameter, and
    the one implementation that honours ``found_inf``, with which the loop skips a step whose
    loss is not finite on the device, without first reading the loss on the host.
    """
    lr = cfg.lr * world_size if cfg.scale_lr else cfg.lr
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, fused=device.type in ("cuda", "cpu"))


def clip_in_step(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float
) -> torch.Tensor:
    """Clip the gradients' global norm to ``max_norm`` inside the optimizer's next step; return
    the norm (before clipping, as ``clip_grad_norm_`` returns it).

    ``clip_grad_norm_`` scales every gradient by ``min(1, max_norm / (norm + 1e-6))`` in a pass
    of its own, and the step then reads them all again. Here the norm is computed the same way
    and the inverse factor becomes fused AdamW's ``grad_scale``, the hook GradScaler uses to
    unscale inside the step: the step divides each gradient by it as it reads it. The same
    update, one pass over the gradients fewer. Fused AdamW only (``build_optimizer``'s); the
    caller deletes ``optimizer.grad_scale`` after the step.
    """
    norm = global_norm(nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
    # float32: the fused kernels read grad_scale as a float.
    optimizer.grad_scale = torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
    return norm


def global_norm(norm: torch.Tensor) -> torch.Tensor:
    """The whole value of a norm: over sharded gradients (strategy fsdp) the norm is a DTensor
    of each rank's part, whose whole value is one all-reduce of a scalar; a plain norm as it is."""
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


def lr_factor(step: int, max_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier on the peak lr for optimizer step ``step`` (0-based).

    Linear warmup from 1/warmup to 1 over ``warmup_steps``, then cosine down to
    ``min_lr_ratio`` at ``max_steps``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LambdaLR:
    """A LambdaLR stepped once per optimizer step; its state is just the step count."""

    def factor(step: int) -> float:
        return lr_factor(step, cfg.max_steps, cfg.warmup_steps, cfg.min_lr_ratio)

    return LambdaLR(optimizer, factor)


class Ema:
    """An exponential moving average of a model's weights, kept in a copy of the model.

    ``update()`` after each optimizer step: the first copies the weights, later ones move the
    average towards them by ``1 - decay``. Buffers (BatchNorm statistics) are copied, not
    averaged, as torch's ``AveragedModel`` does by default. That class is what this replaces:
    its ``update_parameters`` keeps the update count in a CPU tensor and copies it to the GPU
    on every call, a blocking copy that waits for the GPU's queue to drain (a host sync per
    step, torch/optim/swa_utils.py), and it copies each buffer in a Python loop. Here the count
    is a Python int, and an update is one foreach lerp over the weights and one foreach copy
    over the buffers. The checkpoint format is ``AveragedModel``'s, ``{"model": state_dict,
    "n_averaged": count}``, so checkpoints written before this class load as they did.
    """

    def __init__(self, model: nn.Module, decay: float, module: nn.Module | None = None):
        """``module``: the average's own copy of the model's structure, sharded as the model is
        (strategy fsdp, whose modules cannot be deep-copied); by default a copy of ``model``. Its
        weights do not matter: the first update copies the model's."""
        self.module = (module if module is not None else copy.deepcopy(model)).requires_grad_(False)
        self.decay = decay
        self.updates = 0
        # Pairs in the same order (the copy has the model's structure; tied weights appear once
        # in both). Loading a checkpoint copies into these tensors, so the lists stay valid.
        # Sharded parameters are averaged shard by shard: each rank its own part.
        with torch.no_grad():
            self._average = _local(self.module.parameters())
            self._weights = _local(model.parameters())
        self._buffers = list(self.module.buffers())
        self._sources = list(model.buffers())

    @torch.no_grad()
    def update(self) -> None:
        """Average in the model's current weights (one step)."""
        if self.updates == 0:
            torch._foreach_copy_(self._average, self._weights)
        else:
            torch._foreach_lerp_(self._average, self._weights, 1.0 - self.decay)
        if self._buffers:
            torch._foreach_copy_(self._buffers, self._sources)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "n_averaged": torch.tensor(self.updates)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.updates = int(state["n_averaged"])


def _local(tensors: Any) -> list[torch.Tensor]:
    """Each tensor, or this rank's shard of it (a DTensor's local tensor, sharing its storage)."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
