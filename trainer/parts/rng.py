"""Seeding and capturing every random number generator the loop can touch.

Each rank seeds with ``seed + rank`` so dropout and augmentation differ between ranks (the same
masks everywhere would waste the extra data). The model is initialised from ``seed`` alone, so
every rank starts from the same weights even before DDP broadcasts rank 0's.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np  # declared in ddpjob[trainer]: tasks and augmentations may draw from it
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """This process's generator states, in types ``torch.load(weights_only=True)`` accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` captured."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:  # absent from checkpoints written without numpy
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
