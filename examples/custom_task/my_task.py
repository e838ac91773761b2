"""A custom task plug-in: learn y = sin(3x) + noise with a small MLP.

Run it from the repository root (the package must be importable where the trainer runs)::

    python -m trainer task=examples.custom_task.my_task:build task_args.hidden=128 max_steps=300
    torchrun --nproc-per-node 2 -m trainer task=examples.custom_task.my_task:build

A task is any object with ``build_model``, ``build_datasets`` and ``loss`` (see
``trainer.tasks.Task``); ``build(**task_args)`` is the factory the trainer calls. The task
knows nothing about DDP, devices, precision or checkpoints: the loop owns all of that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


class SineRegression:
    """Regress a noisy sine wave; the eval metric ``mae`` is the mean absolute error."""

    def __init__(self, hidden: int = 64, samples: int = 4096, noise: float = 0.05):
        self.hidden = hidden
        self.samples = samples
        self.noise = noise

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(1, self.hidden),
            nn.Tanh(),
            nn.Linear(self.hidden, self.hidden),
            nn.Tanh(),
            nn.Linear(self.hidden, 1),
        )

    def build_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        # A fixed generator: every rank must build the very same datasets.
        g = torch.Generator().manual_seed(0)

        def make(n: int) -> TensorDataset:
            x = torch.rand(n, 1, generator=g) * 4 - 2
            y = torch.sin(3 * x) + self.noise * torch.randn(n, 1, generator=g)
            return TensorDataset(x, y)

        return make(self.samples), make(self.samples // 8)

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x, y = batch
        pred = model(x)
        return F.mse_loss(pred, y), {"mae": (pred - y).abs().mean().detach()}


def build(hidden: int = 64, samples: int = 4096, noise: float = 0.05) -> SineRegression:
    """The factory named on the command line; its keywords are the ``task_args``."""
    return SineRegression(hidden=hidden, samples=samples, noise=noise)
