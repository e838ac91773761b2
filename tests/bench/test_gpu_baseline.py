"""The GPU check's baseline on CPU: nanoGPT's model (bench/gpu/nanogpt.py) and its loop
(bench/gpu/baseline.py), at tiny shapes and without compile, so each test takes seconds.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.overrides import TorchFunctionMode

from bench.gpu import baseline
from bench.gpu.nanogpt import NanoGPTTask
from trainer.config import build_config
from trainer.tasks.lm import LMTask

REPO = Path(__file__).resolve().parents[2]
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0}


def _ours_from_nanogpt(name: str) -> str:
    """The lm model's name for a parameter of nanoGPT's GPT."""
    for theirs, ours in (
        ("transformer.wte.", "tok."),
        ("transformer.wpe.", "pos."),
        ("transformer.ln_f.", "norm."),
        ("transformer.h.", "blocks."),
        ("lm_head.", "head."),
        ("attn.c_attn.", "attn.qkv."),
        ("attn.c_proj.", "attn.proj."),
        ("mlp.c_fc.", "mlp.0."),
        ("mlp.c_proj.", "mlp.2."),
    ):
        name = name.replace(theirs, ours)
    return name


def test_the_lm_model_is_nanogpts_model_under_other_names() -> None:
    """The lm task's model computes what nanoGPT's does with the same weights (the same
    layers, order, init, padded vocabulary and loss): on a GPU, a gap between the two in the
    same loop is then down to how each is written, not to what it computes."""
    torch.manual_seed(0)
    theirs = NanoGPTTask(**TINY).build_model()
    torch.manual_seed(0)
    ours = LMTask(**TINY).build_model()
    mapped = {_ours_from_nanogpt(k): v for k, v in theirs.state_dict().items()}
    assert mapped.keys() == ours.state_dict().keys()
    # The same seed gives the same initial weights: the two build their layers in one order.
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(v, mapped[k], rtol=0, atol=0, msg=k)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randint(0, 30, (3, TINY["block_size"]))
    y = x.roll(-1, 1)
    logits_t, loss_t = theirs(x, y)
    logits_o, loss_o = ours(x, y)
    torch.testing.assert_close(logits_o, logits_t)
    torch.testing.assert_close(loss_o, loss_t)


class _Reads(TorchFunctionMode):
    """Counts host reads of floating-point tensors outside the optimizer's step. Left out: the
    batch's random offsets (integers drawn on the host, as in nanoGPT's get_batch) and the
    step counters non-fused AdamW keeps on the host (CPU only: on CUDA it is fused)."""

    def __init__(self):
        super().__init__()
        self.count, self.on = 0, True
        self.hooks = [
            register_optimizer_step_pre_hook(lambda *_: setattr(self, "on", False)),
            register_optimizer_step_post_hook(lambda *_: setattr(self, "on", True)),
        ]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        reads = (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__)
        if self.on and func in reads and args[0].is_floating_point():
            self.count += 1
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)


@pytest.mark.parametrize("model", baseline.MODELS)
def test_bare_loop_trains_and_reads_the_loss_once_per_window(model: str) -> None:
    """nanoGPT's loop prints the trainer's events (what gpu_check reads), its loss falls, and
    it reads a tensor on the host once per log window, as nanoGPT's loss.item() does."""
    cfg = build_config(
        {
            "task": "lm",
            "task_args": TINY,
            "batch_size": 8,
            "max_steps": 12,
            "log_every": 4,
            "lr": 3e-3,
            "device": "cpu",
        }
    )
    out = io.StringIO()
    reads = _Reads()
    with reads:
        done = baseline.train(model, cfg, stream=out)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["start", "train", "train", "train", "done"]
    start = events[0]
    assert start["config"]["task"] == baseline.TASK_OF[model]
    assert start["config"]["batch_size"] == 8 and start["world_size"] == 1
    train = events[1:4]
    assert [e["step"] for e in train] == [4, 8, 12]
    assert all(e["tokens_per_s"] > 0 and e["step_time_s"] > 0 for e in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert done["reason"] == "completed" and done["step"] == 12
    assert reads.count == 3  # one per window


def test_bare_loop_follows_nanogpts_lr_schedule() -> None:
    lr = [baseline.get_lr(it, 1.0, 10, 100, 0.1) for it in range(101)]
    assert lr[0] == pytest.approx(1 / 11) and lr[9] == pytest.approx(10 / 11)
    assert lr[10] == pytest.approx(1.0) and lr[100] == pytest.approx(0.1)
    assert baseline.get_lr(200, 1.0, 10, 100, 0.1) == 0.1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lr=-1"], "baseline: lr: Input should be greater than 0"),
        (["task=vision"], "baseline: task: the baseline trains the lm corpus (got vision)"),
        (["task=lm", "task_args.bogus=1"], "unexpected keyword argument 'bogus'"),
    ],
)
def test_bare_loop_bad_settings_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "bench.gpu.baseline", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert message in line
