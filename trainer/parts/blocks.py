"""A model's blocks: the repeated units the sharded strategy shards one by one (FSDP's unit of
all-gather and free) and activation checkpointing recomputes.

A task names them with ``blocks(model)`` (the built-in lm task: its transformer blocks). Without
that, they are the modules of the model's largest ``nn.ModuleList`` (by parameters: the layers of
the usual transformer), else its direct children that hold parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


def blocks_of(task: Any, model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model``, as ``task`` says or by the rule above."""
    named = getattr(task, "blocks", None)
    if callable(named):
        return list(named(model))
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if lists:
        return list(max(lists, key=_parameters))
    return [c for c in model.children() if _parameters(c)]


def _parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def recompute_activations(blocks: list[nn.Module]) -> None:
    """Each block's forward keeps only its inputs; backward runs it again (non-reentrant
    ``torch.utils.checkpoint``, with the RNG state of the first run, so dropout masks agree).
    The module's own ``forward`` is wrapped in place: its parameters' names do not change, nor
    do checkpoints."""
    for block in blocks:
        block.forward = functools.partial(
            checkpoint, block.forward, use_reentrant=False, preserve_rng_state=True
        )
