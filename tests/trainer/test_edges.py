"""The trainer's settings beyond nanoGPT (docs/gpu.md, the speed mode's edges), each checked on
CPU for its effect, not only that a run finishes: ``attention`` (SDPA's kernel), ``fused_clip``
(clipping inside fused AdamW's step) and ``compile_mode`` (torch.compile's mode).
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
import torch._inductor
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from trainer import distributed
from trainer.config import build_config
from trainer.parts.optimizer import clip_in_step
from trainer.tasks import load_task
from trainer.telemetry.events import Reporter
from trainer.train import Trainer

LM_TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.0}
# The aten ops by which each SDPA path shows itself on CPU.
FLASH_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"
MATH_OP = "aten._safe_softmax.default"  # the math path's softmax; flash does not call it


def _trainer(
    env: distributed.DistEnv, tmp_path: Path, stream: io.StringIO | None = None, **settings
) -> Trainer:
    cfg = build_config(
        {
            "task": "lm",
            "task_args": LM_TINY,
            "batch_size": 4,
            "device": "cpu",
            "progress": "never",
            "resume": "never",
            "eval_batches": 1,
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 0},
            **settings,
        }
    )
    reporter = Reporter(env.is_main, cfg.max_steps, "never", None, stream=stream or io.StringIO())
    return Trainer(cfg, env, load_task(cfg.task, cfg.task_args), reporter)


class _Ops(TorchDispatchMode):
    """The aten ops that ran, by name."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def _sdpa_flags() -> tuple[bool, ...]:
    b = torch.backends.cuda
    return (
        b.flash_sdp_enabled(),
        b.mem_efficient_sdp_enabled(),
        b.math_sdp_enabled(),
        b.cudnn_sdp_enabled(),
    )


@pytest.mark.parametrize(
    ("attention", "runs", "not_runs"), [("auto", FLASH_OP, MATH_OP), ("math", MATH_OP, FLASH_OP)]
)
def test_attention_picks_the_kernel_of_every_forward(
    one_rank_group, tmp_path: Path, attention: str, runs: str, not_runs: str
) -> None:
    """attention=math takes the math path where torch picks its flash kernel on its own, in
    the training steps and the final eval alike, and the choice does not outlive the run."""
    before = _sdpa_flags()
    trainer = _trainer(one_rank_group, tmp_path, attention=attention, max_steps=2, log_every=1)
    with _Ops() as seen:
        trainer.fit()
    assert runs in seen.ops and not_runs not in seen.ops
    assert _sdpa_flags() == before


def test_attention_cudnn_is_refused_where_there_is_no_cudnn(one_rank_group, tmp_path) -> None:
    """On CPU cuDNN's kernel does not exist: with it alone allowed, the first step fails with
    torch's reason (the restriction is in force, not a preference torch may ignore)."""
    trainer = _trainer(one_rank_group, tmp_path, attention="cudnn", max_steps=1)
    with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
        trainer.fit()


def test_clip_in_step_gives_clip_then_steps_update() -> None:
    """Folded into fused AdamW's step, clipping gives the update clip_grad_norm_ then step gives
    (to float rounding, over several clipped steps), and the same norm; unclipped, the weights
    go elsewhere, so the comparison can tell."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    models = {k: copy.deepcopy(model) for k in ("separate", "folded", "unclipped")}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True) for k, m in models.items()}
    for _ in range(5):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        norms = {}
        for key, m in models.items():
            ((m(x) - y) ** 2).mean().backward()
            params = list(m.parameters())
            if key == "separate":
                norms[key] = nn.utils.clip_grad_norm_(params, 0.05)
            elif key == "folded":
                norms[key] = clip_in_step(opts[key], params, 0.05)
            opts[key].step()
            if key == "folded":
                del opts[key].grad_scale
            opts[key].zero_grad()
        assert norms["separate"] > 0.05  # clipping is in force at every step
        torch.testing.assert_close(norms["folded"], norms["separate"], rtol=0, atol=0)
    for a, b, c in zip(*(m.parameters() for m in models.values()), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
        assert (c - a).abs().max() > 1e-3


def test_fused_clip_takes_the_folded_path_and_trains_as_clipping_does(
    one_rank_group, tmp_path: Path
) -> None:
    """fused_clip=true hands fused AdamW the clip factor (its grad_scale) at every step and
    ends where fused_clip=false ends; the reported gradient norm is the same."""
    scales = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, *_: scales.append(getattr(opt, "grad_scale", None))
    )
    finals, norms = {}, {}
    try:
        for folded in (False, True):
            scales.clear()
            out = io.StringIO()
            trainer = _trainer(
                one_rank_group,
                tmp_path / str(folded),
                out,
                fused_clip=folded,
                grad_clip=0.05,
                max_steps=4,
                log_every=2,
                lr=1e-2,
            )
            trainer.fit()
            finals[folded] = [p.detach().clone() for p in trainer.raw_model.parameters()]
            norms[folded] = [e for e in out.getvalue().splitlines() if '"event": "train"' in e]
            if folded:
                assert len(scales) == 4 and all(s is not None and s.item() > 1 for s in scales)
            else:
                assert scales == [None] * 4
    finally:
        hook.remove()
    for a, b in zip(finals[False], finals[True], strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    grad_norms = {
        k: [float(line.split('"grad_norm": ')[1].split(",")[0]) for line in v]
        for k, v in norms.items()
    }
    assert grad_norms[True] == pytest.approx(grad_norms[False], rel=1e-6)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_compile_mode_reaches_inductor(one_rank_group, tmp_path: Path, mode: str) -> None:
    """The compiled model carries the Inductor options of the mode asked for (read before any
    compilation: compiling on CPU with autotuning takes minutes); the default mode has none."""
    trainer = _trainer(one_rank_group, tmp_path, compile=True, compile_mode=mode)
    options = torch._inductor.list_mode_options(mode)
    assert options  # each of these modes changes something
    config = trainer.fwd_model.get_compiler_config()
    assert {k: config[k] for k in options} == options
    default = _trainer(one_rank_group, tmp_path, compile=True).fwd_model.get_compiler_config()
    assert {k: default[k] for k in options} != options
