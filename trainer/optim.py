"""Optimizer and learning-rate schedule: AdamW with decoupled decay, linear warmup + cosine."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import TrainConfig


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, world_size: int, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over two groups: matrices decay, biases and norm weights (1-D) do not.

    With ``scale_lr`` the peak lr grows linearly with world size (the global batch does).
    The fused kernel is one launch per step instead of several per parameter; CUDA only.
    """
    lr = cfg.lr * world_size if cfg.scale_lr else cfg.lr
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.betas, fused=device.type == "cuda" or None)


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
