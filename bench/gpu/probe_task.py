"""gpu_check's task plug-in: the ``lm`` task with one forced fp16 gradient overflow.

``task=bench.gpu.probe_task:build task_args.overflow_at_step=3`` trains exactly what ``task=lm``
trains, except that on the 3rd training micro-batch the gradient flowing back into the logits
is multiplied by 2**40 in the logits' own dtype. Under fp16 autocast the logits are fp16, so
the gradient overflows to inf as a real overflow would; GradScaler finds inf in the unscaled
gradients, skips that optimizer step and halves its scale. The forward pass and the loss are
untouched, so the loop's NaN-loss guard does not fire and the loss curve stays comparable.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainer.tasks.lm import LMTask


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by ``factor`` in its dtype."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


class _OverflowingModel:
    """Calls the model for its logits, routes them through ``_ScaleGrad`` and computes the
    loss from them outside the model (what LMTask.loss needs: ``(logits, loss)``)."""

    def __init__(self, model: torch.nn.Module, factor: float):
        self.model, self.factor = model, factor
        self.training = model.training

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor):
        logits, _ = self.model(inputs)
        logits = _ScaleGrad.apply(logits, self.factor)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class OverflowLMTask(LMTask):
    """The lm task; training micro-batch number ``overflow_at_step`` (1-based) overflows."""

    def __init__(self, overflow_at_step: int = 3, overflow_factor: float = 2.0**40, **lm_args: Any):
        super().__init__(**lm_args)
        self.overflow_at_step = overflow_at_step
        self.overflow_factor = overflow_factor
        self.calls = 0

    def loss(self, model: torch.nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if model.training:
            self.calls += 1
            if self.calls == self.overflow_at_step:
                return super().loss(_OverflowingModel(model, self.overflow_factor), batch)
        return super().loss(model, batch)


# The factory for ``task=bench.gpu.probe_task:build``.
build = OverflowLMTask
