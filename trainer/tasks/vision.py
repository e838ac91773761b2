"""``task=vision``: a small CNN with BatchNorm on procedurally generated images.

Each class is an oriented sine grating (class k has angle k*pi/C and its own frequency) with a
random phase, a random colour tint and pixel noise. Orientation is easy for a CNN to learn and
impossible to get from colour or brightness alone, so a falling loss means the model works.
Images are generated once, from a fixed seed, identically on every rank: no downloads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


def make_gratings(
    n: int, num_classes: int, image_size: int, noise: float, seed: int
) -> TensorDataset:
    """``n`` labelled images (3 x image_size x image_size, roughly zero mean, unit scale)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    angle = labels.float() * math.pi / num_classes
    freq = 2.0 + (labels % 3).float()  # cycles per image; varies so classes differ in two ways
    phase = torch.rand(n, generator=g) * 2 * math.pi
    coords = torch.linspace(0, 1, image_size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    proj = xx[None] * torch.cos(angle)[:, None, None] + yy[None] * torch.sin(angle)[:, None, None]
    wave = torch.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])
    tint = 0.5 + torch.rand(n, 3, generator=g)  # per-image colour: a nuisance, not a signal
    images = wave[:, None] * tint[:, :, None, None]
    images += noise * torch.randn(images.shape, generator=g)
    return TensorDataset(images, labels)


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks, global average pooling, a linear classifier."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        chans = [3, width // 2, width, width * 2]
        blocks = []
        for i in range(3):
            blocks += [
                nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            ]
            if i < 2:
                blocks.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(chans[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class VisionTask:
    """Classify gratings; metrics: accuracy."""

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int = 16,
        width: int = 32,
        train_size: int = 8192,
        eval_size: int = 1024,
        noise: float = 0.5,
        data_seed: int = 1234,
    ):
        self.num_classes = num_classes
        self.image_size = image_size
        self.width = width
        self.train_size = train_size
        self.eval_size = eval_size
        self.noise = noise
        self.data_seed = data_seed

    def build_model(self) -> nn.Module:
        return SmallCNN(self.num_classes, self.width)

    def build_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        args = (self.num_classes, self.image_size, self.noise)
        return (
            make_gratings(self.train_size, *args, seed=self.data_seed),
            make_gratings(self.eval_size, *args, seed=self.data_seed + 1),
        )

    def loss(self, model: nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images, labels = batch
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        if model.training:  # the loop only reports eval metrics: skip the work while training
            return loss, {}
        return loss, {"accuracy": (logits.argmax(dim=1) == labels).float().mean()}


# The factory for ``task=vision``: ``task_args`` are VisionTask's keyword arguments.
build = VisionTask
