"""``python bench/gpu/check.py`` as a command: its exits, its trainer command lines, and a real
run of its harness on CPU (``--cpu-dry-run``), where the GPU-only checks are skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpu import check as gc
from bench.gpu.figures import lm_flops_per_token
from bench.gpu.report import Report
from trainer.config import load_config
from trainer.tasks import load_task
from trainer.tasks.lm import LMTask

REPO = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, "bench/gpu/check.py"]


def _run(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        CHECK + args,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_without_a_gpu_it_says_so_in_one_line_and_exits_3() -> None:
    p = _run([], CUDA_VISIBLE_DEVICES="")  # no GPU, whatever machine runs the test
    assert p.returncode == gc.EXIT_NO_GPU == 3
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpu_check: no CUDA GPU") and "--cpu-dry-run" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "fp32,nope"], "--only: unknown scenario (got nope)"),
        (["--only", "resume"], "--only: resume needs bf16"),
        (["--size", "huge"], "--size: unknown size (got huge)"),
        (["--steps", "3"], "--steps: must be >= 8 (got 3)"),
        (["--steps", "many"], "invalid int value"),
        (["--peak-tflops", "-1"], "--peak-tflops: must be > 0"),
        (["--budget-s", "0"], "--budget-s: must be > 0"),
        (["--log", "/no/such/dir/gpu.log"], "--log: cannot write /no/such/dir/gpu.log"),
        (["--out", "/no/such/dir/gpu.json"], "--out: cannot write /no/such/dir/gpu.json"),
        (["--speed", "--only", "fp32"], "--only: unknown scenario for --speed (got fp32)"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["nokey"], "nokey: expected a trainer key=value"),
        # Trainer settings go through the trainer's own config before any run starts.
        (["--cpu-dry-run", "ddp.bucket_cap_mb=-1"], "trainer settings: ddp.bucket_cap_mb"),
        (["--cpu-dry-run", "task_args.bogus=1"], "unexpected keyword argument 'bogus'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = _run(args)
    assert p.returncode == gc.EXIT_USAGE == 2
    assert p.stdout == "" and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("gpu_check: ") and message in line


def test_the_default_fill_is_the_run_that_met_the_mfu_goal(tmp_path: Path) -> None:
    """On a GPU the one command measures what docs/gpu.md's results stand on: the fill at
    `large`, batch 24 (49.2% MFU on an H100), the other scenarios at `small`. The CPU dry run
    keeps `tiny` for both."""
    args = gc.parse_args([])
    assert (args.size, args.fill_size, args.budget_s) == ("small", "large", 540)
    assert args.only == list(gc.SCENARIOS)  # the edges are --speed's
    fill, _ = gc.Plan(args, tmp_path).overrides("fill")
    assert (fill["task_args.n_layer"], fill["task_args.n_embd"]) == (24, 2048)
    assert (fill["task_args.block_size"], fill["batch_size"]) == (1024, 24)
    assert (fill["precision"], fill["compile"]) == ("bf16", True)
    dry = gc.parse_args(["--cpu-dry-run"])
    assert (dry.size, dry.fill_size, dry.budget_s) == ("tiny", "tiny", gc.DRY_RUN_BUDGET_S)
    assert gc.parse_args(["--fill-size", "medium"]).fill_size == "medium"


def test_schema_is_the_report_models_json_schema() -> None:
    p = _run(["--schema"], CUDA_VISIBLE_DEVICES="")  # needs no GPU
    assert p.returncode == 0, p.stderr
    schema = json.loads(p.stdout)
    assert schema == Report.model_json_schema()
    assert {"checks", "runs", "mfu", "peak", "machine", "ok"} <= set(schema["properties"])


def test_speed_runs_the_two_ratios_first_then_the_edges() -> None:
    """--speed measures what the speed figures need, most wanted first: the trainer and
    nanoGPT at --size and at --fill-size, then each edge; its budget fits RUN_S's four runs."""
    args = gc.parse_args(["--speed"])
    assert args.only[:4] == ["compile", "baseline", "fill", "baseline_fill"]
    assert args.only[4:] == list(gc.EDGES)
    assert (args.size, args.fill_size, args.budget_s) == ("small", "large", gc.SPEED_BUDGET_S)
    plan = gc.Plan(args, Path("/unused"))
    assert sum(plan.needs_s(n) for n in args.only[:4]) < gc.SPEED_BUDGET_S
    assert gc.parse_args(["--speed", "--only", "fill_cudnn,fill"]).only == ["fill", "fill_cudnn"]


def test_each_edge_is_its_base_run_with_one_setting_more(tmp_path: Path) -> None:
    plan = gc.Plan(gc.parse_args(["--speed", "batch_size=4"]), tmp_path)
    for name, (base, setting) in gc.EDGES.items():
        mine, _ = plan.overrides(name)
        theirs, _ = plan.overrides(base)
        differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
        assert differ == {"checkpoint.dir", *setting}, name
        assert plan.size_of(name) == plan.size_of(base) and gc.BASELINE_OF[base] in gc.BARE
        cfg = load_config(None, [f"{k}={gc._yaml_scalar(v)}" for k, v in mine.items()])
        for key, value in setting.items():
            assert getattr(cfg, key) == value
    # Only the clipping edges leave the model's graphs as their base run compiles them.
    assert {n for n in gc.EDGES if n in gc.SHARED_CACHE} == {"compile_clip", "fill_clip"}


def test_a_compile_mode_edge_is_not_run_without_compile(tmp_path: Path) -> None:
    plan = gc.Plan(gc.parse_args(["--speed", "compile=false"]), tmp_path)
    assert plan.changes_nothing("compile_graphs") == plan.changes_nothing("compile_autotune")
    assert plan.changes_nothing("compile_graphs") == "compile=false: a compile mode changes nothing"
    assert plan.changes_nothing("compile_clip") is None  # clipping needs no compile
    assert gc.Plan(gc.parse_args(["--speed"]), tmp_path).changes_nothing("compile_graphs") is None


def test_a_run_is_started_only_with_the_time_it_needs_left(tmp_path: Path) -> None:
    """A run the budget cannot see to its end is not started (a run stopped half-way has no
    speed): a `large` trainer run needs more of it than a `small` one or nanoGPT's loop."""
    plan = gc.Plan(gc.parse_args(["--speed"]), tmp_path)
    assert plan.needs_s("fill") == gc.RUN_S["large"]["trainer"]
    assert plan.needs_s("baseline_fill") == gc.RUN_S["large"]["bare"]
    assert plan.needs_s("fill_clip") == plan.needs_s("fill") > plan.needs_s("compile_cudnn")
    assert plan.needs_s("baseline") == gc.RUN_S["small"]["bare"] < plan.needs_s("compile")
    assert plan.needs_s("compile_autotune") == 2 * plan.needs_s("compile")  # its long compile


@pytest.mark.parametrize("size", list(gc.SIZES))
def test_every_scenario_is_a_valid_trainer_command(size: str, tmp_path: Path) -> None:
    """What the GPU session will run goes through the trainer's own config and task loading
    here: a bad key, a task argument the task does not take, or a batch larger than one rank's
    share of the data would otherwise first show up on the GPU."""
    plan = gc.Plan(gc.parse_args(["--size", size, "--fill-size", size]), tmp_path)
    seen = {}
    for name in (*gc.SCENARIOS, *gc.EDGES):
        overrides, nproc = plan.overrides(name)
        cfg = load_config(None, [f"{k}={gc._yaml_scalar(v)}" for k, v in overrides.items()])
        task = load_task(cfg.task, cfg.task_args)
        train, _ = task.build_datasets()
        assert len(train) // nproc >= cfg.batch_size, (name, len(train), cfg.batch_size)
        assert (cfg.device, cfg.backend) == ("cuda", "nccl")
        seen[name] = cfg
    assert (seen["fp32"].precision, seen["fp32"].tf32) == ("fp32", False)
    assert (seen["tf32"].precision, seen["tf32"].tf32) == ("fp32", True)
    assert [seen[n].compile for n in ("bf16", "compile", "fill")] == [False, True, True]
    assert seen["fp16"].precision == "fp16" and seen["fp16"].log_every == 1
    assert seen["fp16"].task_args["overflow_at_step"] == gc.OVERFLOW_AT_STEP
    assert seen["resume"].checkpoint.dir == seen["bf16"].checkpoint.dir
    assert seen["resume"].max_steps > seen["bf16"].max_steps
    assert seen["syncbn"].sync_batchnorm and seen["syncbn"].task == "vision"
    assert seen["nano_in_trainer"].task == gc.NANOGPT_TASK


def test_each_baseline_run_takes_its_trainer_twins_settings(tmp_path: Path) -> None:
    """A ratio is only fair if the two runs differ in nothing but the model or the loop: the
    baseline runs get their twin's size, batch, precision, compile and steps (and any trainer
    setting given on the command line), and a different run directory."""
    plan = gc.Plan(gc.parse_args(["batch_size=4"]), tmp_path)
    for name, twin in gc.TWIN.items():
        mine, _ = plan.overrides(name)
        theirs, _ = plan.overrides(twin)
        differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
        expected = {"checkpoint.dir"} | ({"task"} if name == "nano_in_trainer" else set())
        assert differ == expected, name
        assert mine["batch_size"] == "4"
        cmd = plan.command(name, 29500)
        if name in gc.BARE:
            assert cmd[1:5] == ["-m", "bench.gpu.baseline", "--model", gc.BARE[name]]
        else:  # one process: the trainer in torchrun's environment for its one worker
            launcher = ["RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1", "LOCAL_WORLD_SIZE=1"]
            rendezvous = ["MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"]
            assert cmd[:7] == ["env", *launcher, *rendezvous]
            assert cmd[7:10] == [sys.executable, "-m", "trainer"]
        assert cmd[-len(mine) :] == [f"{k}={gc._yaml_scalar(v)}" for k, v in mine.items()]
    assert gc.BARE["baseline"] == gc.BARE["baseline_fill"] == "nanogpt"
    assert gc.BARE["ours_in_bare"] == "ddpjob"
    # The second compile of the same graphs at the fill size reuses the first one's cache.
    assert plan.cache_dir("ours_in_bare") == plan.cache_dir("fill")
    assert plan.cache_dir("nano_in_trainer") == plan.cache_dir("baseline_fill")
    assert plan.cache_dir("compile") != plan.cache_dir("baseline")
    # Two processes (syncbn's) run under torchrun.
    syncbn = plan.command("syncbn", 29500)
    assert syncbn[1:3] == ["-m", "torch.distributed.run"]
    assert syncbn[syncbn.index("--nproc-per-node") + 1] == "2" and "trainer" in syncbn
    # The run whose cache is reused comes first, in either mode.
    for order in (list(gc.SCENARIOS) + list(gc.EDGES), list(gc.SPEED)):
        shared = [(b, a) for b, a in gc.SHARED_CACHE.items() if b in order]
        assert all(order.index(a) < order.index(b) for b, a in shared)


def test_trainer_settings_on_the_command_line_reach_every_scenario(tmp_path: Path) -> None:
    plan = gc.Plan(gc.parse_args(["ddp.bucket_cap_mb=500", "batch_size=4"]), tmp_path)
    for name in gc.SCENARIOS:
        overrides, _ = plan.overrides(name)
        assert overrides["ddp.bucket_cap_mb"] == "500" and overrides["batch_size"] == "4"


def test_flops_are_counted_from_the_config_the_run_printed() -> None:
    """Sizes given as trainer settings count, and so does the corpus's vocabulary."""
    vocab = len(LMTask().vocab)
    config = {"task": "lm", "task_args": {"n_layer": 3, "n_embd": 48, "block_size": 20}}
    assert gc.lm_flops_of(config) == lm_flops_per_token(3, 48, 20, vocab)
    nano = {"task": gc.NANOGPT_TASK, "task_args": config["task_args"]}
    assert gc.lm_flops_of(nano) == gc.lm_flops_of(config)  # the baseline: the same count
    probe = {"task": "bench.gpu.probe_task:build", "task_args": {"overflow_at_step": 3}}
    defaults = LMTask().model_args
    assert gc.lm_flops_of(probe) == lm_flops_per_token(
        defaults["n_layer"], defaults["n_embd"], defaults["block_size"], vocab
    )
    assert gc.lm_flops_of({"task": "vision", "task_args": {}}) is None


def test_a_spent_budget_still_prints_the_report() -> None:
    """Runs the budget cannot fit are reported as not run, and the report still comes out, so
    one device call always returns one."""
    p = _run(["--cpu-dry-run", "--only", "fp32,bf16", "--budget-s", "1"])
    assert p.returncode == 0, p.stderr[-2000:]
    report = Report.model_validate_json(p.stdout)
    spent = r"time budget spent \(--budget-s 1\): -?[01] s left, the run needs about 45 s"
    assert set(report.runs) == {"fp32", "bf16"}
    assert all(re.fullmatch(spent, r.not_run) for r in report.runs.values()), report.runs
    assert report.checks.fp32.status == "skip" and "time budget" in report.checks.fp32.why


def test_a_failed_runs_error_names_the_exception_above_torchruns_summary() -> None:
    stderr = "\n".join(
        ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "x.py", line 1']
        + ["[rank0]: RuntimeError: No viable backend for scaled_dot_product_attention was found."]
        + [f"torchrun summary line {i}" for i in range(20)]
        + ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    )
    error = gc.error_tail(stderr)
    assert error.startswith("[rank0]: RuntimeError: No viable backend") and "line 19" in error
    assert "line 5" not in error  # the summary's end, 15 lines
    short = "ValueError: bad\nend"
    assert gc.error_tail(short) == short


_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
     " time.sleep(120)"],
    start_new_session=True,  # as torchrun starts its workers
)
print(worker.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # killed, waiting for its new parent to reap it


def test_stop_ends_a_launcher_and_the_workers_in_their_own_sessions() -> None:
    """A timed-out run must leave no process behind (on a GPU machine, one holding the GPU),
    even when the launcher ignores SIGTERM and its workers sit in sessions of their own."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    worker = int(proc.stdout.readline())
    gc._stop(proc, grace_s=1)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(worker)


@pytest.mark.long
@pytest.mark.slow
def test_cpu_dry_run_runs_the_real_trainer_and_reports(tmp_path: Path) -> None:
    """The harness end to end on CPU: real trainer runs (a process group of one, gloo), a
    forced fp16 overflow, a resume, nanoGPT's loop beside the fill with both halves of the
    split, and a report that validates against the schema. compile=false: compiling on a
    shared 2-core machine takes minutes, and the dry run tests the harness, not the speed."""
    log = tmp_path / "gpu_check.log"
    runs = "fp32,bf16,fp16,resume,fill,baseline_fill,ours_in_bare,nano_in_trainer"
    args = ["--cpu-dry-run", "--only", runs, "--steps", "8", "compile=false"]
    p = _run([*args, "--peak-tflops", "0.5", "--log", str(log)], timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    report = Report.model_validate_json(p.stdout)  # stdout is the report and nothing else
    assert report.ok and report.dry_run and report.machine.device == "cpu"

    status = {name: check.status for name, check in report.checks}
    for name in ("fp32", "bf16", "fp16_overflow", "precision_agreement", "checkpoint_resume"):
        assert status[name] == "pass", report.checks.model_dump()[name]
    gpu_only = ("nccl", "fused_adamw", "tf32", "nvml", "flash_attention", "sync_batchnorm")
    assert all(status[name] == "skip" for name in gpu_only)
    assert status["compile"] == "skip"  # not selected
    assert status["baseline"] == "pass", report.checks.baseline.why

    overflow = report.checks.fp16_overflow.evidence
    assert (overflow["loss_scale_before"], overflow["loss_scale_at"]) == (65536.0, 32768.0)
    assert overflow["optimizer_updates"] == 8 - len(overflow["scale_drops_at_steps"]) == 7
    resume = report.checks.checkpoint_resume.evidence
    assert resume["resumed_step"] == 8 and resume["final_step"] == 12
    assert report.checks.flash_attention.evidence["ok"] is True  # the probe ran (on CPU)

    one = "env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 "
    for name, run in report.runs.items():  # the trainer in a process group of one
        assert run.command.startswith(one if name not in gc.BARE else sys.executable), run.command
    fpt = lm_flops_per_token(1, 32, 32, len(LMTask().vocab))  # the dry run's tiny size
    for name, run in report.runs.items():
        assert run.exit_code == 0 and run.steps == (12 if name == "resume" else 8)
        if name == "resume":  # 4 steps more: one warm-up window and one timed, no speed
            assert run.tokens_per_s is None and run.timed_windows == 1
            assert run.not_measured.startswith("1 timed window(s) after the 2 warm-up steps")
            continue
        assert run.flops_per_token == fpt and run.tokens_per_s > 0 and run.timed_windows >= 3
        assert run.mfu == pytest.approx(fpt * run.tokens_per_s / 0.5e12)
    trainer_runs = [r for n, r in report.runs.items() if n not in gc.BARE and r.mfu is not None]
    assert report.mfu.best == max(r.mfu for r in trainer_runs)
    assert report.mfu.best_run not in gc.BARE
    # The baseline beside the fill: its ratio and both MFUs, and the four runs of the split.
    (fill,) = [c for c in report.baseline.comparisons if c.trainer_run == "fill"]
    assert fill.baseline_run == "baseline_fill"
    runs_ = report.runs
    assert fill.ratio == pytest.approx(
        runs_["fill"].tokens_per_s / runs_["baseline_fill"].tokens_per_s
    )
    assert fill.trainer_mfu == runs_["fill"].mfu and fill.baseline_mfu == runs_["baseline_fill"].mfu
    split = report.baseline.split
    assert split.model == pytest.approx(
        runs_["ours_in_bare"].tokens_per_s / runs_["baseline_fill"].tokens_per_s
    )
    assert None not in (split.loop, split.model_in_our_loop, split.loop_with_nanogpt_model)
    assert report.baseline.goal_met is False  # no `compile` run: no ratio at --size
    text = log.read_text()
    assert all(f"===== {name}: exit 0" in text for name in report.runs)
    assert "task=bench.gpu.probe_task:build" in text
    assert "-m bench.gpu.baseline --model nanogpt" in text
    assert "task=bench.gpu.nanogpt:build" in text
