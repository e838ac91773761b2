"""Numerics: the process's switches (TF32, cuDNN autotuning, deterministic algorithms), set before
any kernel runs, and what every forward runs under (mixed precision's autocast, the attention
kernel)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainer.config import TrainConfig

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# The `attention` setting's names for SDPA's kernels (torch.nn.attention.SDPBackend).
_SDPA = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def set_numerics(cfg: TrainConfig, device: torch.device) -> None:
    """The process's numerics switches: in place before any kernel runs."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
        torch.backends.cudnn.benchmark = not cfg.deterministic
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def forward_context(
    device_type: str, dtype: torch.dtype | None, attention: str = "auto"
) -> contextlib.AbstractContextManager:
    """What every forward runs under: mixed precision's autocast for ``dtype`` (nothing for
    fp32), and with ``attention`` other than auto, SDPA limited to that one kernel. Scoped to
    the forward, not set for the process: the kernel is chosen when SDPA runs (or when compile
    traces it), and nothing else in the process is changed."""
    stack = contextlib.ExitStack()
    if dtype is not None:
        stack.enter_context(torch.autocast(device_type, dtype=dtype))
    if attention != "auto":
        stack.enter_context(sdpa_kernel([_SDPA[attention]]))
    return stack


def forward_context_of(
    cfg: TrainConfig, device: torch.device
) -> Callable[[], contextlib.AbstractContextManager]:
    """:func:`forward_context` for this run's settings, as a plain function: the parts that hold
    it must not hold the trainer."""
    return functools.partial(
        forward_context, device.type, _DTYPES.get(cfg.precision), cfg.attention
    )
