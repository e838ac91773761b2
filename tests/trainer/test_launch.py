"""The launch contract: one command line under every launcher, rank 0 alone prints events."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import (
    CPU,
    REPO,
    Result,
    base_env,
    common_args,
    free_port,
    kubeflow_env,
    lines_by_rank,
    run,
    run_pods,
    torchrun_cmd,
    trainer_cmd,
    trainjob_envs,
)
from tests.trainer.tasks import CHATTER
from trainer.contract import GOODPUT
from trainer.health.ledger import RECORD


def _check_completed(r, world_size: int) -> None:
    assert r.rc == 0, r.stderr[-3000:]
    (start,) = r.of("start")  # exactly one: only rank 0 emits
    assert start["world_size"] == world_size
    assert start["config"]["max_steps"] == 8
    (done,) = r.of("done")
    assert done["reason"] == "completed" and done["step"] == 8
    train = r.of("train")
    assert [e["step"] for e in train] == [2, 4, 6, 8]
    keys = {
        "step",
        "max_steps",
        "loss",
        "lr",
        "grad_norm",
        "samples_per_s",
        "step_time_s",
        "data_wait",
        "epoch",
    }
    assert keys <= set(train[-1])
    assert r.of("checkpoint")[-1]["step"] == 8


def _check_pods(results, world_size: int) -> None:
    """The pods of one job: all exit 0, and only the pod holding rank 0 (the first) prints."""
    assert [r.rc for r in results] == [0] * len(results), [r.stderr[-2000:] for r in results]
    _check_completed(results[0], world_size)
    assert all(r.events == [] for r in results[1:])


@pytest.mark.slow
def test_standalone_without_a_progress_bar_when_stdout_is_not_a_tty(tmp_path) -> None:
    r = run(trainer_cmd(*common_args(tmp_path, progress="auto")))  # stdout is a pipe
    _check_completed(r, world_size=1)
    assert "train: " not in r.stderr and "it/s" not in r.stderr


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path) -> None:
    _check_completed(run(torchrun_cmd(2, *common_args(tmp_path))), world_size=2)


@pytest.mark.slow
def test_kubeflow_env_two_pods(tmp_path) -> None:
    """Two "pods" with RANK 0/1, WORLD_SIZE 2, MASTER_ADDR 127.0.0.1 and no LOCAL_RANK."""
    env0 = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    envs = [env0 | {"RANK": str(rank), "PET_NODE_RANK": str(rank)} for rank in (0, 1)]
    _check_pods(run_pods(envs, common_args(tmp_path), timeout=120), world_size=2)


@pytest.mark.slow
def test_kubeflow_pod_with_nproc_per_node_relaunches_under_torchrun(tmp_path) -> None:
    """One pod, PET_NPROC_PER_NODE=2: `python -m trainer` becomes two torchrun workers, whose
    ledger (trainer/health/ledger.py) counts the run from the pod's process start, not theirs."""
    before = time.time()
    env = kubeflow_env(nproc_per_node=2, world_size=2)
    proc = subprocess.Popen(
        trainer_cmd(*common_args(tmp_path)), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    after = time.time()
    out, err = proc.communicate(timeout=120)
    r = Result(proc.returncode, out, err)
    _check_completed(r, world_size=2)
    (this_run,) = r.of(GOODPUT)[-1]["runs"]
    assert before - 0.05 <= this_run["launched_at"] <= after + 0.05


@pytest.mark.slow
def test_standalone_ignores_no_env_and_writes_no_stray_files(tmp_path) -> None:
    r = run(trainer_cmd(*common_args(tmp_path, max_steps=2, log_every=1)), env=base_env())
    assert r.rc == 0
    files = sorted(str(p.relative_to(tmp_path / "ckpt")) for p in (tmp_path / "ckpt").rglob("*"))
    # The temp file was renamed, and nothing else is left behind (the location's probe either)
    # but the ledger's record (trainer/health/ledger.py).
    want = ["step_00000002", "step_00000002/manifest.json", "step_00000002/state.pt"]
    assert files == sorted([RECORD, *want])


@pytest.mark.slow
def test_progress_bar_and_tensorboard_when_asked(tmp_path) -> None:
    tb = tmp_path / "tb"
    r = run(trainer_cmd(*common_args(tmp_path, progress="always", tensorboard_dir=str(tb))))
    assert r.rc == 0, r.stderr[-2000:]
    assert "train: 100%" in r.stderr and "8/8" in r.stderr  # tqdm, on stderr
    assert list(tb.glob("events.out.tfevents.*"))
    # stdout stays machine-readable: every line is an event or a human line, never bar residue
    assert all(line.startswith("{") or "\r" not in line for line in r.stdout.splitlines())


@pytest.mark.slow
def test_custom_task_plugin_from_the_command_line(tmp_path) -> None:
    r = run(
        trainer_cmd(
            "task=examples.custom_task.my_task:build",
            "task_args.hidden=16",
            *(f"{k}={v}" for k, v in CPU.items()),
            "max_steps=4",
            "log_every=2",
            "progress=never",
            f"checkpoint.dir={tmp_path}",
        )
    )
    assert r.rc == 0, r.stderr[-2000:]
    assert r.of("start")[0]["config"]["task_args"] == {"hidden": 16}
    assert set(r.of("eval")[-1]["metrics"]) == {"loss", "mae"}


#: A line of tasks.py's chatter as it must reach a pod's output: named by the rank that printed
#: it, whole (its 40 pieces of 50 characters), once per training step.
CHATTER_LINE = re.compile(r"\[rank (\d+)\] CHATTER (\d+) (\d+)( x{50}){40}")


@pytest.mark.slow
def test_kubeflow_two_pods_of_two_processes_join_one_group_and_print_whole_lines(tmp_path) -> None:
    """nodes=2, nprocPerNode=2: each pod re-launches torchrun; 4 ranks join one group. Every
    rank prints a long line at every step unbuffered (one write per argument of print): each
    pod's output holds each of its two ranks' lines whole, after its global rank, and a run that
    succeeded prints no traceback."""
    env0 = kubeflow_env(nproc_per_node=2, world_size=4, rank=0)
    envs = [env0 | {"RANK": str(node), "PET_NODE_RANK": str(node)} for node in (0, 1)]
    args = [*common_args(tmp_path, batch_size=4), "task_args=" + json.dumps({"chatter": 40})]
    results = run_pods(envs, args)
    _check_pods(results, world_size=4)
    for node, r in enumerate(results):
        printed = [line for line in r.stdout.splitlines() if CHATTER in line]
        steps = lines_by_rank(printed, CHATTER_LINE)
        assert steps == {2 * node: list(range(1, 9)), 2 * node + 1: list(range(1, 9))}, steps
        assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]


@pytest.mark.slow
def test_elastic_pods_rendezvous_through_torchrun(tmp_path) -> None:
    """An elastic PyTorchJob has no master: the operator sets PET_RDZV_ENDPOINT (worker 0),
    PET_RDZV_BACKEND=c10d and PET_NNODES=min:max, and each pod must join via torchrun."""
    env = base_env(
        PET_RDZV_ENDPOINT=f"127.0.0.1:{free_port()}",
        PET_RDZV_BACKEND="c10d",
        PET_NNODES="2:2",
        PET_NPROC_PER_NODE="1",
        PET_MAX_RESTARTS="0",
    )
    r0, r1 = run_pods([env, env], common_args(tmp_path))
    assert [r0.rc, r1.rc] == [0, 0], r0.stderr[-2000:] + r1.stderr[-2000:]
    # Exactly one pod holds rank 0 and speaks; it saw a world of 2.
    starts = r0.of("start") + r1.of("start")
    assert len(starts) == 1 and starts[0]["world_size"] == 2


@pytest.mark.slow
def test_trainjob_two_pods_of_two_processes(tmp_path) -> None:
    """A Trainer v2 TrainJob: each pod gets only the five PET_ variables and no torchrun, so the
    trainer must start torchrun itself (no RANK or WORLD_SIZE anywhere) and join one group.
    numNodes=2, numProcPerNode=2: 4 ranks; node 1's pod holds ranks 2 and 3 (one process a
    pod: tests/trainer/test_progress_api.py and test_stale_rendezvous.py)."""
    envs = trainjob_envs(2, "2")
    _check_pods(run_pods(envs, common_args(tmp_path, batch_size=4)), world_size=4)


@pytest.mark.slow
def test_trainjob_nproc_auto_on_a_cpu_host(tmp_path) -> None:
    """numProcPerNode=auto reaches the pod as the word `auto`: torchrun's, one process per GPU
    or, with none, per CPU the pod may run on (pinned to two here, whatever the host has)."""
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    (env,) = trainjob_envs(1, "auto")
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU pod even on a GPU host, where auto counts GPUs
    r = run(trainer_cmd(*common_args(tmp_path)), env=env, cpus=cpus)
    _check_completed(r, world_size=len(cpus))


@pytest.mark.slow
def test_accelerate_launch_multi_gpu_two_processes(tmp_path) -> None:
    """`accelerate launch --multi_gpu` runs torchrun underneath: the same per-process env."""
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "trainer",
        *common_args(tmp_path),
    ]
    # HF_HOME: no accelerate config of the developer's (default_config.yaml) changes the launch.
    r = run(cmd, env=base_env(HF_HOME=str(tmp_path / "hf")))
    _check_completed(r, world_size=2)


def test_the_host_nodes_last_worker_leaves_after_the_other_agents_entered_the_exit_barrier(
    monkeypatch,
) -> None:
    """The agents' store (a real TCPStore) counts the agents in torchrun's exit barrier; the
    worker of local rank 0 on group rank 0 returns only once the other two nodes' agents are
    in it, so its own agent enters last. Any other worker returns at once."""
    import threading

    import torch.distributed as dist

    from trainer import distributed

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    agents = dist.PrefixStore("run-1", server)
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "run-1",
        "DDPJOB_EXIT_FILE": "/nonexistent/exit",  # under the pod's own static torchrun
        "GROUP_WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PET_RDZV_ENDPOINT", raising=False)
    monkeypatch.setenv("GROUP_RANK", "1")  # not the host's node: it leaves at once
    leaving = threading.Thread(target=distributed.leave_after_the_other_agents, daemon=True)
    leaving.start()
    leaving.join(timeout=distributed.EXIT_ORDER_S / 2)
    assert not leaving.is_alive()

    monkeypatch.setenv("GROUP_RANK", "0")
    leaving = threading.Thread(target=distributed.leave_after_the_other_agents, daemon=True)
    leaving.start()
    agents.add(distributed.EXIT_BARRIER_MEMBERS_KEY, 1)  # node 1's agent is in the barrier
    assert leaving.is_alive()  # node 2's is not yet: with one of two in, it cannot have left
    agents.add(distributed.EXIT_BARRIER_MEMBERS_KEY, 1)
    leaving.join(timeout=30)
    assert not leaving.is_alive()
