"""gpu_check's report: its schema (pydantic), and the verdicts read off the trainer's runs.

Pure: what the runs printed (their JSON-lines events), what their checkpoints and NCCL logs
held, in; a ``Report`` out. No torch, no subprocesses, so tests/bench can check every verdict
on hand-made inputs as well as on a real CPU dry run.

A check is ``pass``, ``fail`` or ``skip``, with one line of ``why`` and the readings it rests on
in ``evidence``. The report is ``ok`` when no check failed; ``python bench/gpu/check.py`` then
exits 0, otherwise 1.

Speed is reported, not judged, and only where it was measured: a run's tokens/s comes from a run
that completed, over at least ``MIN_TIMED_WINDOWS`` log windows after its warm-up window (which
holds the compilation). Anything less (a run cut off by the time budget, a crash, too few
windows) leaves its tokens/s, and every ratio that needs it, null, with ``not_measured`` saying
why: a ratio is never read off a compile-laden or truncated window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bench.gpu.figures import BASELINE_GOAL_RATIO, MFU_GOAL, mfu

REPORT_NAME = "ddpjob gpu_check"
# The six readings metrics.GpuMonitor puts in every `train` event's `gpus` list (README).
NVML_FIELDS = ("index", "util_pct", "mem_used_gib", "mem_total_gib", "temp_c", "power_w")
# TF32 must buy at least this much over plain fp32 matmuls, or the switch did not take.
# An H100's TF32 tensor cores are rated ~7x its fp32 cores; a model this matmul-bound gains >2x.
TF32_MIN_SPEEDUP = 1.3
# bf16, fp16, TF32 and compiled runs see the same data from the same weights as the fp32 run:
# after the same steps their loss must agree with it to this relative tolerance.
LOSS_AGREEMENT_RTOL = 0.10
# The trainer runs each compared with nanoGPT's model and loop at the same settings:
# (trainer run, baseline run).
COMPARISONS = (("compile", "baseline"), ("fill", "baseline_fill"))
# A run's speed is measured over at least this many log windows after its warm-up window.
MIN_TIMED_WINDOWS = 3
# The runs of nanoGPT's loop (bench/gpu/baseline.py), not of the trainer: no MFU goal for them.
BARE_RUNS = ("baseline", "baseline_fill", "ours_in_bare")
# The four runs at the fill size that split the gap: each swaps the model or the loop alone.
SPLIT_RUNS = ("baseline_fill", "ours_in_bare", "nano_in_trainer", "fill")
BASELINE_WHAT = (
    "nanoGPT's model (bench/gpu/nanogpt.py) and training loop (bench/gpu/baseline.py), written "
    "in the bench after karpathy/nanoGPT, run with the settings of the trainer run it is "
    "compared with, in the same gpu_check run; tokens/s after warm-up, MFU with the same formula"
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Check(_Model):
    """One verdict."""

    status: Literal["pass", "fail", "skip"] = Field(description="pass, fail, or skip (not run).")
    why: str = Field(description="One line: what held, what did not, or why it did not run.")
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="The readings the verdict rests on."
    )


class Checks(_Model):
    """Every part of the GPU path the command exercises, one verdict each."""

    nccl: Check = Field(description="The process group initialised with NCCL (NCCL's own log).")
    fp32: Check = Field(description="fp32 with TF32 off trained: finite loss that fell.")
    bf16: Check = Field(description="bf16 autocast trained: finite loss that fell.")
    fp16_overflow: Check = Field(
        description=(
            "fp16 with GradScaler: a forced overflow at one step halved the loss scale and "
            "skipped that optimizer update (AdamW's step count in the checkpoint)."
        )
    )
    fused_adamw: Check = Field(description="The checkpointed AdamW param groups say fused=True.")
    tf32: Check = Field(description="tf32=true beat tf32=false by the minimum speedup.")
    compile: Check = Field(
        description="compile=true trained, and Inductor compiled graphs (its cache dir)."
    )
    precision_agreement: Check = Field(
        description="tf32, bf16, fp16 and compiled losses agree with fp32's after the same steps."
    )
    nvml: Check = Field(description="Every train event carried the NVML gpus readings.")
    checkpoint_resume: Check = Field(
        description="A checkpoint written on the GPU was resumed there and training went on."
    )
    flash_attention: Check = Field(
        description="The lm model's attention runs with SDPA restricted to the flash kernel."
    )
    sync_batchnorm: Check = Field(
        description="SyncBatchNorm across 2 GPUs (vision task); skipped with fewer GPUs."
    )
    baseline: Check = Field(
        description=(
            "nanoGPT's loop and model (the baseline runs and the split's) trained: every run "
            "that ran completed with a finite loss that fell. Speed is not a verdict: see "
            "`baseline` at the top level."
        )
    )


class Run(_Model):
    """One ``python -m trainer`` run (under torchrun), summarised from its events."""

    command: str = Field(description="The exact command line, to re-run by hand.")
    exit_code: int | None = Field(description="Its exit code; null if it was stopped or not run.")
    wall_s: float = Field(description="Wall time, start-up and checkpoint included.")
    world_size: int | None = Field(description="From its `start` event.")
    device: str | None = Field(description="From its `start` event, e.g. cuda:0.")
    steps: int | None = Field(description="Step it ended at (`done` event).")
    reason: str | None = Field(description="Why it ended (`done` event): completed, ...")
    not_run: str | None = Field(description="Why it was not started (budget, a failed input).")
    window_losses: list[float | None] = Field(description="Mean loss of each `train` window.")
    tokens_per_s: float | None = Field(
        description=(
            "Global tokens/s over the windows after warm-up (lm runs); null when not measured."
        )
    )
    step_time_s: float | None = Field(description="Mean step time over the same windows.")
    timed_windows: int = Field(description="Log windows after warm-up that were timed.")
    window_tokens_per_s: list[float] = Field(
        description="Each timed window's tokens/s, in order: their spread is the noise."
    )
    not_measured: str | None = Field(
        description=(
            "Why tokens_per_s is null: the run did not complete, or it has fewer than "
            "MIN_TIMED_WINDOWS windows after warm-up. Null when measured."
        )
    )
    flops_per_token: int | None = Field(description="Model FLOPs per token (lm runs).")
    achieved_tflops: float | None = Field(description="flops_per_token x tokens_per_s / 1e12.")
    mfu: float | None = Field(description="achieved over world_size x the peak dense bf16 rate.")
    gpu_mem_used_gib: float | None = Field(description="Most GPU memory NVML saw in use.")
    gpu_util_pct: float | None = Field(description="Mean NVML utilization over its windows.")
    error: str | None = Field(description="Why it failed: the end of its stderr.")


class Machine(_Model):
    """Where it ran."""

    device: str = Field(description="cuda, or cpu for a --cpu-dry-run.")
    device_name: str = Field(description="torch.cuda.get_device_name(0), or the CPU.")
    device_count: int = Field(description="GPUs visible to torch.")
    capability: str | None = Field(description="CUDA compute capability, e.g. 9.0.")
    memory_gib: float | None = Field(description="GPU 0's memory.")
    driver: str | None = Field(description="NVIDIA driver (NVML).")
    torch: str = Field(description="torch.__version__.")
    cuda: str | None = Field(description="The CUDA torch was built with.")
    nccl: str | None = Field(description="The NCCL torch was built with.")
    sdpa_priority: list[str] = Field(
        description=(
            "The order in which torch tries SDPA's kernels by default (the first one that "
            "takes the inputs runs)."
        )
    )
    python: str = Field(description="Python version.")
    packages: dict[str, str | None] = Field(
        description="Versions of the packages the trainer imports (null = missing)."
    )


class Peak(_Model):
    """The FLOP/s that MFU divides by."""

    bf16_dense_tflops: float | None = Field(description="Peak dense bf16 TFLOP/s per GPU.")
    source: str = Field(description="Where the peak came from (the datasheet table's part).")
    measured_bf16_matmul_tflops: float | None = Field(
        description="An 8192^3 bf16 matmul timed on this GPU: the ceiling actually reachable."
    )


class Mfu(_Model):
    """The lm task's model FLOPs utilization."""

    flops_per_token: str = Field(description="The formula for model FLOPs per token.")
    convention: str = Field(description="What the formula counts and what it leaves out.")
    goal: float = Field(description="The MFU to reach at a size that fills the GPU.")
    best: float | None = Field(description="Highest MFU among the runs.")
    best_run: str | None = Field(description="The run that reached it.")
    goal_met: bool = Field(description="best >= goal.")


class Comparison(_Model):
    """The trainer against nanoGPT's model and loop, at one size, in the same run."""

    trainer_run: str = Field(description="The trainer run (bf16 + compile).")
    baseline_run: str = Field(description="nanoGPT's model and loop with its settings.")
    trainer_tokens_per_s: float | None = Field(description="The trainer run's tokens/s.")
    baseline_tokens_per_s: float | None = Field(description="The baseline run's tokens/s.")
    ratio: float | None = Field(description="trainer_tokens_per_s / baseline_tokens_per_s.")
    trainer_mfu: float | None = Field(description="The trainer run's MFU.")
    baseline_mfu: float | None = Field(description="The baseline run's MFU (same formula).")
    not_measured: str | None = Field(description="Why ratio is null; null when measured.")


class Split(_Model):
    """Where the gap at the fill size lies: the model and the loop, each swapped alone."""

    tokens_per_s: dict[str, float | None] = Field(
        description="baseline_fill, ours_in_bare, nano_in_trainer and fill's tokens/s."
    )
    model: float | None = Field(
        description=(
            "ours_in_bare / baseline_fill: ddpjob's model against nanoGPT's, both in nanoGPT's "
            "loop (below 1: the model costs that much)."
        )
    )
    loop: float | None = Field(
        description="fill / ours_in_bare: ddpjob's loop against nanoGPT's, both with our model."
    )
    model_in_our_loop: float | None = Field(
        description="fill / nano_in_trainer: the two models, both in ddpjob's loop."
    )
    loop_with_nanogpt_model: float | None = Field(
        description="nano_in_trainer / baseline_fill: the two loops, both with nanoGPT's model."
    )
    not_measured: str | None = Field(
        description="Why a ratio is null (each run it lacks, and why); null when all are measured."
    )


class Edge(_Model):
    """One trainer setting beyond nanoGPT, measured against the trainer without it and against
    nanoGPT's model and loop, at one size, in the same run."""

    run: str = Field(description="The run with the setting.")
    setting: str = Field(description="The trainer setting it adds to its base run (key=value).")
    base_run: str = Field(description="The trainer run without it (compile or fill).")
    baseline_run: str = Field(description="nanoGPT's model and loop at the same size.")
    tokens_per_s: float | None = Field(description="The run's tokens/s.")
    base_tokens_per_s: float | None = Field(description="The base run's tokens/s.")
    gain: float | None = Field(description="tokens_per_s / base_tokens_per_s: above 1 it helps.")
    spread: float | None = Field(
        description=(
            "The larger of the two runs' window-to-window spread, (max - min) / min of their "
            "timed windows' tokens/s: a gain inside it is noise."
        )
    )
    faster: bool | None = Field(description="gain > 1 + spread: keep the setting.")
    ratio: float | None = Field(description="tokens_per_s / the baseline run's tokens/s.")
    not_measured: str | None = Field(description="Why gain or ratio is null; null when measured.")


class Baseline(_Model):
    """ddpjob's trainer against nanoGPT, with the targets it is held to."""

    what: str = Field(description="What the baseline is and how it is measured.")
    measured_on: str = Field(
        description="The GPU, torch and CUDA every speed figure of this report comes from."
    )
    goal_ratio: float = Field(description="The trainer/baseline tokens/s to reach at each size.")
    goal_mfu: float = Field(description="The trainer's MFU to reach at the fill size.")
    comparisons: list[Comparison] = Field(description="One per size compared.")
    split: Split
    goal_met: bool = Field(
        description="Every comparison's ratio >= goal_ratio and the fill's MFU >= goal_mfu."
    )


class Report(_Model):
    """What ``python bench/gpu/check.py`` prints: one JSON object."""

    report: Literal["ddpjob gpu_check"] = Field(description="What this object is.")
    schema_version: Literal[2] = Field(description="Bumped when a field changes meaning.")
    mode: Literal["full", "speed"] = Field(
        description="full: every check; speed (--speed): the speed figures and the edges only."
    )
    ok: bool = Field(description="No check failed (the exit code is 0 exactly then).")
    dry_run: bool = Field(description="True for --cpu-dry-run: the GPU-only checks are skipped.")
    command: str = Field(description="The gpu_check command line.")
    started_at: str = Field(description="UTC start time, ISO 8601.")
    elapsed_s: float = Field(description="Wall time of the whole check.")
    machine: Machine
    peak: Peak
    mfu: Mfu
    baseline: Baseline
    edges: list[Edge] = Field(description="Each setting beyond nanoGPT that was asked for.")
    checks: Checks
    runs: dict[str, Run] = Field(description="Each trainer run by scenario name.")


# ---------------------------------------------------------------------------------------------
# What a run left behind


@dataclass
class RunResult:
    """A scenario's raw outcome, as gpu_check collected it."""

    name: str
    command: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr_tail: str = ""
    not_run: str | None = None  # why it did not run (--only, time budget, a missing input)
    checkpoint: dict[str, Any] | None = None  # optimizer_steps, fused, loss_scale, step
    nccl: dict[str, Any] | None = None  # version, init_complete
    inductor_graphs: int | None = None  # FX graphs Inductor compiled into its cache dir
    flops_per_token: int | None = None
    warmup_steps: int = 0

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def first(self, name: str) -> dict[str, Any] | None:
        found = self.of(name)
        return found[0] if found else None

    @property
    def completed(self) -> bool:
        done = self.first("done")
        return self.exit_code == 0 and done is not None and done.get("reason") == "completed"

    def window_losses(self) -> list[float | None]:
        return [e.get("loss") for e in self.of("train")]


@dataclass
class Throughput:
    tokens_per_s: float | None
    step_time_s: float | None
    timed_windows: int = 0
    not_measured: str | None = None
    windows: list[float] = field(default_factory=list)  # each timed window's tokens/s


def throughput(result: RunResult) -> Throughput:
    """Global tokens/s and step time over the ``train`` windows that start after warm-up.

    Each event covers the steps since the previous one; the windows are weighted by their time
    (total tokens over total seconds). Measured only for a run that completed with at least
    ``MIN_TIMED_WINDOWS`` windows after warm-up; otherwise both figures are None and
    ``not_measured`` says why. The warm-up window is never used in its place.
    """
    start = result.first("start")
    prev = start["step"] if start else 0
    first_step = prev
    timed = []
    for e in result.of("train"):
        n = e["step"] - prev
        if n > 0 and prev >= first_step + result.warmup_steps:
            timed.append((n, e.get("step_time_s"), e.get("tokens_per_s")))
        prev = e["step"]
    count = len(timed)
    if result.not_run:
        return Throughput(None, None, count, f"not run: {result.not_run}")
    if not result.completed:
        done = result.first("done") or {}
        why = f"exit {result.exit_code}, reason {done.get('reason')}"
        if result.stderr_tail.startswith("stopped"):
            why = result.stderr_tail
        return Throughput(None, None, count, f"the run did not complete ({why})")
    if count < MIN_TIMED_WINDOWS:
        return Throughput(
            None,
            None,
            count,
            f"{count} timed window(s) after the {result.warmup_steps} warm-up steps; "
            f"a speed needs {MIN_TIMED_WINDOWS}",
        )
    if any(not t for _, t, _ in timed):
        return Throughput(None, None, count, "a timed window has no step_time_s")
    seconds = sum(n * t for n, t, _ in timed)
    steps = sum(n for n, _, _ in timed)
    if any(tps is None for _, _, tps in timed):
        return Throughput(None, seconds / steps, count, "the run reports no tokens_per_s")
    tokens = sum(tps * n * t for n, t, tps in timed)
    return Throughput(tokens / seconds, seconds / steps, count, None, [tps for _, _, tps in timed])


def summarize(result: RunResult, peak_tflops: float | None) -> Run:
    """The report's view of one run."""
    start, done = result.first("start") or {}, result.first("done") or {}
    tp = throughput(result)
    world = start.get("world_size")
    achieved = mfu_value = None
    if result.flops_per_token and tp.tokens_per_s:
        achieved = result.flops_per_token * tp.tokens_per_s / 1e12
        if peak_tflops:
            mfu_value = mfu(result.flops_per_token, tp.tokens_per_s, peak_tflops, world or 1)
    readings = [g for e in result.of("train") for g in (e.get("gpus") or [])]
    mem = [g["mem_used_gib"] for g in readings if g.get("mem_used_gib") is not None]
    util = [g["util_pct"] for g in readings if g.get("util_pct") is not None]
    return Run(
        command=result.command,
        exit_code=result.exit_code,
        wall_s=round(result.wall_s, 1),
        world_size=world,
        device=start.get("device"),
        steps=done.get("step"),
        reason=done.get("reason"),
        not_run=result.not_run,
        window_losses=result.window_losses(),
        tokens_per_s=tp.tokens_per_s,
        step_time_s=tp.step_time_s,
        timed_windows=tp.timed_windows,
        window_tokens_per_s=tp.windows,
        not_measured=tp.not_measured,
        flops_per_token=result.flops_per_token,
        achieved_tflops=achieved,
        mfu=mfu_value,
        gpu_mem_used_gib=max(mem, default=None),
        gpu_util_pct=sum(util) / len(util) if util else None,
        error=None if result.completed or result.not_run else (result.stderr_tail or None),
    )


# ---------------------------------------------------------------------------------------------
# Verdicts


def _pass(why: str, **evidence: Any) -> Check:
    return Check(status="pass", why=why, evidence=evidence)


def _fail(why: str, **evidence: Any) -> Check:
    return Check(status="fail", why=why, evidence=evidence)


def _skip(why: str, **evidence: Any) -> Check:
    return Check(status="skip", why=why, evidence=evidence)


def _missing(runs: dict[str, RunResult], *names: str) -> Check | None:
    """A skip when a scenario the check needs did not run, a fail when it did not complete."""
    for name in names:
        r = runs.get(name)
        if r is None or r.not_run:
            return _skip(f"{name} did not run: {r.not_run if r else 'not selected'}")
    for name in names:
        r = runs[name]
        if not r.completed:
            done = r.first("done") or {}
            return _fail(
                f"{name} did not complete (exit {r.exit_code}, reason {done.get('reason')})",
                stderr_tail=r.stderr_tail[-600:],
            )
    return None


def _finite(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def check_trained(runs: dict[str, RunResult], name: str, label: str) -> Check:
    """The run completed, every window's loss is finite, and the last is below the first."""
    if (problem := _missing(runs, name)) is not None:
        return problem
    r = runs[name]
    losses = r.window_losses()
    cfg = (r.first("start") or {}).get("config", {})
    evidence = dict(
        run=name,
        precision=cfg.get("precision"),
        tf32=cfg.get("tf32"),
        compile=cfg.get("compile"),
        steps=(r.first("done") or {}).get("step"),
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
    )
    if not _finite(losses):
        return _fail(f"{label}: a window's loss is not finite", losses=losses, **evidence)
    if not losses[-1] < losses[0]:
        return _fail(
            f"{label}: loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})", **evidence
        )
    return _pass(f"{label}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", **evidence)


def check_fp16_overflow(runs: dict[str, RunResult], overflow_at_step: int) -> Check:
    """The forced overflow halved the scale at its step and cost exactly the skipped updates."""
    if (problem := _missing(runs, "fp16")) is not None:
        return problem
    r = runs["fp16"]
    by_step = {e["step"]: e for e in r.of("train")}
    scales = {s: e.get("loss_scale") for s, e in by_step.items()}
    k = overflow_at_step
    if k not in scales or k - 1 not in scales or None in (scales[k], scales[k - 1]):
        return _fail(f"no loss_scale reported at steps {k - 1} and {k} (log_every must be 1)")
    # A drop is a step whose scale is below the one before (GradScaler starts at 2**16).
    prev, drops = 2.0**16, []
    for s in sorted(scales):
        if scales[s] is not None and scales[s] < prev:
            drops.append(s)
        prev = scales[s] if scales[s] is not None else prev
    ckpt = r.checkpoint or {}
    steps = (r.first("done") or {}).get("step")
    evidence = dict(
        overflow_at_step=k,
        loss_scale_before=scales[k - 1],
        loss_scale_at=scales[k],
        grad_norm_at=by_step[k].get("grad_norm"),
        scale_drops_at_steps=drops,
        steps=steps,
        optimizer_updates=ckpt.get("optimizer_steps"),
        checkpoint_loss_scale=ckpt.get("loss_scale"),
        losses_finite=_finite(r.window_losses()),
    )
    if scales[k] != scales[k - 1] / 2:
        return _fail(f"loss scale did not halve at step {k}", **evidence)
    if ckpt.get("optimizer_steps") is None:
        return _fail("the fp16 run's checkpoint has no AdamW step count", **evidence)
    if ckpt["optimizer_steps"] != steps - len(drops):
        return _fail(
            f"AdamW took {ckpt['optimizer_steps']} updates in {steps} steps with "
            f"{len(drops)} overflow(s); expected {steps - len(drops)}",
            **evidence,
        )
    if not evidence["losses_finite"]:
        return _fail("a window's loss is not finite", **evidence)
    return _pass(
        f"step {k}: loss scale {scales[k - 1]:g} -> {scales[k]:g}, update skipped "
        f"({ckpt['optimizer_steps']} AdamW updates in {steps} steps)",
        **evidence,
    )


def check_fused_adamw(runs: dict[str, RunResult], dry_run: bool) -> Check:
    if dry_run:
        return _skip("CPU dry run: the trainer asks for fused AdamW on CUDA only")
    if (problem := _missing(runs, "bf16")) is not None:
        return problem
    fused = (runs["bf16"].checkpoint or {}).get("fused")
    if fused and all(f is True for f in fused):
        return _pass("every AdamW param group in bf16's checkpoint has fused=True", fused=fused)
    return _fail("AdamW is not fused in bf16's checkpoint", fused=fused)


def check_nccl(runs: dict[str, RunResult], dry_run: bool) -> Check:
    if dry_run:
        return _skip("CPU dry run: the process group is gloo")
    ran = {n: r for n, r in runs.items() if r.nccl is not None}
    if not ran:
        return _fail("no run left an NCCL log (NCCL_DEBUG=INFO)")
    versions = sorted({r.nccl.get("version") or "?" for r in ran.values()})
    bad = [n for n, r in ran.items() if not (r.nccl.get("init_complete") and r.completed)]
    evidence = dict(version=versions, runs=sorted(ran), not_initialised=bad)
    if bad:
        return _fail(f"NCCL did not initialise in, or the run failed: {', '.join(bad)}", **evidence)
    return _pass(f"NCCL {', '.join(versions)} initialised in {len(ran)} runs", **evidence)


def check_tf32(runs: dict[str, RunResult], dry_run: bool) -> Check:
    if dry_run:
        return _skip("CPU dry run: TF32 is a tensor-core mode")
    if (problem := _missing(runs, "fp32", "tf32")) is not None:
        return problem
    tp = {n: throughput(runs[n]) for n in ("fp32", "tf32")}
    off, on = tp["fp32"].tokens_per_s, tp["tf32"].tokens_per_s
    if not off or not on:
        why = "; ".join(f"{n}: {t.not_measured}" for n, t in tp.items() if t.not_measured)
        return _fail(f"no tokens_per_s from the fp32 or tf32 run ({why})")
    ratio = on / off
    evidence = dict(fp32_tokens_per_s=off, tf32_tokens_per_s=on, speedup=ratio)
    if ratio < TF32_MIN_SPEEDUP:
        return _fail(
            f"tf32=true is only {ratio:.2f}x tf32=false (< {TF32_MIN_SPEEDUP})", **evidence
        )
    return _pass(f"tf32=true is {ratio:.2f}x tf32=false", **evidence)


def check_compile(runs: dict[str, RunResult]) -> Check:
    trained = check_trained(runs, "compile", "bf16 + torch.compile")
    if trained.status != "pass":
        return trained
    r = runs["compile"]
    if trained.evidence.get("compile") is False:
        return _skip(
            "compile=false was given: the compile run trained uncompiled", **trained.evidence
        )
    evidence = dict(trained.evidence, inductor_graphs=r.inductor_graphs)
    on = throughput(r).tokens_per_s
    eager = runs.get("bf16")
    off = throughput(eager).tokens_per_s if eager is not None and eager.completed else None
    if on and off:
        evidence |= dict(tokens_per_s=on, eager_tokens_per_s=off, speedup=on / off)
    train = r.of("train")
    if train:
        evidence["first_window_step_time_s"] = train[0].get("step_time_s")  # holds the compile
    if not r.inductor_graphs:
        return _fail("compile=true ran, but Inductor wrote no compiled graph", **evidence)
    speed = f", {on / off:.2f}x eager" if on and off else ""
    return _pass(f"Inductor compiled {r.inductor_graphs} graphs{speed}", **evidence)


def check_precision_agreement(runs: dict[str, RunResult]) -> Check:
    if (problem := _missing(runs, "fp32")) is not None:
        return problem
    ref = runs["fp32"].window_losses()
    if not _finite(ref):
        return _fail("fp32's loss is not finite")
    others = [n for n in ("tf32", "bf16", "fp16", "compile") if n in runs and runs[n].completed]
    if not others:
        return _skip("none of tf32, bf16, fp16, compile completed beside fp32")
    losses = {"fp32": ref[-1]} | {n: runs[n].window_losses()[-1] for n in others}
    rel = {
        n: abs(losses[n] - ref[-1]) / ref[-1] if isinstance(losses[n], float) else math.inf
        for n in others
    }
    evidence = dict(final_loss=losses, rel_diff=rel, rtol=LOSS_AGREEMENT_RTOL)
    off = [n for n, d in rel.items() if not d <= LOSS_AGREEMENT_RTOL]
    if off:
        return _fail(
            f"final loss differs from fp32's by > {LOSS_AGREEMENT_RTOL:.0%}: {off}", **evidence
        )
    return _pass(f"{', '.join(others)} within {max(rel.values()):.1%} of fp32's loss", **evidence)


def check_nvml(runs: dict[str, RunResult], dry_run: bool) -> Check:
    if dry_run:
        return _skip("CPU dry run: no GPU for NVML to read")
    ran = {n: r for n, r in runs.items() if r.of("train")}
    if not ran:
        return _skip("no run printed a train event")
    lacking = []
    for name, r in ran.items():
        for e in r.of("train"):
            gpus = e.get("gpus")
            if not gpus or any(set(NVML_FIELDS) - set(g) for g in gpus):
                lacking.append(f"{name}@{e['step']}")
    last = next(iter(ran.values())).of("train")[-1].get("gpus")
    evidence = dict(runs=sorted(ran), fields=list(NVML_FIELDS), last_reading=last)
    if lacking:
        return _fail(f"train events without full gpus readings: {lacking[:5]}", **evidence)
    n = sum(len(r.of("train")) for r in ran.values())
    return _pass(f"all {n} train events of {len(ran)} runs carry the 6 NVML fields", **evidence)


def check_resume(runs: dict[str, RunResult], extra_steps: int) -> Check:
    """bf16's final checkpoint is resumed, and its loss is where bf16 left it, not at the start."""
    if (problem := _missing(runs, "bf16", "resume")) is not None:
        return problem
    first, second = runs["bf16"], runs["resume"]
    saved = first.of("checkpoint")
    resumed = second.first("resume") or {}
    before, after = first.window_losses(), second.window_losses()
    end = (first.first("done") or {}).get("step")
    evidence = dict(
        saved_step=saved[-1]["step"] if saved else None,
        resumed_step=resumed.get("step"),
        resumed_from=resumed.get("path"),
        final_step=(second.first("done") or {}).get("step"),
        bf16_first_loss=before[0] if before else None,
        bf16_last_loss=before[-1] if before else None,
        resumed_first_loss=after[0] if after else None,
    )
    if not saved or evidence["saved_step"] != end:
        return _fail("bf16 wrote no checkpoint at its last step", **evidence)
    if resumed.get("step") != end or not resumed.get("path"):
        return _fail(f"the resume run did not resume from step {end}", **evidence)
    if evidence["final_step"] != end + extra_steps:
        return _fail(f"the resumed run did not reach step {end + extra_steps}", **evidence)
    if not (_finite(before) and _finite(after)):
        return _fail("a loss is not finite", **evidence)
    if not abs(after[0] - before[-1]) < abs(after[0] - before[0]):
        return _fail("the resumed loss is nearer bf16's first loss than its last", **evidence)
    return _pass(
        f"resumed at step {end} with loss {after[0]:.4f} (bf16 ended at {before[-1]:.4f}), "
        f"trained on to {end + extra_steps}",
        **evidence,
    )


def check_flash(probe: dict[str, Any] | None, dry_run: bool) -> Check:
    if probe is None:
        return _skip("the flash-attention probe did not run")
    if dry_run:
        return _skip("CPU dry run: the probe ran on the CPU's kernel", **probe)
    if probe.get("ok"):
        return _pass("forward+backward ran with SDPA limited to FLASH_ATTENTION", **probe)
    return _fail(f"SDPA's flash kernel refused the lm model: {probe.get('error')}", **probe)


def check_sync_batchnorm(runs: dict[str, RunResult], device_count: int, dry_run: bool) -> Check:
    if dry_run:
        return _skip("CPU dry run: SyncBatchNorm needs CUDA")
    if device_count < 2:
        return _skip(
            f"needs 2 GPUs (this machine has {device_count}): NCCL allows one rank per GPU and "
            "the trainer converts BatchNorm only when world_size > 1"
        )
    if (problem := _missing(runs, "syncbn")) is not None:
        return problem
    world = (runs["syncbn"].first("start") or {}).get("world_size")
    return _pass(f"vision task with sync_batchnorm=true trained on {world} GPUs", world_size=world)


def check_baseline(runs: dict[str, RunResult]) -> Check:
    """Every baseline and split run that ran trained (a finite loss that fell)."""
    names = ("baseline", *SPLIT_RUNS[:3])
    ran = [n for n in names if n in runs and not runs[n].not_run]
    if not ran:
        return _skip("no baseline run ran")
    verdicts = {n: check_trained(runs, n, n) for n in ran}
    evidence = {n: c.why for n, c in verdicts.items()}
    bad = [n for n, c in verdicts.items() if c.status != "pass"]
    if bad:
        return _fail(f"did not train: {', '.join(bad)}", **evidence)
    return _pass(f"{', '.join(ran)} trained", **evidence)


def evaluate(
    runs: dict[str, RunResult],
    *,
    probe: dict[str, Any] | None,
    device_count: int,
    dry_run: bool,
    overflow_at_step: int,
    resume_extra_steps: int,
) -> Checks:
    """Every verdict. A check that raises is a failed check, not a lost report."""

    def guarded(fn, *args) -> Check:
        try:
            return fn(*args)
        except Exception as e:  # a surprise in the readings must not cost the whole report
            return _fail(f"the check itself failed: {type(e).__name__}: {e}")

    return Checks(
        nccl=guarded(check_nccl, runs, dry_run),
        fp32=guarded(check_trained, runs, "fp32", "fp32, TF32 off"),
        bf16=guarded(check_trained, runs, "bf16", "bf16 autocast"),
        fp16_overflow=guarded(check_fp16_overflow, runs, overflow_at_step),
        fused_adamw=guarded(check_fused_adamw, runs, dry_run),
        tf32=guarded(check_tf32, runs, dry_run),
        compile=guarded(check_compile, runs),
        precision_agreement=guarded(check_precision_agreement, runs),
        nvml=guarded(check_nvml, runs, dry_run),
        checkpoint_resume=guarded(check_resume, runs, resume_extra_steps),
        flash_attention=guarded(check_flash, probe, dry_run),
        sync_batchnorm=guarded(check_sync_batchnorm, runs, device_count, dry_run),
        baseline=guarded(check_baseline, runs),
    )


def mfu_summary(runs: dict[str, Run], formula: str, convention: str) -> Mfu:
    """The best MFU among the trainer's runs (nanoGPT's loop's are the baseline's), against
    the goal."""
    scored = {n: r.mfu for n, r in runs.items() if r.mfu is not None and n not in BARE_RUNS}
    best_run = max(scored, key=scored.get) if scored else None
    best = scored[best_run] if best_run else None
    return Mfu(
        flops_per_token=formula,
        convention=convention,
        goal=MFU_GOAL,
        best=best,
        best_run=best_run,
        goal_met=best is not None and best >= MFU_GOAL,
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _unmeasured(runs: dict[str, Run], *names: str) -> str | None:
    """Why a figure that needs ``names`` cannot be given (each run that lacks a speed, and
    why), or None when every one of them was measured."""
    why = []
    for name in names:
        run = runs.get(name)
        if run is None:
            why.append(f"{name}: not selected")
        elif run.tokens_per_s is None:
            why.append(f"{name}: {run.not_measured or 'no tokens_per_s'}")
    return "; ".join(why) or None


def _speed(runs: dict[str, Run], name: str) -> float | None:
    run = runs.get(name)
    return run.tokens_per_s if run is not None else None


def baseline_summary(runs: dict[str, Run], measured_on: str) -> Baseline:
    """The trainer against nanoGPT at each size, and the split, from the runs' own figures.
    A ratio is given only where both of its runs were measured (see ``throughput``)."""
    comparisons = []
    for trainer, base in COMPARISONS:
        t, b = runs.get(trainer), runs.get(base)
        if t is None and b is None:
            continue
        tps, bps = _speed(runs, trainer), _speed(runs, base)
        comparisons.append(
            Comparison(
                trainer_run=trainer,
                baseline_run=base,
                trainer_tokens_per_s=tps,
                baseline_tokens_per_s=bps,
                ratio=_ratio(tps, bps),
                trainer_mfu=t.mfu if t else None,
                baseline_mfu=b.mfu if b else None,
                not_measured=_unmeasured(runs, trainer, base),
            )
        )
    tps = {n: _speed(runs, n) for n in SPLIT_RUNS}
    split = Split(
        tokens_per_s=tps,
        model=_ratio(tps["ours_in_bare"], tps["baseline_fill"]),
        loop=_ratio(tps["fill"], tps["ours_in_bare"]),
        model_in_our_loop=_ratio(tps["fill"], tps["nano_in_trainer"]),
        loop_with_nanogpt_model=_ratio(tps["nano_in_trainer"], tps["baseline_fill"]),
        not_measured=_unmeasured(runs, *SPLIT_RUNS),
    )
    fill_mfu = runs["fill"].mfu if "fill" in runs else None
    met = (
        len(comparisons) == len(COMPARISONS)
        and all(c.ratio is not None and c.ratio >= BASELINE_GOAL_RATIO for c in comparisons)
        and fill_mfu is not None
        and fill_mfu >= MFU_GOAL
    )
    return Baseline(
        what=BASELINE_WHAT,
        measured_on=measured_on,
        goal_ratio=BASELINE_GOAL_RATIO,
        goal_mfu=MFU_GOAL,
        comparisons=comparisons,
        split=split,
        goal_met=met,
    )


@dataclass(frozen=True)
class EdgeSpec:
    """A run that adds one trainer setting to a trainer run (``base``) at one size."""

    run: str
    base: str
    baseline: str
    setting: str


def _spread(run: Run) -> float:
    """(max - min) / min of a measured run's timed windows' tokens/s."""
    w = run.window_tokens_per_s
    return (max(w) - min(w)) / min(w)


def edge_summary(runs: dict[str, Run], specs: list[EdgeSpec]) -> list[Edge]:
    """Each edge's gain over its base run and its ratio to the baseline, where measured; it is
    ``faster`` only by more than the noise of its two runs' windows."""
    edges = []
    for spec in specs:
        tps = _speed(runs, spec.run)
        base = _speed(runs, spec.base)
        gain = _ratio(tps, base)
        spread = None
        if gain is not None:
            spread = max(_spread(runs[spec.run]), _spread(runs[spec.base]))
        edges.append(
            Edge(
                run=spec.run,
                setting=spec.setting,
                base_run=spec.base,
                baseline_run=spec.baseline,
                tokens_per_s=tps,
                base_tokens_per_s=base,
                gain=gain,
                spread=spread,
                faster=None if gain is None else gain > 1 + spread,
                ratio=_ratio(tps, _speed(runs, spec.baseline)),
                not_measured=_unmeasured(runs, spec.run, spec.base, spec.baseline),
            )
        )
    return edges
