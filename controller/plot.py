"""``plot``: loss and throughput curves from the trainer's rank-0 ``train`` events.

matplotlib is imported here, lazily, and with the Agg backend: a laptop without a display (or
CI) writes the PNG all the same, and nothing else in the controller pays for the import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.errors import ClusterError, UserError
from trainer.contract import TRAIN, parse_event


def train_series(lines: Iterable[str]) -> dict[str, list[float]]:
    """step, loss, samples_per_s from ``train`` events; a resumed run's repeated steps keep
    the latest value (the attempt that went on)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in lines:
        ev = parse_event(line)
        if ev and ev.get("event") == TRAIN and isinstance(ev.get("step"), int):
            by_step[ev["step"]] = ev
    steps = sorted(by_step)
    return {
        "step": [float(s) for s in steps],
        "loss": [float(by_step[s].get("loss", float("nan"))) for s in steps],
        "samples_per_s": [float(by_step[s].get("samples_per_s", float("nan"))) for s in steps],
    }


def plot_curves(lines: Iterable[str], path: str, *, title: str = "") -> int:
    """Write a two-panel PNG (loss, samples/s vs step); returns the number of points."""
    series = train_series(lines)
    if not series["step"]:
        raise UserError(
            f"plot: no train events in the log (got 0). Is this a ddpjob trainer "
            f'log? Plot needs the rank-0 `{{"event": "train"}}` lines ({path})'
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ClusterError(
            "plot: matplotlib is not installed (got ImportError). `pip install 'ddpjob[plot]'`"
        ) from None
    fig, (ax_loss, ax_rate) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_loss.plot(series["step"], series["loss"], color="tab:blue")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    ax_rate.plot(series["step"], series["samples_per_s"], color="tab:orange")
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_xlabel("step")
    ax_rate.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return len(series["step"])
