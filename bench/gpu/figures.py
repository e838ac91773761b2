"""The figures in gpu_check's report: FLOPs per token of the lm task's model, peak FLOP/s, MFU.

Pure arithmetic (no torch, no GPU), so tests/bench checks it on any machine.

MFU (model FLOPs utilization, PaLM appendix B) = model FLOPs per token x tokens/s, divided by
the GPUs' peak dense bf16 FLOP/s. "Model FLOPs" are the matrix products the model needs for a
forward and a backward pass, with nothing recomputed and attention counted in full over the
sequence (as PaLM, nanoGPT and torchtitan count it): a causal kernel skips about half of the
score products, so the attention term is an upper bound on the work a flash kernel does.
"""

from __future__ import annotations

import re

# Goal for the lm task at a size that fills the GPU (`large`): nanoGPT reports about 29% on an
# A100, torchtitan 33-39% for Llama 3 8B on H100s, and nanoGPT's own loop reached 54.7% on an
# H100 at `large` (docs/gpu.md): the trainer is to beat that.
MFU_GOAL = 0.57
# The trainer at least this many times nanoGPT's tokens/s (its model and loop, at the same
# size, precision, compile and batch, in the same run) at every size compared.
BASELINE_GOAL_RATIO = 1.05

# Dense bf16 tensor-core peak per GPU in TFLOP/s, from NVIDIA's datasheets (which print the
# 2:4-sparse figure; dense is half). Matched against torch.cuda.get_device_name() in this
# order, first match wins: the NVL and PCIe parts come before the SXM part, whose name is only
# "NVIDIA H100 80GB HBM3" or "NVIDIA H200". A name that matches nothing gets no MFU unless
# --peak-tflops is given.
PEAK_BF16_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"\bH200 NVL\b", "H200 NVL", 835.0),
    (r"\bH200\b", "H200 SXM", 989.0),
    (r"\bH100 NVL\b", "H100 NVL", 835.0),
    (r"\bH100 PCIe\b", "H100 PCIe", 756.0),
    (r"\bH100\b", "H100 SXM", 989.0),
    (r"\bA100\b", "A100", 312.0),
    (r"\bL40S\b", "L40S", 362.0),
    (r"\bL4\b", "L4", 121.0),
)


def peak_bf16_tflops(device_name: str) -> tuple[float, str] | None:
    """(dense bf16 TFLOP/s, the part it is for) for a device name; None if not in the table."""
    for pattern, part, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return tflops, part
    return None


def lm_flops_per_token(n_layer: int, n_embd: int, seq_len: int, vocab_size: int) -> int:
    """Model FLOPs per trained token (forward + backward) of the lm task's ``TinyGPT`` (and of
    nanoGPT's GPT, the same matrices: the baseline is counted with the same formula).

    Per layer and token, the forward pass multiplies by the fused q/k/v projection (d x 3d), the
    output projection (d x d) and the two MLP matrices (d x 4d, 4d x d): 12 d^2 weights, 2 FLOPs
    each; attention adds q.k^T and p.v over ``seq_len`` positions, 2 x 2 x seq_len x d. The head
    (tied to the token embedding) is d x vocab. Backward costs twice the forward (a gradient for
    the input and one for the weight of every product), so::

        6 * (12 * n_layer * d^2 + d * vocab) + 12 * n_layer * seq_len * d

    which is PaLM's 6N + 12 L T d with N the matrix weights. Embedding lookups, norms, biases,
    activations and the optimizer are not matrix products and are left out.
    """
    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("seq_len", seq_len)):
        if value < 1:
            raise ValueError(f"{name}: must be >= 1 (got {value})")
    if vocab_size < 1:
        raise ValueError(f"vocab_size: must be >= 1 (got {vocab_size})")
    matmul_weights = 12 * n_layer * n_embd**2 + n_embd * vocab_size
    return 6 * matmul_weights + 12 * n_layer * seq_len * n_embd


def mfu(flops_per_token: float, tokens_per_s: float, peak_tflops: float, n_gpus: int = 1) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the peak of ``n_gpus`` GPUs.

    ``tokens_per_s`` is the job's global rate (the trainer's ``tokens_per_s``), so the peak is
    multiplied by the number of GPUs that produced it.
    """
    if peak_tflops <= 0:
        raise ValueError(f"peak_tflops: must be > 0 (got {peak_tflops})")
    if n_gpus < 1:
        raise ValueError(f"n_gpus: must be >= 1 (got {n_gpus})")
    return flops_per_token * tokens_per_s / (n_gpus * peak_tflops * 1e12)
