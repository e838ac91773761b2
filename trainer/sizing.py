"""How much GPU memory a model's training state takes per rank, before anything runs: the rule of
thumb behind ``validate`` and ``doctor``, and the built-in tasks' parameter counts. Torch-free:
the controller reads it on a laptop.

Training with AdamW keeps, per parameter: the fp32 weight (4 bytes), its gradient (4) and AdamW's
two moments (8): **16 bytes**, plus 4 with an EMA of the weights. bf16 changes none of them: the
weights the optimizer steps stay fp32, and the bf16 copies a forward uses live only while it runs.
Strategy ddp keeps all of it on every rank; strategy fsdp keeps 1/world_size of it on each, and
while it accumulates micro-batches without reducing each (``fsdp.reduce_each_micro_batch``
false, grad_accum > 1) the whole gradients besides: 4 bytes per parameter on every rank. What
this leaves out (activations, the bf16 copies, the CUDA context, the allocator's slack) needs the
rest of the GPU: a model state above :data:`FITS` of the GPU's memory is reported as not fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import TrainConfig

#: Bytes per parameter of the training state: fp32 weight, gradient, two AdamW moments.
STATE_BYTES = 16
#: ... and of an EMA of the weights (fp32).
EMA_BYTES = 4
#: ... of which the gradient.
GRADIENT_BYTES = 4
#: The share of a GPU's memory the model state may take and still leave room to train.
FITS = 0.8

GIB = 1 << 30
_CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"


@dataclass(frozen=True)
class Estimate:
    """One rank's model state for a job, and whether it fits the ``room_bytes`` of memory a rank
    has. ``room`` names that memory, ``{size}`` standing for its size: a GPU's, or a CPU
    rank's share of its pod's."""

    parameters: int
    strategy: str
    world_size: int
    ema: bool
    room_bytes: int | None
    room: str = "a {size} GPU"
    #: Strategy fsdp accumulating micro-batches without reducing each: every rank holds the
    #: whole fp32 gradients until the step's last backward.
    whole_gradients: bool = False

    @property
    def per_parameter(self) -> int:
        return STATE_BYTES + (EMA_BYTES if self.ema else 0)

    @property
    def bytes_per_rank(self) -> int:
        total = self.parameters * self.per_parameter
        if self.strategy != "fsdp":
            return total
        return math.ceil(total / self.world_size) + self._whole_gradient_bytes

    @property
    def _whole_gradient_bytes(self) -> int:
        return self.parameters * GRADIENT_BYTES if self.whole_gradients else 0

    @property
    def fits(self) -> bool | None:
        """None when the rank's memory is not known."""
        if self.room_bytes is None:
            return None
        return self.bytes_per_rank <= FITS * self.room_bytes

    def line(self) -> str:
        """``model state per rank: ...``: the figure, how it was reckoned, and what to change."""
        return f"model state per rank: {self.detail()}"

    def detail(self) -> str:
        """:meth:`line` after its name."""
        share = f"/{self.world_size} ranks" if self.strategy == "fsdp" else " on every rank"
        if self._whole_gradient_bytes:
            share += f", + {GRADIENT_BYTES} bytes of whole gradients while accumulating"
        text = (
            f"{_size(self.bytes_per_rank)} ({_count(self.parameters)} "
            f"parameters x {self.per_parameter} bytes{share}, strategy {self.strategy})"
        )
        if self.fits is None:
            return text + "; set resources.gpu_memory to check that it fits"
        usable = _size(FITS * self.room_bytes)
        room = f"{FITS:.0%} of {self.room.format(size=_size(self.room_bytes))} ({usable})"
        if self.fits:
            return f"{text}: fits in {room}"
        return f"{text}: more than {room}. {self._advice()}"

    def _advice(self) -> str:
        assert self.room_bytes is not None
        room = FITS * self.room_bytes - self._whole_gradient_bytes
        if room <= 0:
            return "Set fsdp.reduce_each_micro_batch (or grad_accum 1), or a smaller model"
        need = math.ceil(self.parameters * self.per_parameter / room)
        if self.strategy == "ddp":
            return f"Use strategy fsdp over at least {need} GPUs, or a smaller model"
        tip = ", or set fsdp.reduce_each_micro_batch" if self._whole_gradient_bytes else ""
        return (
            f"Shard it over at least {need} GPUs (nodes x nproc_per_node){tip}, or a smaller model"
        )


def estimate(
    cfg: TrainConfig,
    world_size: int,
    room_bytes: int | None,
    room: str = "a {size} GPU",
    parameters: int | None = None,
) -> Estimate | None:
    """The estimate for a run of ``cfg`` on ``world_size`` ranks, for its model of ``parameters``
    (by default a built-in task's count; None for a task of one's own: its model is built only
    where it trains, and the trainer says its state there)."""
    count = parameters if parameters is not None else parameter_count(cfg.task, cfg.task_args)
    if count is None:
        return None
    whole = cfg.strategy == "fsdp" and cfg.grad_accum > 1 and not cfg.fsdp.reduce_each_micro_batch
    ema = cfg.ema_decay is not None
    return Estimate(count, cfg.strategy, world_size, ema, room_bytes, room, whole)


def parameter_count(task: str, task_args: dict[str, Any]) -> int | None:
    """The built-in task's parameter count for ``task_args`` (None for another task, or
    arguments the task would refuse). The functions below take the tasks' own arguments
    (trainer.tasks.lm.LMTask, trainer.tasks.vision.VisionTask); tests/trainer/test_strategy.py
    holds their counts to the real models'."""
    try:
        if task == "lm":
            return _lm_parameters(**task_args)
        if task == "vision":
            return _vision_parameters(**task_args)
    except (TypeError, ValueError, OSError):
        return None
    return None


def _lm_parameters(
    corpus: str | None = None,
    block_size: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 64,
    dropout: float = 0.1,
    bias: bool = False,
    eval_fraction: float = 0.1,
) -> int:
    """trainer.tasks.lm.TinyGPT: embeddings (vocabulary rounded up to 64 rows; the head shares
    them), per block two norms, q/k/v, the output projection and a 4x MLP, a final norm."""
    vocab = len(set(Path(corpus or _CORPUS).read_text(encoding="utf-8")))
    rows = -(-vocab // 64) * 64
    c = n_embd
    norm = c * (2 if bias else 1)
    block = 2 * norm + 12 * c * c + (3 * c + c + 4 * c + c if bias else 0)
    return rows * c + block_size * c + n_layer * block + norm


def _vision_parameters(
    num_classes: int = 10,
    image_size: int = 16,
    width: int = 32,
    train_size: int = 8192,
    eval_size: int = 1024,
    noise: float = 0.5,
    data_seed: int = 1234,
) -> int:
    """trainer.tasks.vision.SmallCNN: three 3x3 convolutions without bias, each with a
    BatchNorm (weight and bias), and a linear head."""
    chans = [3, width // 2, width, width * 2]
    convs = sum(chans[i] * chans[i + 1] * 9 + 2 * chans[i + 1] for i in range(3))
    return convs + chans[-1] * num_classes + num_classes


def _size(n: float) -> str:
    if n < GIB:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / GIB:.1f} GiB" if n < 10 * GIB else f"{n / GIB:.0f} GiB"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
