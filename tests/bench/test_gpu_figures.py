"""The figures behind gpu_check's MFU: FLOPs per token of the lm model, the peak table, MFU.

The formula is checked against an independent count: torch's FlopCounterMode counting the
matrix products the real model runs for a forward and a backward pass on CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.gpu.figures import MFU_GOAL, lm_flops_per_token, mfu, peak_bf16_tflops
from trainer.tasks.lm import VOCAB_MULTIPLE, LMTask

# (n_layer, n_head, n_embd, block_size, seq_len, batch): the default lm size, odd shapes, a
# sequence shorter than the model's context, and more heads over the same width.
SHAPES = [
    (2, 4, 64, 64, 64, 3),
    (3, 2, 32, 16, 16, 2),
    (1, 1, 48, 40, 24, 5),
    (2, 8, 64, 32, 32, 1),
]


def _counted(task: LMTask, seq_len: int, batch: int) -> tuple[int, dict[str, int]]:
    """FLOPs FlopCounterMode sees in one forward + backward of the task's real model."""
    torch.manual_seed(0)
    model = task.build_model()
    x = torch.randint(0, len(task.vocab), (batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        loss, _ = task.loss(model, (x, x))
        loss.backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return counter.get_total_flops(), by_op


@pytest.mark.parametrize(("n_layer", "n_head", "n_embd", "block", "seq_len", "batch"), SHAPES)
def test_flops_per_token_is_what_the_model_multiplies(
    n_layer, n_head, n_embd, block, seq_len, batch
):
    """With SDPA's math kernel every product is a plain (b)mm and none is recomputed: the
    counter's total over a training step equals the formula times the tokens, exactly, with
    the head as wide as the model makes it (the vocabulary padded to a multiple of 64). The
    MFU counts the real vocabulary: the padded rows' products are work, not model FLOPs."""
    task = LMTask(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block, dropout=0.0)
    with sdpa_kernel([SDPBackend.MATH]):
        total, by_op = _counted(task, seq_len, batch)
    assert "aten.bmm" in by_op  # attention was counted, not skipped
    rows = task.build_model().head.weight.shape[0]
    assert rows == VOCAB_MULTIPLE > len(task.vocab)
    assert total == lm_flops_per_token(n_layer, n_embd, seq_len, rows) * batch * seq_len
    padding = 6 * n_embd * (rows - len(task.vocab))
    real = lm_flops_per_token(n_layer, n_embd, seq_len, len(task.vocab))
    assert total == (real + padding) * batch * seq_len


def test_attention_reaches_sdpa_causal_without_a_mask(monkeypatch) -> None:
    """Flash attention needs SDPA called with is_causal and no explicit mask: the model's
    attention must pass the causal hint, not a float mask."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append({"attn_mask": attn_mask, "is_causal": is_causal, "dropout_p": dropout_p})
        return real(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    task = LMTask(n_layer=3, n_head=4, n_embd=32, block_size=16, dropout=0.0)
    model = task.build_model().train()
    x = torch.randint(0, len(task.vocab), (2, 16))
    task.loss(model, (x, x))[0].backward()
    assert len(calls) == 3  # one per layer
    assert all(c["is_causal"] is True and c["attn_mask"] is None for c in calls), calls
    assert all(c["dropout_p"] == 0.0 for c in calls)


def test_flops_formula_rejects_empty_shapes() -> None:
    with pytest.raises(ValueError, match="n_layer: must be >= 1"):
        lm_flops_per_token(0, 64, 64, 40)
    with pytest.raises(ValueError, match="vocab_size"):
        lm_flops_per_token(1, 64, 64, 0)


def test_mfu_is_achieved_model_flops_over_the_peak_of_all_gpus() -> None:
    # 1 GFLOP/token at 494,500 tokens/s is 494.5 TFLOP/s: half an H100 SXM's 989.
    assert mfu(1e9, 494_500, 989.0) == pytest.approx(0.5)
    # The same global rate from two GPUs is half the utilization of each.
    assert mfu(1e9, 494_500, 989.0, n_gpus=2) == pytest.approx(0.25)
    assert mfu(2e9, 494_500, 989.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu(1e9, 1.0, 0.0)
    with pytest.raises(ValueError, match="n_gpus"):
        mfu(1e9, 1.0, 989.0, n_gpus=0)
    assert 0 < MFU_GOAL < 1


@pytest.mark.parametrize(
    ("name", "peak", "part"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0, "H100 SXM"),
        ("NVIDIA H100 PCIe", 756.0, "H100 PCIe"),
        ("NVIDIA H100 NVL", 835.0, "H100 NVL"),
        ("NVIDIA H200", 989.0, "H200 SXM"),
        ("NVIDIA H200 NVL", 835.0, "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", 312.0, "A100"),
        ("NVIDIA A100 80GB PCIe", 312.0, "A100"),
        ("NVIDIA L40S", 362.0, "L40S"),
        ("NVIDIA L4", 121.0, "L4"),
    ],
)
def test_peak_by_device_name(name: str, peak: float, part: str) -> None:
    assert peak_bf16_tflops(name) == (peak, part)


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA A10G", "Tesla V100-SXM2-16GB", ""])
def test_a_device_not_in_the_table_has_no_peak(name: str) -> None:
    assert peak_bf16_tflops(name) is None
