"""The one device call (docs/gpu.md, the runbook's first command): that it fits a device call,
and that it runs end to end, exactly as written there, on CPU (``--cpu-dry-run``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import check as gc
from bench.gpu.report import Report

REPO = Path(__file__).resolve().parents[2]
# The device tool's kinds (its README) and the most one of its calls may run.
DEVICE_KINDS = ("nvidia-h100-x1", "nvidia-h200")
DEVICE_CALL_LIMIT_S = 600


def runbook_first_call() -> dict[str, str]:
    """The ``key: value`` lines of the first code block in docs/gpu.md's runbook."""
    text = (REPO / "docs" / "gpu.md").read_text()
    runbook = text[text.index("\n## Runbook") :]
    block = re.search(r"```\n(.*?)```", runbook, flags=re.DOTALL)
    assert block, "docs/gpu.md: the runbook has no code block"
    fields = {}
    for line in filter(str.strip, block.group(1).splitlines()):
        key, _, value = line.strip().partition(":")
        fields[key] = value.strip()
    return fields


def test_the_first_call_fits_one_device_call() -> None:
    """Its timeout covers the check's setup, its whole budget and the stop of a run cut off at
    the end, so the report comes back; and it is within what one call may run."""
    call = runbook_first_call()
    assert set(call) == {"kind", "carry", "timeout_s", "command"}
    assert call["kind"] in DEVICE_KINDS
    assert json.loads(call["carry"]) == [".whl"]
    timeout_s = int(call["timeout_s"])
    needed = gc.SETUP_S + gc.SPEED_BUDGET_S + gc.STOP_GRACE_S["speed"]
    assert needed <= 8 * 60 < timeout_s <= DEVICE_CALL_LIMIT_S
    assert call["command"] == "bash bench/gpu/speed.sh"


@pytest.mark.long
@pytest.mark.slow
def test_the_first_call_runs_on_cpu(tmp_path: Path) -> None:
    """The runbook's command, as written, with --cpu-dry-run (and compile=false: compiling on
    2 shared cores takes minutes; the dry run tests the harness): the wheels step, every run
    of --speed, both ratios, the edges, and the report on stdout and in $OUT as the device tool
    brings it back."""
    command = runbook_first_call()["command"]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(
        f"{command} --cpu-dry-run --steps 8 compile=false",
        shell=True,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr  # the runs' own output is in the log
    report = Report.model_validate_json(p.stdout)
    assert Report.model_validate_json((tmp_path / "speed.json").read_text()) == report
    assert report.mode == "speed" and report.ok and report.dry_run
    assert list(report.runs) == list(gc.SPEED)  # nothing left out: the budget is ample here

    for c in report.baseline.comparisons:
        assert c.ratio is not None and c.not_measured is None, c
    assert [c.trainer_run for c in report.baseline.comparisons] == ["compile", "fill"]
    m = report.machine
    assert report.baseline.measured_on == f"{m.device_name}, torch {m.torch}, CUDA {m.cuda}"
    failing = ("compile_cudnn", "fill_cudnn")  # no cuDNN on CPU: below
    no_op = ("compile_graphs", "compile_autotune")  # compile=false: nothing to change
    for name, run in report.runs.items():
        if name in no_op:
            assert run.not_run == "compile=false: a compile mode changes nothing"
        elif name not in failing:
            assert run.exit_code == 0 and run.timed_windows == 3, (name, run.not_measured)

    edges = {e.run: e for e in report.edges}
    assert list(edges) == list(gc.EDGES)
    for name in ("compile_clip", "compile_fsdp", "fill_fsdp"):
        assert edges[name].gain is not None and edges[name].ratio is not None, name
    # strategy=fsdp beside ddp on the same shape: tokens/s and MFU of both, in the same report.
    for name in ("compile_fsdp", "fill_fsdp"):
        assert report.runs[name].tokens_per_s is not None
    # The attention switch took: cuDNN's kernel does not exist on CPU, so the run fails there.
    for name in ("compile_cudnn", "fill_cudnn"):
        assert edges[name].gain is None and "the run did not complete" in edges[name].not_measured
        assert "No viable backend for scaled_dot_product_attention" in report.runs[name].error
    log = (tmp_path / "speed.log").read_text()
    assert all(f"===== {name}: exit" in log for name in gc.SPEED if name not in no_op)
    assert "attention=cudnn" in log and "fused_clip=true" in log
