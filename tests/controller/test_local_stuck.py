"""`run --local` of a job whose rank 1 hangs: its console names the rank and where it is, as
`wait` does on a cluster (tests/e2e/test_stuck.py). The real trainer, 2 nodes on gloo, with the
tests' task (tests/trainer/tasks.py) hanging on rank 1 before the step's all-reduce."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path

import pytest

from tests.controller.conftest import PYTHON, REPO, minimal
from tests.trainer import tasks

pytestmark = pytest.mark.slow


def test_run_local_says_which_rank_hangs_and_where(tmp_path: Path, write_spec) -> None:
    hang_s, stuck_after_s = 12, 3
    spec = write_spec(
        minimal(
            nodes=2,
            env={"OMP_NUM_THREADS": "1"},
            trainer={
                "task": "tests.trainer.tasks:build",
                "task_args": {"hang_rank": 1, "hang_call": 5, "hang_s": hang_s},
                "device": "cpu",
                "max_steps": 8,
                "batch_size": 8,
                "log_every": 2,
                "watchdog": {"stuck_after_s": stuck_after_s},
                "checkpoint": {"dir": str(tmp_path / "ckpt")},
            },
        )
    )
    result = subprocess.run(
        [PYTHON, "-m", "controller", "run", str(spec), "--local", "--logs-dir", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    source, first = inspect.getsourcelines(tasks.hang_here)
    line = first + next(i for i, text in enumerate(source) if "time.sleep" in text)
    said = [x for x in result.stderr.splitlines() if x.startswith(("stuck:", "moving again"))]
    assert len(said) == 2, result.stderr[-3000:]
    verdict, moved = said
    assert verdict.startswith(
        "stuck: rank 1 is not in the gradient all-reduce that rank 0 waits in (no progress for "
    )
    assert verdict.endswith(f"rank 1 is at {Path(tasks.__file__).resolve()}:{line}, in hang_here "
                            f"(pod {os.uname().nodename})")  # fmt: skip
    assert moved.startswith("moving again after ")
    assert moved.endswith(": rank 1 was the one the others waited for")
