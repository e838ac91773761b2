"""Evaluation: when (every ``eval_every`` steps, and once at the end) and what (loss and the task's
metrics over ``eval_batches`` batches per rank, reduced over all ranks, for the model and its EMA).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import distributed as dist_
from trainer.contract import EVAL
from trainer.parts.loader import batch_len, to_device
from trainer.parts.optimizer import Ema
from trainer.telemetry.events import Reporter


class Evaluator:
    """Evaluates ``model`` (and ``ema``'s copy) on every rank and reports the ``eval`` event."""

    def __init__(
        self,
        task: Any,
        loader: DataLoader,
        model: nn.Module,
        raw_model: nn.Module,
        ema: Ema | None,
        report: Reporter,
        autocast: Callable[[], contextlib.AbstractContextManager],
        device: torch.device,
        *,
        eval_every: int,
        eval_batches: int,
        max_steps: int,
        sync_norms: bool,
    ):
        self.task, self.loader, self.report, self.autocast = task, loader, report, autocast
        self.model, self.raw_model, self.ema, self.device = model, raw_model, ema, device
        self.eval_every, self.eval_batches, self.max_steps = eval_every, eval_batches, max_steps
        # BatchNorm statistics that DDP does not broadcast every forward: rank 0's, before each
        # evaluation (see trainer.train._batchnorm_statistics_only).
        self.sync_norms = sync_norms

    def should_evaluate(self, step: int) -> bool:
        """Whether ``step`` is an evaluation step of the cadence; the end of a completed run
        evaluates besides."""
        return bool(self.eval_every) and step % self.eval_every == 0 and step < self.max_steps

    def run(self, step: int) -> None:
        """Evaluate now (collective) and report it."""
        if self.sync_norms:
            # Every rank evaluates rank 0's model, the one its checkpoint holds.
            models = [self.raw_model] + ([self.ema.module] if self.ema is not None else [])
            buffers = [b for m in models for b in m.buffers()]
            dist_.broadcast_tensors(buffers, what="evaluation buffer broadcast")
        metrics = self.evaluate(self.model)
        if self.ema is not None:
            metrics |= {f"ema_{k}": v for k, v in self.evaluate(self.ema.module).items()}
        self.report.event(EVAL, step=step, metrics=metrics)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss and task metrics over ``eval_batches`` batches per rank, over all ranks."""
        was_training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for i, batch in enumerate(self.loader):
            if i == self.eval_batches:
                break
            batch = to_device(batch, self.device)
            n = batch_len(batch)
            with self.autocast():
                loss, metrics = self.task.loss(model, batch)
            for k, v in {"loss": loss, **metrics}.items():
                sums[k] = sums.get(k, 0) + v.detach().float() * n
            count += n
        keys = sorted(sums)  # the same order on every rank, for one flat all-reduce
        total = torch.tensor(float(count), device=self.device)
        flat = torch.stack([*(sums[k] for k in keys), total])
        flat = dist_.all_reduce_sum(flat, what="evaluation all-reduce").tolist()
        model.train(was_training)
        return {k: v / flat[-1] for k, v in zip(keys, flat[:-1], strict=True)}
