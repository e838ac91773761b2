"""gpu_check's report: the throughput it reads off train events, its verdicts, its schema.

The verdicts are fed hand-made events here, each case one way a GPU run could go wrong; the
real trainer's events feed them in test_gpu_check.py's CPU dry run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.gpu import report as rep

REPO = Path(__file__).resolve().parents[2]


def _train(step: int, loss: float, step_time_s: float, tokens_per_s: float | None, **kw) -> dict:
    e = {"event": "train", "step": step, "loss": loss, "step_time_s": step_time_s, **kw}
    if tokens_per_s is not None:
        e["tokens_per_s"] = tokens_per_s
    return e


def _run(name: str, events: list[dict], **kw) -> rep.RunResult:
    start = {"event": "start", "step": 0, "world_size": 1, "device": "cuda:0", "config": {}}
    done_step = events[-1]["step"] if events else 0
    done = {"event": "done", "step": done_step, "reason": "completed"}
    return rep.RunResult(name=name, exit_code=0, events=[start, *events, done], **kw)


def test_throughput_weights_windows_by_time_and_drops_warm_up() -> None:
    # Windows of 10 steps: the first (compile, warm-up) is slow and must not count.
    r = _run(
        "bf16",
        [
            _train(10, 4.0, 2.0, 1_000.0),
            _train(20, 3.0, 0.1, 20_000.0),  # 1 s, 20,000 tokens
            _train(30, 2.5, 0.3, 10_000.0),  # 3 s, 30,000 tokens
            _train(40, 2.4, 0.1, 30_000.0),  # 1 s, 30,000 tokens
        ],
        warmup_steps=10,
    )
    tp = rep.throughput(r)
    assert tp.tokens_per_s == pytest.approx(80_000 / 5)  # total tokens over total seconds
    assert tp.step_time_s == pytest.approx(5 / 30)
    assert (tp.timed_windows, tp.not_measured) == (3, None)


def test_throughput_of_a_resumed_run_counts_from_its_start_step() -> None:
    start = {"event": "start", "step": 40, "world_size": 1, "device": "cuda:0", "config": {}}
    windows = [_train(45, 2.0, 1.0, 100.0)] + [_train(s, 2.0, 0.5, 300.0) for s in (50, 55, 60)]
    done = {"event": "done", "step": 60, "reason": "completed"}
    r = rep.RunResult(name="resume", exit_code=0, events=[start, *windows, done], warmup_steps=5)
    # The first window (41-45) is warm-up; only 46-60 counts.
    assert rep.throughput(r).tokens_per_s == pytest.approx(300.0)


# A compile-laden warm-up window, then fast ones: what a run cut off by the budget leaves.
COMPILED = [_train(10, 4.0, 6.0, 4_000.0), _train(20, 3.0, 0.4, 60_000.0)]


@pytest.mark.parametrize(
    ("run", "why"),
    [
        # Stopped by the time budget after one timed window: no done event, no exit code.
        (
            rep.RunResult(
                "baseline_fill",
                exit_code=None,
                events=[_run("x", COMPILED).events[0], *COMPILED],
                stderr_tail="stopped after 95s (the time budget)",
                warmup_steps=10,
            ),
            "did not complete (stopped after 95s (the time budget))",
        ),
        # Stopped during the warm-up window: only the compile-laden window exists.
        (
            rep.RunResult(
                "baseline_fill",
                exit_code=None,
                events=[_run("x", COMPILED).events[0], COMPILED[0]],
                stderr_tail="stopped after 60s (the time budget)",
                warmup_steps=10,
            ),
            "did not complete",
        ),
        # Crashed after its windows: a speed from a failed run is not a figure either.
        (
            rep.RunResult(
                "fill",
                exit_code=1,
                events=[_run("x", COMPILED).events[0], *COMPILED, _train(30, 3.0, 0.4, 6e4)],
                stderr_tail="CUDA error: out of memory",
                warmup_steps=10,
            ),
            "did not complete (exit 1, reason None)",
        ),
        # Completed, but with too few windows after warm-up to be a measurement.
        (_run("fill", COMPILED, warmup_steps=10), "1 timed window(s) after the 10 warm-up"),
        (rep.RunResult("fill", not_run="time budget spent"), "not run: time budget spent"),
    ],
)
def test_a_run_without_enough_timed_windows_has_no_speed(run: rep.RunResult, why: str) -> None:
    """No fallback to the compile-laden first window and no speed from a run that did not
    complete: either would overstate or understate a ratio many times over."""
    tp = rep.throughput(run)
    assert (tp.tokens_per_s, tp.step_time_s) == (None, None)
    assert why in tp.not_measured
    summary = rep.summarize(run, peak_tflops=989.0)
    assert summary.tokens_per_s is None and summary.mfu is None
    assert why in summary.not_measured


def test_a_truncated_run_gives_no_ratio() -> None:
    """The trainer measured in full against a baseline the budget cut off after its first timed
    window: no ratio (it would read 60,000 / 4,000 = 15x off the warm-up window alone), and the
    report says which run lacks a speed and why."""
    windows = [_train(s, 3.0, 0.4, 62_000.0) for s in (20, 30, 40)]
    fill = _run("fill", [COMPILED[0], *windows], warmup_steps=10)
    cut = rep.RunResult(
        "baseline_fill",
        exit_code=None,
        events=[_run("x", []).events[0], *COMPILED],
        stderr_tail="stopped after 95s (the time budget)",
        warmup_steps=10,
    )
    runs = {r.name: rep.summarize(r, 989.0) for r in (fill, cut)}
    assert runs["fill"].tokens_per_s == pytest.approx(62_000.0)
    b = rep.baseline_summary(runs, "H100, torch 2.11.0, CUDA 13.0")
    (comparison,) = b.comparisons
    assert comparison.ratio is None and comparison.baseline_tokens_per_s is None
    assert comparison.not_measured.startswith("baseline_fill: the run did not complete")
    assert not b.goal_met and b.measured_on == "H100, torch 2.11.0, CUDA 13.0"
    assert b.split.model is None and "baseline_fill: the run did not complete" in (
        b.split.not_measured
    )


def _measured(name: str, tokens_per_s: float, spread: float = 0.0, **kw) -> rep.RunResult:
    """A completed run with 3 timed windows around ``tokens_per_s``, ``spread`` apart."""
    windows = [_train(10, 4.0, 6.0, 1.0)]
    rates = [tokens_per_s * (1 - spread / 2), tokens_per_s, tokens_per_s * (1 + spread / 2)]
    windows += [_train(s, 3.0, 0.4, r) for s, r in zip((20, 30, 40), rates, strict=True)]
    return _run(name, windows, warmup_steps=10, **kw)


def test_summarize_computes_mfu_from_the_runs_own_numbers() -> None:
    r = _measured("fill", 494_500.0)
    r.flops_per_token = 1_000_000_000
    run = rep.summarize(r, peak_tflops=989.0)
    assert run.tokens_per_s == pytest.approx(494_500.0)
    assert run.achieved_tflops == pytest.approx(494.5)
    assert run.mfu == pytest.approx(0.5)
    assert (run.timed_windows, run.not_measured) == (3, None)
    assert rep.summarize(r, peak_tflops=None).mfu is None


def test_edges_are_measured_against_their_base_run_and_the_baseline() -> None:
    results = {
        "compile": _measured("compile", 500_000.0, spread=0.01),
        "baseline": _measured("baseline", 480_000.0),
        "compile_clip": _measured("compile_clip", 510_000.0),
        "compile_graphs": _measured("compile_graphs", 503_000.0),
        "compile_cudnn": rep.RunResult(
            "compile_cudnn", exit_code=1, stderr_tail="RuntimeError: No available kernel"
        ),
    }
    runs = {n: rep.summarize(r, 989.0) for n, r in results.items()}
    specs = [
        rep.EdgeSpec("compile_clip", "compile", "baseline", "fused_clip=true"),
        rep.EdgeSpec("compile_cudnn", "compile", "baseline", "attention=cudnn"),
        rep.EdgeSpec("fill_clip", "fill", "baseline_fill", "fused_clip=true"),
        rep.EdgeSpec("compile_graphs", "compile", "baseline", "compile_mode=reduce-overhead"),
    ]
    clip, cudnn, fill, graphs = rep.edge_summary(runs, specs)
    assert clip.gain == pytest.approx(1.02) and clip.ratio == pytest.approx(510 / 480)
    assert clip.not_measured is None and clip.setting == "fused_clip=true"
    # compile's windows are 1% apart: a 2% gain is beyond that, a 0.6% one is noise.
    assert clip.spread == pytest.approx(0.01 / 0.995) and clip.faster is True
    assert graphs.gain == pytest.approx(1.006) and graphs.faster is False
    assert cudnn.gain is None and cudnn.ratio is None and cudnn.faster is None
    assert cudnn.not_measured == "compile_cudnn: the run did not complete (exit 1, reason None)"
    assert (fill.gain, fill.ratio) == (None, None)
    assert fill.not_measured == (
        "fill_clip: not selected; fill: not selected; baseline_fill: not selected"
    )


def _fp16(scales: dict[int, float], optimizer_steps: int, grad_norm_at_3=None) -> rep.RunResult:
    events = [
        _train(s, 3.0, 0.1, 1.0, loss_scale=v, grad_norm=grad_norm_at_3 if s == 3 else 1.0)
        for s, v in sorted(scales.items())
    ]
    return _run("fp16", events, checkpoint={"optimizer_steps": optimizer_steps})


HALVED = {1: 65536.0, 2: 65536.0, 3: 32768.0, 4: 32768.0, 5: 32768.0}


def test_fp16_overflow_passes_when_the_scale_halves_and_the_update_is_skipped() -> None:
    c = rep.check_fp16_overflow({"fp16": _fp16(HALVED, optimizer_steps=4)}, overflow_at_step=3)
    assert c.status == "pass", c.why
    assert c.evidence["scale_drops_at_steps"] == [3]


@pytest.mark.parametrize(
    ("scales", "optimizer_steps", "why"),
    [
        ({s: 65536.0 for s in range(1, 6)}, 5, "did not halve"),  # no overflow happened
        (HALVED, 5, "expected 4"),  # the scale fell but AdamW still stepped
        ({1: 65536.0, 2: 65536.0, 4: 32768.0, 5: 32768.0}, 4, "no loss_scale"),  # step 3 unseen
    ],
)
def test_fp16_overflow_fails(scales, optimizer_steps, why) -> None:
    c = rep.check_fp16_overflow({"fp16": _fp16(scales, optimizer_steps)}, overflow_at_step=3)
    assert c.status == "fail" and why in c.why


def test_fp16_overflow_counts_a_natural_overflow_too() -> None:
    """An early overflow of its own (step 1) is one more skipped update, not a failure."""
    scales = {1: 32768.0, 2: 32768.0, 3: 16384.0, 4: 16384.0, 5: 16384.0}
    c = rep.check_fp16_overflow({"fp16": _fp16(scales, optimizer_steps=3)}, overflow_at_step=3)
    assert c.status == "pass", c.why
    assert c.evidence["scale_drops_at_steps"] == [1, 3]


def _resume_pair(resumed_loss: float, resumed_step: int = 20) -> dict[str, rep.RunResult]:
    bf16 = _run(
        "bf16",
        [_train(10, 4.0, 0.1, 1.0), _train(20, 2.0, 0.1, 1.0)],
    )
    bf16.events.insert(-1, {"event": "checkpoint", "step": 20, "path": "/c/step_00000020.pt"})
    resume = _run("resume", [_train(25, resumed_loss, 0.1, 1.0), _train(30, 1.9, 0.1, 1.0)])
    resume.events[0]["step"] = 20
    resume.events.insert(1, {"event": "resume", "step": resumed_step, "path": "/c/x.pt"})
    return {"bf16": bf16, "resume": resume}


def test_resume_passes_when_training_goes_on_from_the_checkpoint() -> None:
    c = rep.check_resume(_resume_pair(resumed_loss=2.05), extra_steps=10)
    assert c.status == "pass", c.why


@pytest.mark.parametrize(
    ("resumed_loss", "resumed_step", "why"),
    [
        (3.9, 20, "nearer bf16's first loss"),  # weights not loaded: back at the start
        (2.05, 10, "did not resume from step 20"),
    ],
)
def test_resume_fails(resumed_loss, resumed_step, why) -> None:
    c = rep.check_resume(_resume_pair(resumed_loss, resumed_step), extra_steps=10)
    assert c.status == "fail" and why in c.why


def test_a_scenario_that_did_not_run_is_a_skip_and_one_that_crashed_a_fail() -> None:
    runs = {"bf16": rep.RunResult("bf16", not_run="time budget spent (--budget-s 540)")}
    c = rep.check_trained(runs, "bf16", "bf16")
    assert c.status == "skip" and "time budget" in c.why
    crashed = rep.RunResult("bf16", exit_code=1, stderr_tail="CUDA error: out of memory")
    c = rep.check_trained({"bf16": crashed}, "bf16", "bf16")
    assert c.status == "fail" and "out of memory" in c.evidence["stderr_tail"]


def test_nvml_fails_on_a_train_event_without_the_readings() -> None:
    gpu = {f: 1.0 for f in rep.NVML_FIELDS}
    ok = _run("bf16", [_train(10, 3.0, 0.1, 1.0, gpus=[gpu])])
    assert rep.check_nvml({"bf16": ok}, dry_run=False).status == "pass"
    partial = dict(gpu)
    del partial["power_w"]
    bad = _run("tf32", [_train(10, 3.0, 0.1, 1.0, gpus=[partial])])
    c = rep.check_nvml({"bf16": ok, "tf32": bad}, dry_run=False)
    assert c.status == "fail" and "tf32@10" in c.why


def test_tf32_must_be_faster_than_plain_fp32() -> None:
    def pair(tf32_tokens_per_s: float) -> dict[str, rep.RunResult]:
        return {"fp32": _measured("fp32", 1_000.0), "tf32": _measured("tf32", tf32_tokens_per_s)}

    assert rep.check_tf32(pair(3_000.0), dry_run=False).status == "pass"
    assert rep.check_tf32(pair(1_050.0), dry_run=False).status == "fail"  # the switch did nothing
    assert rep.check_tf32(pair(1_050.0), dry_run=True).status == "skip"
    cut = pair(3_000.0) | {"tf32": _run("tf32", COMPILED, warmup_steps=10)}
    c = rep.check_tf32(cut, dry_run=False)
    assert c.status == "fail" and "tf32: 1 timed window(s)" in c.why


def test_a_check_that_raises_fails_instead_of_losing_the_report() -> None:
    broken = _run("fp16", [])
    broken.events.insert(1, {"event": "train"})  # a train event without its step
    checks = rep.evaluate(
        {"fp16": broken},
        probe=None,
        device_count=1,
        dry_run=False,
        overflow_at_step=3,
        resume_extra_steps=10,
    )
    assert checks.fp16_overflow.status == "fail"
    assert "the check itself failed" in checks.fp16_overflow.why


def _fields(model: type) -> set[str]:
    """Every field name of a pydantic model and of the models it holds."""
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for sub in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                names |= _fields(sub)
    return names


def test_docs_describe_every_field_of_the_report() -> None:
    """docs/gpu.md's field reference names each field in backticks; a new field must be added
    there too."""
    documented = set(re.findall(r"`([a-z_0-9]+)`", (REPO / "docs" / "gpu.md").read_text()))
    fields = (
        _fields(rep.Report) | _fields(rep.Run) | _fields(rep.Edge) | set(rep.Checks.model_fields)
    )
    assert fields - documented == set()


def _tps(tokens_per_s: float | None, mfu: float | None = None) -> rep.Run:
    """A summarised run with only its speed figures set."""
    fields = {name: None for name in rep.Run.model_fields}
    return rep.Run(
        **fields
        | {"command": "x", "wall_s": 1.0, "window_losses": [], "tokens_per_s": tokens_per_s}
        | {"mfu": mfu, "timed_windows": 3, "window_tokens_per_s": [tokens_per_s] * 3}
    )


def test_baseline_ratios_and_split_are_read_off_the_runs() -> None:
    runs = {
        "compile": _tps(560_000.0, 0.35),
        "baseline": _tps(500_000.0, 0.31),
        "fill": _tps(72_000.0, 0.58),
        "baseline_fill": _tps(68_000.0, 0.55),
        "ours_in_bare": _tps(68_000.0, 0.55),
        "nano_in_trainer": _tps(72_000.0, 0.58),
    }
    b = rep.baseline_summary(runs, "GPU")
    by_run = {c.trainer_run: c for c in b.comparisons}
    assert by_run["compile"].ratio == pytest.approx(1.12)
    assert by_run["fill"].ratio == pytest.approx(72 / 68)
    assert (by_run["fill"].trainer_mfu, by_run["fill"].baseline_mfu) == (0.58, 0.55)
    assert b.split.model == pytest.approx(1.0)  # the same model speed in nanoGPT's loop
    assert b.split.loop == pytest.approx(72 / 68)  # our loop is where the gain is
    assert b.split.model_in_our_loop == pytest.approx(1.0)
    assert b.split.loop_with_nanogpt_model == pytest.approx(72 / 68)
    assert b.goal_met and (b.goal_ratio, b.goal_mfu) == (1.05, 0.57)
    # Below the ratio at one size, or below the MFU goal: not met.
    slow = runs | {"compile": _tps(510_000.0, 0.32)}
    assert not rep.baseline_summary(slow, "GPU").goal_met
    low_mfu = runs | {"fill": _tps(72_000.0, 0.50)}
    assert not rep.baseline_summary(low_mfu, "GPU").goal_met
    # A baseline that did not run leaves its ratio empty and the goal unmet.
    missing = {k: v for k, v in runs.items() if k != "baseline_fill"}
    b = rep.baseline_summary(missing, "GPU")
    assert {c.trainer_run: c.ratio for c in b.comparisons}["fill"] is None
    assert b.split.model is None and b.split.loop is not None and not b.goal_met


def test_the_mfu_goal_counts_the_trainers_runs_only() -> None:
    runs = {"fill": _tps(1.0, 0.50), "baseline_fill": _tps(1.0, 0.55), "ours_in_bare": _tps(1, 0.6)}
    m = rep.mfu_summary(runs, "f", "c")
    assert (m.best_run, m.best) == ("fill", 0.50)


def test_baseline_check_passes_when_the_bare_runs_trained_and_fails_when_one_did_not() -> None:
    falling = [_train(2, 4.0, 0.1, 1.0), _train(4, 3.0, 0.1, 1.0)]
    runs = {n: _run(n, falling) for n in ("baseline", "baseline_fill", "ours_in_bare")}
    assert rep.check_baseline(runs).status == "pass"
    runs["nano_in_trainer"] = _run("nano_in_trainer", [_train(2, 3.0, 0.1, 1.0)] * 2)
    c = rep.check_baseline(runs)
    assert c.status == "fail" and "nano_in_trainer" in c.why
    assert rep.check_baseline({"fill": _run("fill", falling)}).status == "skip"
