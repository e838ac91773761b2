"""The project's own model: an MLP for a 1-D regression."""

from __future__ import annotations

from torch import nn


def mlp(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(1, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 1),
    )
