"""The log window: the steps since the last ``train`` event, and that event.

Every rank keeps a window (only rank 0's reporter prints), and every rank reaches ``log`` at the
same steps: a collective over the window's figures fits there, once per window.
"""

from __future__ import annotations

import math
import time

import torch

from trainer.contract import TRAIN
from trainer.telemetry.events import Reporter


class StepClock:
    """The time at a step boundary: read once the device has finished every step queued before.

    The host runs ahead of the device (a step's update is queued before the host reads its
    loss), so a window timed on the host's clock alone would end while its last steps still
    run. Reading after a synchronize puts them, whole, in the window that queued them. The
    GPU check's baseline (bench/gpu/baseline.py) times its windows with this clock too, so the
    two loops' windows begin and end at the same point of a step.
    """

    def __init__(self, device: torch.device):
        self.device = device if device.type == "cuda" else None

    def __call__(self) -> float:
        if self.device is not None:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class LogWindow:
    """Wall time, data-wait time, samples, loss, lr and gradient norm over a logging window;
    a ``train`` event every ``log_every`` steps and at ``max_steps``."""

    def __init__(
        self,
        report: Reporter,
        *,
        log_every: int,
        max_steps: int,
        samples_per_step: int,
        tokens_per_sample: int | None,
        scaler: torch.amp.GradScaler,
        device: torch.device,
    ):
        self.report, self.log_every, self.max_steps = report, log_every, max_steps
        self.samples_per_step, self.tokens_per_sample = samples_per_step, tokens_per_sample
        self.scaler = scaler
        self.lr = math.nan
        # The last finite step's norm, on the device: read once per window, when logged.
        self.grad_norm = torch.zeros((), device=device)
        self.clock = StepClock(device)
        self.reset()

    def reset(self, at: float | None = None) -> None:
        """Start a window at ``at`` (a reading of ``clock``), or now."""
        self.start = self.clock() if at is None else at
        self.data_s = 0.0  # added to by the step while it waits for data
        self.steps = 0
        self.samples = 0
        self.loss_sum = 0.0
        self.loss_steps = 0  # steps with a finite loss (a skipped NaN step has none to average)

    def due(self, step: int) -> bool:
        """Whether ``step`` ends a window."""
        return step % self.log_every == 0 or step == self.max_steps

    def wants_norm(self, step: int) -> bool:
        """Whether ``step`` should compute the gradient norm when clipping does not."""
        return step % self.log_every == 0

    def add_step(self, loss: float, lr: float, norm: torch.Tensor | None) -> None:
        """A step that ran, with the lr it used and its norm (None: not computed, or skipped)."""
        self.steps += 1
        self.samples += self.samples_per_step
        self.lr = lr
        if norm is not None:
            self.grad_norm = norm
        if math.isfinite(loss):
            self.loss_sum += loss
            self.loss_steps += 1

    def figures(self, end: float) -> dict[str, float]:
        """The window's figures, its time ending at ``end`` (a reading of ``clock``)."""
        elapsed = max(end - self.start, 1e-9)
        return {
            "elapsed_s": elapsed,
            "samples_per_s": self.samples / elapsed,
            "step_time_s": elapsed / max(self.steps, 1),
            "data_wait": self.data_s / elapsed,
            "loss": self.loss_sum / self.loss_steps if self.loss_steps else math.nan,
        }

    def log(self, step: int, epoch: int, nonfinite_skips: int, **more: object) -> None:
        """The ``train`` event for the window ending at ``step`` (with ``more`` fields of other
        parts); the next window starts where this one ends, so the reads and the printing here
        count in the next one."""
        end = self.clock()  # after step's update, on the device too: the window's end
        w = self.figures(end)
        fields = dict(
            step=step,
            max_steps=self.max_steps,
            loss=w["loss"],
            lr=self.lr,
            grad_norm=float(self.grad_norm),
            samples_per_s=w["samples_per_s"],
            step_time_s=w["step_time_s"],
            data_wait=w["data_wait"],
            epoch=epoch,
            nonfinite_skips=nonfinite_skips,
        )
        if self.tokens_per_sample:
            fields["tokens_per_s"] = w["samples_per_s"] * self.tokens_per_sample
        if self.scaler.is_enabled():
            fields["loss_scale"] = self.scaler.get_scale()
        self.report.event(TRAIN, **fields, **more)
        self.reset(end)
