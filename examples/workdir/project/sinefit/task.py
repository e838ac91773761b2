"""Fit y = sin(frequency * x) + noise, with the settings read from a data file of the project.

The trainer imports this module (``task: sinefit.task:build``) from /workdir, where every pod
unpacked the project, and calls ``build(**task_args)``; DDP, devices, checkpoints and the events
stay the trainer's. Relative paths resolve in /workdir, the pods' working directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from sinefit.model import mlp


class SineFit:
    def __init__(self, frequency: float, noise: float, hidden: int, samples: int):
        self.frequency, self.noise = frequency, noise
        self.hidden, self.samples = hidden, samples

    def build_model(self) -> torch.nn.Module:
        return mlp(self.hidden)

    def build_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        g = torch.Generator().manual_seed(0)  # every rank builds the very same data

        def make(n: int) -> TensorDataset:
            x = torch.rand(n, 1, generator=g) * 4 - 2
            y = torch.sin(self.frequency * x) + self.noise * torch.randn(n, 1, generator=g)
            return TensorDataset(x, y)

        return make(self.samples), make(self.samples // 8)

    def loss(self, model, batch):
        x, y = batch
        pred = model(x)
        return F.mse_loss(pred, y), {"mae": (pred - y).abs().mean().detach()}


def build(settings: str = "data/wave.json") -> SineFit:
    """The factory the spec names; ``settings``: the project's data file, relative to it."""
    config = json.loads(Path(settings).read_text())
    return SineFit(**config)
