"""What rank 0 tells the world: JSON-lines events on stdout, a tqdm bar, NVML, TensorBoard, its
experiment tracker (MLflow, ``tracker.py``) and inside a TrainJob that offers it, Kubeflow
Trainer's progress API (``progress_api.py``); and what every rank's Prometheus metrics read of
the events (``metrics.py``).

The events are the trainer's stdout contract with the controller (``trainer.contract``): one JSON
object per line with an ``"event"`` key, flushed immediately. Keys are added, never renamed.
Only rank 0 emits; on other ranks every method is a no-op but the metrics' (each rank keeps its
own), so the loop needs no ``if rank``.
"""

from __future__ import annotations

import sys
from typing import Any

from trainer.contract import EVAL, TRACKING, TRAIN, format_event


class GpuMonitor:
    """Per-GPU utilization, memory, temperature and power via NVML (nvidia-ml-py).

    Silently empty when the library or a driver is missing: a CPU run has no GPU keys at all.
    """

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception:  # no package, no driver, no GPU: nothing to report
            self.handles = []

    def read(self) -> list[dict[str, float]]:
        out = []
        for i, h in enumerate(self.handles):
            try:
                nv = self.nvml
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                out.append(
                    {
                        "index": i,
                        "util_pct": float(util.gpu),
                        "mem_used_gib": mem.used / 2**30,
                        "mem_total_gib": mem.total / 2**30,
                        "temp_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                        "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    }
                )
            except Exception:  # a reading can fail transiently; skip that GPU this time
                continue
        return out


class Reporter:
    """Rank 0's outputs. Construct on every rank; only rank 0 does anything."""

    def __init__(
        self,
        enabled: bool,
        max_steps: int,
        progress: str,
        tensorboard_dir: str | None,
        stream=None,
    ):
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.gpus = GpuMonitor() if enabled else None
        self.bar = None
        self.tb = None
        self.progress_api = None
        #: This rank's Prometheus metrics (``telemetry.metrics.Metrics``), where served.
        self.metrics: Any = None
        #: Rank 0's experiment tracker (``telemetry.tracker.Tracker``), where one tracks.
        self.tracker: Any = None
        if not enabled:
            return
        from trainer.telemetry.progress_api import ProgressPoster

        # Inside a TrainJob whose controller serves the progress API (progress_api.py).
        self.progress_api = ProgressPoster.from_env()
        show_bar = progress == "always" or (progress == "auto" and self.stream.isatty())
        if show_bar:
            from tqdm import tqdm

            # The bar goes to stderr so stdout stays pure JSON lines plus human lines.
            self.bar = tqdm(total=max_steps, desc="train", unit="step", dynamic_ncols=True)
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(tensorboard_dir)

    def event(self, name: str, **fields: Any) -> None:
        """Print one ``{"event": name, ...}`` line and flush (a pod's stdout is a pipe)."""
        if self.metrics is not None:
            self.metrics.event(name, fields)
        if not self.enabled:
            return
        if name == TRAIN and self.gpus and self.gpus.handles:
            fields["gpus"] = self.gpus.read()
        self._announce_tracking()
        self._print(format_event(name, **fields))
        self._tensorboard(name, fields)
        if self.progress_api is not None:
            self.progress_api.event(name, fields)
        if self.tracker is not None:
            self.tracker.event(name, fields)

    def end_tracking(self, reason: str, wait_s: float) -> int | None:
        """End the tracker's run with ``reason`` (the ``done`` event's, printed next), waiting at
        most ``wait_s`` for what it still sends; the points that never reached the server
        (None: nothing tracked)."""
        if self.tracker is None:
            return None
        dropped = self.tracker.end(reason, wait_s)
        self._announce_tracking()
        self.tracker = None
        return dropped

    def _announce_tracking(self) -> None:
        """The ``tracking`` event, once the tracker knows its run (its thread finds it)."""
        found = self.tracker.announcement() if self.tracker is not None else None
        if found is not None:
            self._print(format_event(TRACKING, **found))

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def say(self, text: str) -> None:
        """A human line on stdout (rank 0), beside the events."""
        if self.enabled:
            self._print(text)

    def advance(self, step: int, loss: float | None = None) -> None:
        """Move the bar to ``step``."""
        if self.bar is not None:
            self.bar.n = step
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.refresh()

    def _tensorboard(self, name: str, fields: dict[str, Any]) -> None:
        if self.tb is None or "step" not in fields:
            return
        step = fields["step"]
        scalars = fields.get("metrics", fields) if name == EVAL else fields
        for key, value in scalars.items():
            if isinstance(value, int | float) and key not in ("step", "max_steps", "epoch"):
                group = "perf" if key.endswith(("_per_s", "_s")) or key == "data_wait" else name
                self.tb.add_scalar(f"{group}/{key}", value, step)

    def close(self, wait_s: float | None = None) -> None:
        """End the bar, TensorBoard and the progress API, whose last state (100% when done)
        is posted after the rate limit, waiting at most ``wait_s`` (None: its own default)."""
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.progress_api is not None:
            self.progress_api.close(timeout_s=wait_s)
            self.progress_api = None
