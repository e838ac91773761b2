"""A worker under torchrun whose group never forms ends itself (exit 138) instead of waiting out
the group's timeout: what a TrainJob pod restarted in place meets when its agent read a store
that was going away (trainer.distributed._join_watchdog)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
JOIN = (
    "from trainer import distributed; print('joining', flush=True); "
    "distributed.setup(device='cpu', backend='gloo')"
)


def _worker_env(port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(
        PYTHONPATH=str(REPO),
        WORLD_SIZE="2",
        RANK="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # as torchrun's agent sets it: its store, ours
        **extra,
    )
    return env


@pytest.fixture
def agent_store():
    """The master agent's TCPStore, where rank 0 never shows up."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    yield store.port
    del store


def test_a_group_that_never_forms_under_torchrun_exits_138(agent_store):
    """The watchdog ends it (its message, 138), not the group's own 600 s timeout (a traceback,
    exit 1); the run's 120 s limit only keeps a broken watchdog from hanging the test."""
    env = _worker_env(agent_store, TORCHELASTIC_RUN_ID="stale", DDPJOB_JOIN_TIMEOUT_S="3")
    r = subprocess.run(
        [sys.executable, "-c", JOIN], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 138, r.stderr[-2000:]
    assert "[rank 1] the process group did not form within 3 s" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_torchrun_the_wait_for_peers_is_not_cut_short(agent_store):
    """A PyTorchJob pod's worker waits for its peers (an image pull may take minutes): no
    watchdog, so it is still waiting 10 s after it started to join, where a watchdog would
    have ended it at 3 s."""
    env = _worker_env(agent_store, DDPJOB_JOIN_TIMEOUT_S="3")
    cmd = [sys.executable, "-c", JOIN]
    proc = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "joining\n"  # torch is imported: the join begins
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
