"""What is trained: the Task protocol, the built-in tasks, and loading a user's own.

A task is three things the loop needs and nothing else: a model, a train and an eval dataset,
and a function from (model, batch) to a scalar loss plus metrics. The loop owns everything
distributed (sampling, DDP, precision, checkpoints), so a task is plain single-device PyTorch.

Users plug in their own with ``task=package.module:factory``; ``factory(**task_args)`` must
return an object with the methods below (see ``examples/custom_task/``). A task may also say what
its model's repeated blocks are, ``blocks(model) -> list[nn.Module]`` (the units strategy fsdp
shards one by one and activation_checkpointing recomputes; ``trainer.parts.blocks`` says what
they are without it).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils.data import Dataset

from trainer.config import ConfigError

Batch = Any  # a tensor, or a tuple/list/dict of tensors, as the task's Dataset collates it


@runtime_checkable
class Task(Protocol):
    """The contract between a model and the training loop."""

    def build_model(self) -> nn.Module:
        """A freshly initialised model on CPU (the loop seeds the RNG and moves it)."""
        ...

    def build_datasets(self) -> tuple[Dataset, Dataset]:
        """(train, eval) map-style datasets; identical on every rank, no downloads."""
        ...

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean loss over the batch (backpropagated) and extra metrics (0-d means).

        Called in train mode for training and in eval mode (under ``torch.no_grad``) for eval.
        Only eval metrics are reported (beside the loss, as ``loss``), so a task may return
        ``{}`` while ``model.training`` and save the work.
        """
        ...


def tokens_per_sample(task: Task) -> int | None:
    """Tokens in one sample for ``tokens_per_s`` (tasks opt in with a ``tokens_per_sample``)."""
    return getattr(task, "tokens_per_sample", None)


def load_task(name: str, args: dict[str, Any]) -> Task:
    """Build the task named by the config: ``vision``, ``lm`` or ``package.module:factory``.

    Raises ConfigError (exit 2) when the module or factory does not exist, or the factory
    rejects ``task_args``: a user's mistake, not a crash.
    """
    if name == "vision":
        from trainer.tasks.vision import build as factory
    elif name == "lm":
        from trainer.tasks.lm import build as factory
    else:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise ConfigError(
                [f"task: cannot import {e.name} (got {name}). Is it on PYTHONPATH?"]
            ) from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ConfigError([f"task: {module_name} has no callable {attr} (got {name})"])
    try:
        # Bind first so a wrong keyword is a config error, while a TypeError raised inside
        # the factory stays a real bug with its traceback.
        inspect.signature(factory).bind(**args)
    except TypeError as e:
        raise ConfigError([f"task_args: {e} (got {args})"]) from None
    task = factory(**args)
    missing = [m for m in ("build_model", "build_datasets", "loss") if not hasattr(task, m)]
    if missing:
        raise ConfigError([f"task: {name} returned an object without {', '.join(missing)}"])
    return task
