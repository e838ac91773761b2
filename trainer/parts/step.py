"""One optimizer step: ``grad_accum`` micro-batches forward and backward, then the update.

All micro-batches but the last run without reducing the gradients (the strategy's
``micro_batch``: DDP's ``no_sync``, FSDP's gradient sync off), so they are reduced once per step,
and every rank learns the step's ``[loss, stop]`` summed over the ranks (under DDP they ride in
its last bucket, ``distributed.StepFlags``; under FSDP one small all-reduce after backward), so
every rank takes the same branch (NaN skip, preemption). Then unscale -> clip -> step -> zero
(with ``fused_clip``, the clip is folded into the step).
The update is queued before the host looks at the step's loss: a step whose loss is not finite
is skipped on the device (``found_inf``), and the host's one read per step waits for the end of
backward, not for an empty queue (``HostFlags``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainer.distributed import COLLECTIVES
from trainer.parts.loader import MicroBatches
from trainer.parts.optimizer import clip_in_step, global_norm
from trainer.parts.stop import StopRequest
from trainer.parts.strategy import Strategy
from trainer.parts.window import LogWindow


class HostFlags:
    """The step's ``[loss, stop]`` on the host, read without draining the device's queue.

    ``start(flags)`` queues a copy into pinned host memory (and marks it with an event) right
    after backward; the update is queued next; ``read()`` waits for that copy only, so the GPU
    still has the clip and the optimizer step to run while the host decides and starts the next
    step. On CPU the copy is immediate.
    """

    def __init__(self, device: torch.device):
        cuda = device.type == "cuda"
        self.values = torch.zeros(2, pin_memory=cuda)
        self.copied = torch.cuda.Event() if cuda else None

    def start(self, flags: torch.Tensor) -> None:
        self.values.copy_(flags, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def read(self) -> list[float]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.values.tolist()


class TrainStep:
    """Runs one optimizer step of ``model`` and hands the host its global loss and stop flag."""

    def __init__(
        self,
        strategy: Strategy,
        params: list[nn.Parameter],
        task: Any,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        autocast: Callable[[], contextlib.AbstractContextManager],
        stop: StopRequest,
        *,
        grad_accum: int,
        grad_clip: float,
        fused_clip: bool = False,
        world_size: int,
        device: torch.device,
    ):
        self.strategy, self.model, self.params, self.task = strategy, strategy.model, params, task
        self.optimizer, self.scaler, self.autocast = optimizer, scaler, autocast
        self.stop = stop
        self.grad_accum, self.grad_clip = grad_accum, grad_clip
        # Clipping inside fused AdamW's step; fp16 clips apart: its GradScaler owns grad_scale.
        self.fused_clip = fused_clip
        self.loss_divisor = world_size * grad_accum  # the flags hold the sum over both
        self.host_flags = HostFlags(device)
        self.stop_flag = torch.zeros((), device=device)
        self.grads_to_none = strategy.grads_to_none

    def run(
        self, batches: MicroBatches, window: LogWindow, want_norm: bool
    ) -> tuple[float, bool, torch.Tensor | None]:
        """One step: (mean loss over ranks and micro-batches, whether any rank asked to stop,
        the gradient norm on the device where it was computed: with clipping, or ``want_norm``).
        """
        flags = self._forward_backward(batches, window)
        norm = self._update(flags, want_norm)
        loss, stop = self.host_flags.read()  # the step's one wait for the device
        COLLECTIVES.leave()  # the gradient all-reduce (its hook entered it) is over by now
        return loss / self.loss_divisor, bool(stop), norm

    def _forward_backward(self, batches: MicroBatches, window: LogWindow) -> torch.Tensor:
        loss_sum = None
        for micro in range(self.grad_accum):
            t_data = time.perf_counter()
            batch = next(batches)  # drawn during the previous backward
            window.data_s += time.perf_counter() - t_data
            last = micro == self.grad_accum - 1
            # Gradients accumulate locally; they are reduced once per step, in the last backward.
            with self.strategy.micro_batch(last):
                with self.autocast():
                    loss, _ = self.task.loss(self.model, batch)
                detached = loss.detach().float()
                loss_sum = detached if loss_sum is None else loss_sum + detached
                if last:
                    flags = self._flags(loss_sum)
                if self.grad_accum > 1:
                    loss = loss / self.grad_accum
                self.scaler.scale(loss).backward()
            # The next micro-batch's host work (indexing, collating, pinning, starting its
            # copy) while the GPU is still busy with this backward.
            t_data = time.perf_counter()
            batches.prefetch()
            window.data_s += time.perf_counter() - t_data
        return self.strategy.after_backward(flags)

    def _flags(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """[this rank's loss, whether it was told to stop], into the last bucket under DDP."""
        self.stop_flag.fill_(float(self.stop.requested))
        flags = torch.stack([loss_sum, self.stop_flag])
        self.strategy.before_last_backward(flags)
        return flags

    def _update(self, flags: torch.Tensor, want_norm: bool) -> torch.Tensor | None:
        self.host_flags.start(flags)
        # Queued before the host knows the loss: if it is not finite, fused AdamW skips the step
        # on the device (found_inf: the protocol GradScaler uses, torch/amp/grad_scaler.py), step
        # count included. With fp16, GradScaler sets it from the gradients, which a non-finite
        # loss makes non-finite too. Unscale first, so clipping sees the true gradients.
        self.scaler.unscale_(self.optimizer)
        norm = None
        folded = self.grad_clip > 0 and self.fused_clip and not self.scaler.is_enabled()
        if folded:  # the clip factor goes into the step (grad_scale), not a pass of its own
            norm = clip_in_step(self.optimizer, self.params, self.grad_clip)
        elif self.grad_clip > 0:
            norm = global_norm(nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        elif want_norm:
            grads = [p.grad for p in self.params if p.grad is not None]
            norm = global_norm(nn.utils.get_total_norm(grads))
        own_skip = not self.scaler.is_enabled()
        if own_skip:
            self.optimizer.found_inf = torch.isfinite(flags[0]).logical_not().float()
        # The scaler skips the update if fp16 gradients overflowed, and lowers the scale.
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if own_skip:
            del self.optimizer.found_inf
        if folded:
            del self.optimizer.grad_scale
        self.optimizer.zero_grad(set_to_none=self.grads_to_none)
        return norm
