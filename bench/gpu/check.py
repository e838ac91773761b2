"""Run ddpjob's GPU path on a real GPU and print one JSON report.

Runbook (docs/gpu.md has every step)::

    make gpu-wheels                # here, once: .whl/ holds what the GPU machine's image lacks
    # on the GPU machine, from the repo root (the device tool's run, carry [".whl"]):
    bash bench/gpu/speed.sh        # the one call: --speed, the report in $OUT/speed.json
    . bench/gpu/env.sh && python3 bench/gpu/check.py --log $OUT/gpu_check.log \
        | tee $OUT/gpu_report.json                                        # the full check

    python bench/gpu/check.py --cpu-dry-run --speed compile=false         # the speed mode on CPU
    python bench/gpu/check.py --cpu-dry-run --only fp32,bf16,fp16,resume   # the harness on CPU
    python bench/gpu/check.py --only fill --fill-size medium              # another MFU size
    python bench/gpu/check.py --schema                                    # the report's schema

Each scenario is the real trainer, ``python -m trainer key=value ...`` in the environment
torchrun gives its one worker (RANK=0 WORLD_SIZE=1 ...; torchrun for two processes), with
``backend=nccl``, read through its JSON-lines events, its checkpoint and NCCL's own log
(NCCL_DEBUG=INFO). Scenarios, all on the lm task at ``--size`` unless noted:

    fp32     precision=fp32 tf32=false              tf32     precision=fp32 tf32=true
    bf16     precision=bf16 (writes a checkpoint)   fp16     precision=fp16, overflow forced
    compile  bf16 + compile=true                    resume   bf16's checkpoint, trained on
    fill     bf16 + compile at --fill-size (MFU)    syncbn   vision, 2 GPUs, sync_batchnorm

the baseline, each run with its trainer twin's settings (``python -m bench.gpu.baseline``:
nanoGPT's training loop, written in bench/gpu/, with nanoGPT's model or ours):

    baseline        nanoGPT's model and loop, as ``compile``   (the ratio at --size)
    baseline_fill   nanoGPT's model and loop, as ``fill``      (the ratio at --fill-size)
    ours_in_bare    the lm task's model in nanoGPT's loop, as ``fill``      } the split
    nano_in_trainer nanoGPT's model in the trainer (a task plug-in), as ``fill`` }

and the edges, each a trainer run with one setting beyond nanoGPT added to ``compile`` (at
--size) or ``fill`` (at --fill-size), measured against both: see ``EDGES``.

``--speed`` runs what the speed figures need and nothing else, most wanted first: compile,
baseline, fill, baseline_fill (the ratio at both sizes, both MFUs), then the edges while the
budget lasts (``--budget-s``, default 450 with --speed: ``RUN_S`` says what each run needs).
The full check (no --speed) runs every scenario but the edges in 540 s. The CPU dry run uses
the size tiny for both.

In this process: the GPU's name (-> its peak dense bf16 FLOP/s), an 8192^3 bf16 matmul timed
(the reachable ceiling), and the lm model's forward+backward with SDPA limited to the flash
kernel, then to cuDNN's, beside the kernel torch picks by default. stdout carries the report
alone; progress goes to stderr; ``--log`` keeps every run's output; ``--out`` holds the report
as it stands after every run, so a call cut off still leaves what it measured.

Exit codes: 0 no check failed, 1 a check failed, 2 bad arguments, 3 no CUDA GPU here,
4 a package the trainer needs is missing (install the wheels: bench/gpu/env.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import inspect
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu.figures import lm_flops_per_token, peak_bf16_tflops  # noqa: E402 (stdlib only)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_MISSING = 0, 1, 2, 3, 4

# Model shapes for the lm task (its own knobs: task_args) and the per-GPU batch. `small` and
# `medium` are GPT-2 small's and medium's shapes at a 1024 context; the shipped corpus has 53
# windows of 1024, enough for these batches. `large` runs at batch 24, where it filled an H100's
# memory best (docs/gpu.md, "Results"). `tiny` is the CPU dry run's.
SIZES: dict[str, tuple[dict[str, int], int]] = {
    "tiny": ({"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}, 8),
    "small": ({"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024}, 32),
    "medium": ({"n_layer": 24, "n_head": 16, "n_embd": 1024, "block_size": 1024}, 32),
    "large": ({"n_layer": 24, "n_head": 16, "n_embd": 2048, "block_size": 1024}, 24),
}
SCENARIOS = (
    "fp32",
    "tf32",
    "bf16",
    "fp16",
    "compile",
    "resume",
    # The speed comparison, most wanted first (the budget may leave the last ones not_run):
    # the ratio and both MFUs at the fill size, the ratio at --size, then the split.
    "fill",
    "baseline_fill",
    "baseline",
    "ours_in_bare",
    "nano_in_trainer",
    "syncbn",
)
# The edges beyond nanoGPT: run -> (the trainer run it adds one setting to, that setting).
# Each is measured against that run and against nanoGPT at the same size, in the same call.
# In --speed's order, about the cheapest first (RUN_S): the budget leaves the last ones not_run.
# strategy=fsdp on one GPU shards nothing (one rank, one shard): its runs measure what FSDP2's
# hooks, its bf16 parameters and per-block compilation cost or gain beside ddp's path.
EDGES: dict[str, tuple[str, dict[str, Any]]] = {
    "compile_fsdp": ("compile", {"strategy": "fsdp"}),
    "compile_clip": ("compile", {"fused_clip": True}),
    "compile_cudnn": ("compile", {"attention": "cudnn"}),
    "compile_graphs": ("compile", {"compile_mode": "reduce-overhead"}),
    "fill_fsdp": ("fill", {"strategy": "fsdp"}),
    "fill_clip": ("fill", {"fused_clip": True}),
    "compile_autotune": ("compile", {"compile_mode": "max-autotune-no-cudagraphs"}),
    "fill_cudnn": ("fill", {"attention": "cudnn"}),
}
# --speed: the four runs of the two ratios, the trainer's run first at each size, then the
# edges.
SPEED = ("compile", "baseline", "fill", "baseline_fill", *EDGES)
NEEDS = {"resume": "bf16"}  # resume trains on from bf16's checkpoint
# The runs measured against a trainer run: each takes that run's settings (size, batch,
# precision, compile, steps), so the two differ only in model or loop.
TWIN = {
    "baseline": "compile",
    "baseline_fill": "fill",
    "ours_in_bare": "fill",
    "nano_in_trainer": "fill",
}
# The runs of nanoGPT's loop (python -m bench.gpu.baseline), and whose model each trains.
BARE = {"baseline": "nanogpt", "baseline_fill": "nanogpt", "ours_in_bare": "ddpjob"}
# nanoGPT's model and loop at each trainer run's size: what the trainer is measured against.
BASELINE_OF = {"compile": "baseline", "fill": "baseline_fill"}
NANOGPT_TASK = "bench.gpu.nanogpt:build"
# A run that compiles the very graphs an earlier one compiled (the same model called the same
# way, at the same shapes) reuses that run's Inductor cache: the second compile of a `large`
# model then costs seconds, not a minute. The clipping edge changes the optimizer, not the
# model's graphs.
SHARED_CACHE = {
    "ours_in_bare": "fill",
    "nano_in_trainer": "baseline_fill",
    "compile_clip": "compile",
    "fill_clip": "fill",
}
# About how long one run takes on an H100 or H200, from its start to its exit (wall_s in a
# report): start-up, compilation in the warm-up window, the timed steps, and for the trainer
# its final eval (which compiles the forward again under no_grad) and checkpoint. A run is
# started only with this much of the budget left. `small` and `large` trainer runs are the
# 2026-11-22 H100 runs (82.5 s, 171.8 s); nanoGPT's loop's are estimates (no baseline run has
# been timed on a GPU yet): the trainer's less its final eval and checkpoint, which it lacks.
RUN_S: dict[str, dict[str, float]] = {
    "tiny": {"trainer": 45, "bare": 45},
    "small": {"trainer": 85, "bare": 55},
    "medium": {"trainer": 135, "bare": 85},
    "large": {"trainer": 175, "bare": 110},
}
# max-autotune's compile times GEMM and kernel variants: counted at twice a run's RUN_S (an
# estimate: it has not run on a GPU here).
RUN_S_FACTOR = {"compile_autotune": 2.0}
SPEED_BUDGET_S = 450  # --speed's default --budget-s: RUN_S's four runs and the probes
FULL_BUDGET_S = 540
# The CPU dry run is bound by no device call; on a busy 2-core machine its runs take longer than
# RUN_S says of a GPU. Its default budget only keeps a hung run from hanging the check.
DRY_RUN_BUDGET_S = 3600
# A run still going when the budget is spent gets SIGTERM, then SIGKILL this much later. The
# full check lets the trainer write its checkpoint; --speed needs nothing more from the run.
STOP_GRACE_S = {"full": 30.0, "speed": 10.0}
# What a device call spends around check.py's budget: bench/gpu/env.sh installing the wheels
# and Python starting. The one call's timeout_s (docs/gpu.md) covers SETUP_S + the budget +
# the stop grace, with room to spare.
SETUP_S = 20.0
OVERFLOW_AT_STEP = 3
PACKAGES = ("torch", "pydantic", "pydantic-core", "typing-extensions", "PyYAML", "nvidia-ml-py")
FLOPS_FORMULA = "6 * (12 * n_layer * n_embd^2 + n_embd * vocab) + 12 * n_layer * seq_len * n_embd"
FLOPS_CONVENTION = (
    "matrix products of forward + backward (backward = 2x forward), attention over the full "
    "seq_len x seq_len scores as PaLM/nanoGPT count it (a causal kernel does about half of "
    "those), nothing recomputed; peak = dense bf16 tensor-core rate per GPU"
)


class UsageError(Exception):
    """A bad argument: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we want one line
        raise UsageError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python bench/gpu/check.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only",
        help=f"comma-separated scenarios (default: all of the mode's): {','.join(SCENARIOS)}, "
        f"and the edges {','.join(EDGES)}",
    )
    p.add_argument(
        "--speed",
        action="store_true",
        help=f"the speed figures only: {','.join(SPEED)}, while the budget lasts",
    )
    p.add_argument(
        "--size", help=f"lm model size for the scenarios (default small): {', '.join(SIZES)}"
    )
    p.add_argument("--fill-size", help="lm model size for the fill (MFU) scenario (default large)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run (>= 8)")
    p.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s (else the table)")
    p.add_argument(
        "--budget-s",
        type=float,
        help=f"stop starting runs after this (default {FULL_BUDGET_S}, {SPEED_BUDGET_S} with "
        f"--speed, {DRY_RUN_BUDGET_S} with --cpu-dry-run)",
    )
    p.add_argument("--log", help="write every run's command, stdout, stderr and NCCL log here")
    p.add_argument("--out", help="write the report here too, after every run (a partial one)")
    p.add_argument("--cpu-dry-run", action="store_true", help="run the harness on CPU (gloo)")
    p.add_argument("--schema", action="store_true", help="print the report's JSON Schema")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="trainer settings added to every scenario (last wins), e.g. ddp.bucket_cap_mb=100",
    )
    args = p.parse_args(argv)
    for item in args.overrides:
        if not re.fullmatch(r"[A-Za-z_][\w.]*=.*", item):
            raise UsageError(f"{item}: expected a trainer key=value (got {item!r})")

    order = SPEED if args.speed else (*SCENARIOS, *EDGES)
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else []
    unknown = [s for s in only if s not in order]
    if unknown:
        raise UsageError(
            f"--only: unknown scenario{' for --speed' if args.speed else ''} (got {unknown[0]}). "
            f"Choose from {', '.join(order)}"
        )
    default = SPEED if args.speed else SCENARIOS
    args.only = [s for s in order if s in only] if only else list(default)
    for s in args.only:
        if s in NEEDS and NEEDS[s] not in args.only:
            raise UsageError(
                f"--only: {s} needs {NEEDS[s]}, which writes the checkpoint it resumes (got "
                f"{','.join(args.only)}). Add {NEEDS[s]}"
            )
    args.size = args.size or ("tiny" if args.cpu_dry_run else "small")
    args.fill_size = args.fill_size or ("tiny" if args.cpu_dry_run else "large")
    for flag, value in (("--size", args.size), ("--fill-size", args.fill_size)):
        if value not in SIZES:
            raise UsageError(f"{flag}: unknown size (got {value}). Choose from {', '.join(SIZES)}")
    if args.steps < 8:
        raise UsageError(f"--steps: must be >= 8 (got {args.steps})")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise UsageError(f"--peak-tflops: must be > 0 (got {args.peak_tflops})")
    if args.budget_s is None:
        budget = SPEED_BUDGET_S if args.speed else FULL_BUDGET_S
        args.budget_s = DRY_RUN_BUDGET_S if args.cpu_dry_run else budget
    if not args.budget_s > 0:
        raise UsageError(f"--budget-s: must be > 0 (got {args.budget_s})")
    return args


# ---------------------------------------------------------------------------------------------
# The scenarios: trainer command lines


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Plan:
    """Turns a scenario name into the trainer's key=value overrides."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.device = "cpu" if args.cpu_dry_run else "cuda"
        self.backend = "gloo" if args.cpu_dry_run else "nccl"
        self.log_every = args.steps // 4
        self.resume_extra = 2 * self.log_every

    def run_dir(self, name: str) -> Path:
        return self.work / name

    def size_of(self, name: str) -> str:
        name = self.base_of(name)
        return self.args.fill_size if name == "fill" else self.args.size

    @staticmethod
    def base_of(name: str) -> str:
        """The trainer run whose settings ``name`` takes (itself for a run of its own)."""
        return EDGES[name][0] if name in EDGES else TWIN.get(name, name)

    def changes_nothing(self, name: str) -> str | None:
        """Why an edge's setting would change nothing under the settings given (then it is not
        run), or None."""
        from trainer.config import load_config

        if name not in EDGES or "compile_mode" not in EDGES[name][1]:
            return None
        settings = [f"{k}={_yaml_scalar(v)}" for k, v in self.overrides(name)[0].items()]
        if not load_config(None, settings).compile:
            return "compile=false: a compile mode changes nothing"
        return None

    def needs_s(self, name: str) -> float:
        """About how long the run takes on a GPU (RUN_S): less budget left, it is not started."""
        base = RUN_S[self.size_of(name)]["bare" if name in BARE else "trainer"]
        return base * RUN_S_FACTOR.get(name, 1.0)

    def common(self, name: str) -> dict[str, Any]:
        return {
            "max_steps": self.args.steps,
            "log_every": self.log_every,
            "lr": 6e-4,
            "eval_batches": 1,
            "progress": "never",
            "resume": "never",
            "device": self.device,
            "backend": self.backend,
            "seed": 0,
            "checkpoint.dir": str(self.run_dir(name) / "ckpt"),
            "checkpoint.every_steps": 0,
            "checkpoint.keep": 1,
        }

    def lm(self, name: str) -> dict[str, Any]:
        task_args, batch = SIZES[self.size_of(name)]
        return {
            "task": "lm",
            **{f"task_args.{k}": v for k, v in task_args.items()},
            "task_args.dropout": 0.0,  # dropout is memory traffic, and it would blur the checks
            "batch_size": batch,
            **self.common(name),
        }

    def overrides(self, name: str) -> tuple[dict[str, Any], int]:
        """(key=value overrides, processes) for one scenario."""
        if name in EDGES:  # its base run's settings and one more, its own directory
            base, setting = EDGES[name]
            o, _ = self.overrides(base)
            o |= setting | {"checkpoint.dir": str(self.run_dir(name) / "ckpt")}
            return o, 1
        if name in TWIN:  # its twin's settings, its own directory
            o, _ = self.overrides(TWIN[name])
            o["checkpoint.dir"] = str(self.run_dir(name) / "ckpt")
            if name == "nano_in_trainer":
                o["task"] = NANOGPT_TASK
            return o, 1
        if name == "syncbn":
            o = self.common(name) | {"task": "vision", "batch_size": 64, "sync_batchnorm": True}
            return self._with_user_overrides(o), 2
        o = self.lm(name)
        if name == "fp32":
            o |= {"precision": "fp32", "tf32": False}
        elif name == "tf32":
            o |= {"precision": "fp32", "tf32": True}
        elif name in ("bf16", "compile", "fill"):
            o |= {"precision": "bf16", "compile": name != "bf16"}
        elif name == "fp16":
            o |= {
                "precision": "fp16",
                "task": "bench.gpu.probe_task:build",
                "task_args.overflow_at_step": OVERFLOW_AT_STEP,
                "log_every": 1,  # the loss scale of every step, around the overflow
            }
        elif name == "resume":
            o |= {
                "precision": "bf16",
                "resume": "auto",
                "checkpoint.dir": str(self.run_dir("bf16") / "ckpt"),
                "max_steps": self.args.steps + self.resume_extra,
            }
        return self._with_user_overrides(o), 1

    def command(self, name: str, port: int) -> list[str]:
        """The scenario's command line: the trainer, or nanoGPT's loop.

        One trainer process runs with the environment torchrun gives its one worker (``env``
        sets it and execs Python: no process more), as a one-process PyTorchJob pod runs it: a
        process group of one and DDP, as under torchrun, without an agent beside it that only
        starts and waits (two seconds of CPU and its own start-up, every run). Two or more
        processes run under torchrun."""
        overrides, nproc = self.overrides(name)
        settings = [f"{k}={_yaml_scalar(v)}" for k, v in overrides.items()]
        if name in BARE:
            return [sys.executable, "-m", "bench.gpu.baseline", "--model", BARE[name], *settings]
        if nproc == 1:
            one = {"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 1, "LOCAL_WORLD_SIZE": 1}
            rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            launcher = [f"{k}={v}" for k, v in (one | rendezvous).items()]
            return ["env", *launcher, sys.executable, "-m", "trainer", *settings]
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            # Loopback, not --standalone's host name: a lent machine's name may not resolve.
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "trainer",
            *settings,
        ]

    def cache_dir(self, name: str) -> Path:
        """Where Inductor keeps this run's compiled graphs (shared with an earlier twin)."""
        return self.run_dir(SHARED_CACHE.get(name, name)) / "inductor"

    def _with_user_overrides(self, o: dict[str, Any]) -> dict[str, Any]:
        # Strings: the trainer parses each value as YAML, as it does on its own command line.
        return o | dict(item.split("=", 1) for item in self.args.overrides)

    def validate(self) -> None:
        """Every scenario's settings through the trainer's own config and task loading, so a
        bad key= fails here in one line, not in each run on the GPU. Raises ConfigError."""
        from trainer.config import load_config
        from trainer.tasks import load_task

        for name in self.args.only:
            overrides, _ = self.overrides(name)
            cfg = load_config(None, [f"{k}={_yaml_scalar(v)}" for k, v in overrides.items()])
            load_task(cfg.task, cfg.task_args)


# ---------------------------------------------------------------------------------------------
# Running one scenario


def lm_flops_of(config: dict[str, Any]) -> int | None:
    """Model FLOPs per token of an lm run, from the config its `start` event printed (so
    trainer settings given on the command line count), or None for another task."""
    from trainer.tasks.lm import LMTask

    if config.get("task") not in ("lm", "bench.gpu.probe_task:build", NANOGPT_TASK):
        return None
    known = inspect.signature(LMTask).parameters
    task = LMTask(**{k: v for k, v in config.get("task_args", {}).items() if k in known})
    m = task.model_args  # the vocabulary is the corpus's characters: read it, as the run did
    return lm_flops_per_token(m["n_layer"], m["n_embd"], m["block_size"], m["vocab_size"])


def _child_env(run_dir: Path, cache_dir: Path) -> dict[str, str]:
    """This environment minus any launcher's variables, plus NCCL's log and a private cache."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith(("PET_", "TORCHELASTIC_"))
    }
    return env | {
        "PYTHONUNBUFFERED": "1",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT",
        "NCCL_DEBUG_FILE": str(run_dir / "nccl.%h.%p.log"),
        # A fresh cache per run (but SHARED_CACHE's): compile time is real, and the graphs it
        # holds are the evidence.
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    }


def run_scenario(name: str, plan: Plan, timeout_s: float, log) -> Any:
    """Run one scenario to its end (or its timeout) and collect what it left behind."""
    from bench.gpu.report import RunResult

    overrides, _ = plan.overrides(name)
    run_dir = plan.run_dir(name)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = plan.command(name, _free_port())
    result = RunResult(name=name, command=shlex.join(cmd))
    started = time.monotonic()
    env = _child_env(run_dir, plan.cache_dir(name))
    with open(run_dir / "stdout", "w") as out, open(run_dir / "stderr", "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            result.exit_code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc, STOP_GRACE_S["speed" if plan.args.speed else "full"])
            result.stderr_tail = f"stopped after {timeout_s:.0f}s (the time budget)"
    result.wall_s = time.monotonic() - started
    stdout = (run_dir / "stdout").read_text(errors="replace")
    stderr = (run_dir / "stderr").read_text(errors="replace")
    result.events = _events(stdout)
    if result.exit_code != 0 and not result.stderr_tail:
        result.stderr_tail = error_tail(stderr)
    nccl_text = "".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("nccl.*.log")))
    if nccl_text:
        version = re.search(r"NCCL version ([\w.+-]+)", nccl_text)
        result.nccl = {
            "version": version.group(1) if version else None,
            "init_complete": "Init COMPLETE" in nccl_text,
        }
    fx = plan.cache_dir(name) / "fxgraph"
    if (result.first("start") or {}).get("config", {}).get("compile"):
        result.inductor_graphs = len(list(fx.glob("*/*"))) if fx.is_dir() else 0
    with contextlib.suppress(Exception):  # a run that failed may have left no readable file
        result.checkpoint = checkpoint_facts(Path(overrides["checkpoint.dir"]))
    if log is not None:
        log.write(
            f"\n===== {name}: exit {result.exit_code}, {result.wall_s:.1f}s\n$ {result.command}\n"
        )
        log.write(f"--- stdout\n{stdout}--- stderr\n{stderr}--- nccl\n{nccl_text[-20000:]}\n")
        log.flush()
    return result


def error_tail(stderr: str, lines: int = 15) -> str:
    """The end of a failed run's stderr, led by the last exception line when the end does not
    hold it (torchrun closes with a summary that names no error)."""
    text = stderr.strip().splitlines()
    tail = text[-lines:]
    raised = [
        line
        for line in text
        if re.search(r"(^|[\s:])[\w.]*(Error|Exception): ", line)
        and "ChildFailedError" not in line  # torchrun's own, about the worker that failed
    ]
    if raised and raised[-1] not in tail:
        return "\n".join([raised[-1], "...", *tail])
    return "\n".join(tail)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _events(stdout: str) -> list[dict[str, Any]]:
    """The trainer's JSON-lines events among its stdout lines (human lines are skipped)."""
    events = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(stat.parent.name))
    return kids


def _stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """Stop a run we started: SIGTERM first (the trainer checkpoints and exits 143; torchrun
    stops its workers, which do the same), then SIGKILL what is left. torchrun starts each worker
    in a session of its own, so the workers are found by parent pid before torchrun goes."""
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        for pid in [*workers, proc.pid]:  # each one leads its own process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        proc.wait()


def checkpoint_facts(ckpt_dir: Path) -> dict[str, Any] | None:
    """What the newest checkpoint says about the optimizer and the loss scaler."""
    from trainer.checkpoint.manager import read_path

    files = sorted(p for p in ckpt_dir.glob("step_*") if (p / "manifest.json").is_file())
    if not files:
        return None
    state = read_path(str(files[-1]))
    opt = state["optimizer"]
    counts = sorted({int(s["step"]) for s in opt["state"].values() if "step" in s})
    return {
        "path": str(files[-1]),
        "step": state["step"],
        "optimizer_steps": counts[-1] if counts else None,
        "optimizer_step_counts": counts,
        "fused": [g.get("fused") for g in opt["param_groups"]],
        "loss_scale": (state.get("scaler") or {}).get("scale"),
    }


# ---------------------------------------------------------------------------------------------
# This process: the machine, the peak, and two probes


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(dry_run: bool) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "device": "cpu" if dry_run else "cuda",
        "device_name": platform.processor() or platform.machine(),
        "device_count": torch.cuda.device_count() if not dry_run else 0,
        "capability": None,
        "memory_gib": None,
        "driver": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "sdpa_priority": sdpa_priority(),
        "python": platform.python_version(),
        "packages": {d: _version(d) for d in PACKAGES},
    }
    with contextlib.suppress(Exception):
        info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    if not dry_run:
        props = torch.cuda.get_device_properties(0)
        info |= {
            "device_name": torch.cuda.get_device_name(0),
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    return info


def measure_matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """bf16 n x n x n matmul on random data, median of ``reps`` timed with CUDA events."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / statistics.median(times) / 1e12


def sdpa_priority() -> list[str]:
    """The order in which torch tries SDPA's kernels by default, by name."""
    import torch
    from torch.nn.attention import SDPBackend

    names = {int(b): b.name for b in SDPBackend.__members__.values()}
    try:
        return [names.get(i, str(i)) for i in torch._C._get_sdp_priority_order()]
    except AttributeError:  # a torch without priorities: flash, efficient, math (and cuDNN)
        return []


def probe_attention(size: str, device: str) -> dict[str, Any]:
    """The lm model's forward+backward in bf16 with SDPA allowed only its flash kernel, then
    only cuDNN's, and the kernel torch picks for the model's q, k, v when it may choose."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.tasks.lm import LMTask

    task_args, _ = SIZES[size]
    task = LMTask(**task_args, dropout=0.0)
    model = task.build_model().to(device)
    t, heads, width = task_args["block_size"], task_args["n_head"], task_args["n_embd"]
    x = torch.randint(0, len(task.vocab), (2, t), device=device)
    evidence: dict[str, Any] = {
        "model_size": size,
        "head_dim": width // heads,
        "seq_len": t,
        "dtype": "bfloat16",
        "default_kernel": None,
    }
    # q, k, v as the model makes them: views of one (b, t, 3, heads, head_dim) projection.
    qkv = torch.randn(2, t, 3, heads, width // heads, device=device, dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    with contextlib.suppress(Exception):  # a private function: the evidence, not the verdict
        choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True))
        names = {int(b): b.name for b in SDPBackend.__members__.values()}
        evidence["default_kernel"] = names.get(choice, str(choice))
    kernels = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))
    for key, backend in kernels:
        try:
            with sdpa_kernel([backend]):
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                    loss, _ = task.loss(model, (x, x))
                loss.backward()
            ok, error = bool(torch.isfinite(loss).item()), None
        except RuntimeError as e:
            ok, error = False, str(e).strip().splitlines()[0][:300]
        model.zero_grad(set_to_none=True)
        if key == "flash":
            evidence |= {"ok": ok, "error": error}
        else:
            evidence |= {"cudnn_ok": ok, "cudnn_error": error}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return evidence


def _say(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The command


def no_gpu() -> str | None:
    """Why this machine cannot run the GPU check (no torch, no CUDA GPU), or None."""
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"no CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none. "
        "Run it on a GPU machine (docs/gpu.md), or pass --cpu-dry-run to test the harness"
    )


def missing_package() -> str | None:
    """Why the trainer cannot start here (a package it imports is missing), or None."""
    for module, dist in (("torch", "torch"), ("pydantic", "pydantic"), ("yaml", "PyYAML")):
        try:
            __import__(module)
        except ImportError as e:
            hint = (
                "run this with the Python that holds torch"
                if module == "torch"
                else "install the wheels first: . bench/gpu/env.sh (docs/gpu.md)"
            )
            return f"{dist} does not import here ({type(e).__name__}: {e}); {hint}"
    return None


def check(args: argparse.Namespace, work: Path, log) -> dict[str, Any]:
    """Run the probes and the scenarios; return the report as a JSON-ready dict (and write it
    to ``--out`` after every run, so a call cut off still leaves what it measured)."""
    from bench.gpu import report as rep

    clock = time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    dry = args.cpu_dry_run
    machine = machine_info(dry)
    _say(f"{machine['device_name']} x{machine['device_count']}, torch {machine['torch']}")

    found = None if dry else peak_bf16_tflops(machine["device_name"])
    if args.peak_tflops:
        peak, source = args.peak_tflops, "--peak-tflops"
    elif found:
        peak, source = found[0], f"datasheet table: {found[1]}"
    else:
        peak, source = None, f"not in the table: {machine['device_name']} (pass --peak-tflops)"
    measured = None
    if not dry:
        with contextlib.suppress(Exception):
            measured = round(measure_matmul_tflops(), 1)
    probe = None
    try:
        probe = probe_attention(args.size, "cpu" if dry else "cuda")
    except Exception as e:  # the probe is one check; it must not cost the report
        probe = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}

    plan = Plan(args, work)
    results: dict[str, rep.RunResult] = {}
    edges = [
        rep.EdgeSpec(
            run=name,
            base=EDGES[name][0],
            baseline=BASELINE_OF[EDGES[name][0]],
            setting=" ".join(f"{k}={_yaml_scalar(v)}" for k, v in EDGES[name][1].items()),
        )
        for name in args.only
        if name in EDGES
    ]
    measured_on = f"{machine['device_name']}, torch {machine['torch']}, CUDA {machine['cuda']}"

    def assemble() -> rep.Report:
        checks = rep.evaluate(
            results,
            probe=probe,
            device_count=machine["device_count"],
            dry_run=dry,
            overflow_at_step=OVERFLOW_AT_STEP,
            resume_extra_steps=plan.resume_extra,
        )
        runs = {n: rep.summarize(r, peak) for n, r in results.items()}
        failed = [n for n, c in checks.model_dump().items() if c["status"] == "fail"]
        return rep.Report(
            report=rep.REPORT_NAME,
            schema_version=2,
            mode="speed" if args.speed else "full",
            ok=not failed,
            dry_run=dry,
            command=shlex.join([sys.executable, *sys.argv]),
            started_at=started_at,
            elapsed_s=round(time.monotonic() - clock, 1),
            machine=rep.Machine(**machine),
            peak=rep.Peak(
                bf16_dense_tflops=peak, source=source, measured_bf16_matmul_tflops=measured
            ),
            mfu=rep.mfu_summary(runs, FLOPS_FORMULA, FLOPS_CONVENTION),
            baseline=rep.baseline_summary(runs, measured_on),
            edges=rep.edge_summary(runs, edges),
            checks=checks,
            runs=runs,
        )

    for i, name in enumerate(args.only, 1):
        left = args.budget_s - (time.monotonic() - clock)
        if name == "syncbn" and (dry or machine["device_count"] < 2):
            continue  # its check says why
        if name in NEEDS and not results[NEEDS[name]].completed:
            results[name] = rep.RunResult(name, not_run=f"{NEEDS[name]} did not complete")
            continue
        if why := plan.changes_nothing(name):
            results[name] = rep.RunResult(name, not_run=why)
            continue
        if left < plan.needs_s(name):
            results[name] = rep.RunResult(
                name,
                not_run=f"time budget spent (--budget-s {args.budget_s:g}): {left:.0f} s left, "
                f"the run needs about {plan.needs_s(name):.0f} s",
            )
            continue
        _say(f"[{i}/{len(args.only)}] {name} ...")
        r = run_scenario(name, plan, left, log)
        with contextlib.suppress(Exception):  # no count is a null in the report, not a crash
            r.flops_per_token = lm_flops_of((r.first("start") or {}).get("config", {}))
        r.warmup_steps = plan.log_every
        results[name] = r
        _say(f"[{i}/{len(args.only)}] {name}: exit {r.exit_code} in {r.wall_s:.0f}s")
        # Checkpoints weigh GBs at these sizes: keep only bf16's, until resume has read it.
        if not (name == "bf16" and "resume" in args.only):
            shutil.rmtree(Path(plan.overrides(name)[0]["checkpoint.dir"]), ignore_errors=True)
        if args.out:
            write_report(Path(args.out), assemble().model_dump(mode="json"))

    report = assemble()
    failed = [n for n, c in report.checks if c.status == "fail"]
    _say(f"failed: {', '.join(failed)}" if failed else "no check failed")
    out = report.model_dump(mode="json")
    if args.out:
        write_report(Path(args.out), out)
    return out


def write_report(path: Path, report: dict[str, Any]) -> None:
    """The report into ``path`` whole or not at all (a reader never sees half of one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        log = open(args.log, "w") if args.log else None  # noqa: SIM115 (closed below)
        if args.out:
            Path(args.out).write_text("")  # writable, before any GPU time is spent
    except UsageError as e:
        _say(str(e))
        return EXIT_USAGE
    except OSError as e:
        flag = "--out" if args.out and e.filename == args.out else "--log"
        _say(f"{flag}: cannot write {e.filename} ({e.strerror})")
        return EXIT_USAGE
    try:
        # A machine without a GPU says so before anything else, whatever else it lacks.
        with contextlib.suppress(ImportError):
            if not (args.cpu_dry_run or args.schema) and (why := no_gpu()):
                _say(why)
                return EXIT_NO_GPU
        if why := missing_package():
            _say(why)
            return EXIT_MISSING
        if args.schema:
            from bench.gpu.report import Report

            print(json.dumps(Report.model_json_schema(), indent=1))
            return EXIT_OK
        from trainer.config import ConfigError

        work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
        try:
            try:
                Plan(args, work).validate()
            except ConfigError as e:
                _say(f"trainer settings: {'; '.join(e.problems)}")
                return EXIT_USAGE
            report = check(args, work, log)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if log is not None:
            log.close()
    print(json.dumps(report, indent=1))
    return EXIT_OK if report["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
