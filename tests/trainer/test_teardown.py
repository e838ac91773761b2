"""Leaving the job frees the process group: nothing holds it when ``teardown`` destroys it, and no
gloo or TCPStore thread outlives ``teardown``.

Why it matters: a gloo worker thread still running while the interpreter shuts down can be the
one to drop the last reference to a tensor Python owns; it must then take the GIL, CPython ends
it with ``pthread_exit``, and the process dies of SIGABRT ("terminate called without an active
exception"; docs/benchmarks.md and bench/stress_starts.py say how often). What holds the group
keeps those threads: a torch module's default arguments when imported after the group exists
(``trainer.distributed._import_before_init``), the DDP module (its ``process_group``) while
anything still holds the trainer, and the frames of a traceback that went through the trainer.
``teardown`` says "the process group outlived destroy_process_group" when the group survives;
these runs must never say it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, base_env, common_args, free_port

# One rank of a job: the real `run()` of `python -m trainer` (setup, Trainer.fit with DDP and
# its comm hook, the closing barrier, teardown), then the names of this process's threads and
# whether destroy_process_group freed the group object (a weak reference to it, taken when setup
# made it, read as destroy_process_group returns: later, the trainer may be gone anyway).
_RANK = """
import json, os, sys, weakref
import torch.distributed as dist
from trainer import distributed
from trainer.train import run
from trainer.config import ConfigError, load_config

PF_EXITING = 0x4  # a task's flags (include/linux/sched.h): it is in do_exit

# This process's running threads by name (a task's stat: "tid (name) state ... flags ...").
# A thread that pthread_join has seen end stays listed until the kernel has reaped it (do_exit
# wakes the joiner before it unlists the thread), with PF_EXITING in its stat's flags (the 9th
# field): that one has ended.
def threads():
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{t}/stat").read()
        except OSError:  # reaped meanwhile
            continue
        name, rest = stat[stat.index("(") + 1 :].rsplit(")", 1)
        if not int(rest.split()[6]) & PF_EXITING:
            names.append(name)
    return sorted(names)

groups = []
setup = distributed.setup

def recording_setup(*args, **kwargs):
    env = setup(*args, **kwargs)
    groups.append(weakref.ref(dist.group.WORLD))
    return env

freed = []
destroy = dist.destroy_process_group

def recording_destroy(*args, **kwargs):
    destroy(*args, **kwargs)
    freed.append(groups[0]() is None)

distributed.setup, dist.destroy_process_group = recording_setup, recording_destroy
before = threads()
try:
    rc = run(load_config(None, sys.argv[1:]))
except ConfigError:
    rc = 2
print(json.dumps({"rc": rc, "before": before, "after": threads(), "freed": freed}))
"""


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_the_group_is_freed_and_no_thread_outlives_teardown(tmp_path: Path) -> None:
    """Three jobs in one checkpoint directory, each ending another way: trained to the end; a
    retried pod of the finished job (loads the final checkpoint, evaluates, leaves); and a job
    of another model, refused while resuming (a ConfigError raised with DDP already built)."""
    args = common_args(tmp_path, max_steps=4, **{"checkpoint.every_steps": 2})
    cases = [("fresh", args, 0), ("resume-and-exit", args, 0)]
    cases.append(("resume-refused", [*args, "task_args.hidden=32"], 2))
    for case, job_args, want_rc in cases:
        for rank, r in enumerate(_run_job(job_args)):
            where = f"{case}, rank {rank}"
            assert r["rc"] == want_rc, f"{where}: {r['stderr']}"
            assert "outlived destroy_process_group" not in r["stderr"], f"{where}: {r['stderr']}"
            assert r["freed"] == [True], f"{where}: something still references the process group"
            # Only the threads that were there before joining: gloo's workers and its tcp loop,
            # and rank 0's TCPStore server, are gone once teardown returns.
            assert r["after"] == r["before"], (
                f"{where}: threads outlived teardown: {r['after']} (before setup: "
                f"{r['before']}); something still references the process group"
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
        results.append({**json.loads(out.strip().splitlines()[-1]), "stderr": err})
    return results
