"""Leaving the job frees the process group: no gloo or TCPStore thread outlives ``teardown``.

Why it matters: a gloo worker thread still running while the interpreter shuts down can be
the one to drop the last reference to a tensor Python owns; it must then take the GIL, CPython
ends it with ``pthread_exit``, and the process dies of SIGABRT ("terminate called without an
active exception"), seen under CI's load about once in 150 starts (docs/benchmarks.md;
bench/stress_starts.py). The threads outlived teardown because DDP's constructor
imports a torch module whose default arguments capture the default group
(``trainer.distributed._import_before_init``). Counting the threads is deterministic where the
abort is a race: without the fix this fails every time, on torch 2.8 and 2.15.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, base_env, common_args, free_port

# One rank of a job: the real `train()` of `python -m trainer` (setup, Trainer.fit with DDP and
# its comm hook, the closing barrier, teardown), then the names of this process's threads.
_RANK = """
import json, os, sys
from trainer.__main__ import train
from trainer.config import load_config

def threads():
    tasks = "/proc/self/task"
    return sorted(open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks))

before = threads()
rc = train(load_config(None, sys.argv[1:]))
print(json.dumps({"rc": rc, "before": before, "after": threads()}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume-and-exit"])
def test_no_thread_outlives_teardown(tmp_path: Path, resume: bool) -> None:
    args = common_args(tmp_path, max_steps=4, **{"checkpoint.every_steps": 2})
    if resume:  # a retried pod of a finished job: load the final checkpoint, evaluate, leave
        first = _run_job(args)
        assert [r["rc"] for r in first] == [0, 0]
    results = _run_job(args)
    for rank, r in enumerate(results):
        assert r["rc"] == 0
        # Only the threads that were there before joining: gloo's workers and its tcp loop,
        # and rank 0's TCPStore server, are gone once teardown returns.
        assert r["after"] == r["before"], (
            f"rank {rank}: threads outlived teardown: {r['after']} (before setup: {r['before']}); "
            "something still references the process group (trainer.distributed.teardown)"
        )


def _run_job(args: list[str]) -> list[dict]:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, *args],
            cwd=REPO,
            env=base_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in (0, 1)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results
