"""In-process tests of the trainer's parts: schedule, sampler resume, checkpoints, events, tasks."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from tests.trainer.conftest import REPO, base_env
from trainer.config import ConfigError
from trainer.contract import TORCHRUN_PIECE_PREFIX
from trainer.launch import needs_torchrun, take_trainjob_place, torchrun_argv
from trainer.parts.loader import MicroBatches, build_loader
from trainer.parts.optimizer import lr_factor
from trainer.tasks import load_task
from trainer.telemetry.events import Reporter


def test_lr_warmup_then_cosine_to_the_floor() -> None:
    f = [lr_factor(s, max_steps=100, warmup_steps=10, min_lr_ratio=0.1) for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup
    assert f[10] == pytest.approx(1.0) and f[100] == pytest.approx(0.1)  # cosine to the floor
    assert f[55] == pytest.approx(0.55)  # halfway down the cosine
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))  # monotone decay


def _ids(stream: MicroBatches, n: int) -> list[list[int]]:
    return [next(stream)[0].tolist() for _ in range(n)]


@pytest.mark.parametrize("rank", [0, 1])
def test_micro_batches_resume_mid_epoch_in_the_same_order(rank: int) -> None:
    data = TensorDataset(torch.arange(40))
    loader = build_loader(
        data, 4, rank=rank, world_size=2, seed=3, shuffle=True, num_workers=0, pin_memory=False
    )
    straight = MicroBatches(loader)
    want = _ids(straight, 12)  # 5 batches per epoch per rank: crosses two epoch boundaries
    first = MicroBatches(loader)
    got = _ids(first, 7)
    resumed = MicroBatches(loader, *first.position())
    assert first.position() == (1, 2)
    assert got + _ids(resumed, 5) == want
    assert want[0] != want[5]  # a new permutation each epoch


def test_a_batch_drawn_ahead_is_not_counted_until_it_is_handed_out() -> None:
    """The loop draws the next micro-batch during backward; a checkpoint taken then must resume
    at that batch, not after it."""
    data = TensorDataset(torch.arange(40))
    loader = build_loader(
        data, 4, rank=0, world_size=2, seed=3, shuffle=True, num_workers=0, pin_memory=False
    )
    want = _ids(MicroBatches(loader), 12)
    stream = MicroBatches(loader)
    got = []
    for _ in range(5):  # the whole first epoch, each batch drawn ahead of its use
        got += _ids(stream, 1)
        stream.prefetch()
    assert stream.position() == (0, 5)  # the sixth batch, already drawn, is not counted
    resumed = MicroBatches(loader, *stream.position())
    assert got + _ids(resumed, 7) == want
    assert got + _ids(stream, 7) == want  # and the stream itself goes on from the one ahead


def test_ranks_partition_each_epoch() -> None:
    data = TensorDataset(torch.arange(42))  # not divisible by world x batch: tails are dropped
    seen = []
    for rank in (0, 1):
        loader = build_loader(
            data, 4, rank=rank, world_size=2, seed=0, shuffle=True, num_workers=0, pin_memory=False
        )
        batches = [b[0].tolist() for b in loader]
        assert len(batches) == 5  # every rank the same number of full batches: no hang
        seen += [i for b in batches for i in b]
    assert len(seen) == len(set(seen)) == 40


def test_batch_larger_than_the_shard_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        build_loader(
            TensorDataset(torch.arange(10)),
            8,
            rank=0,
            world_size=2,
            seed=0,
            shuffle=True,
            num_workers=0,
            pin_memory=False,
        )


def test_events_are_single_line_json_with_nan_as_null(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a host without NVML, even on a GPU host
    out = io.StringIO()
    rep = Reporter(True, 10, "auto", None, stream=out)
    rep.event("train", step=1, loss=float("nan"), lr=1e-3, nested={"x": float("inf")})
    rep.say("a human line")
    Reporter(False, 10, "auto", None, stream=out).event("train", step=2)  # not rank 0: silent
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1] == "a human line"
    event = json.loads(lines[0])
    # No NVML: no GPU keys and no error.
    assert event == {"event": "train", "step": 1, "loss": None, "lr": 1e-3, "nested": {"x": None}}


def _nvml_gpu_count() -> int:
    """How many GPUs NVML itself reports here; 0 where there is no driver (a CPU host)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


def test_train_events_carry_one_nvml_reading_per_gpu_of_the_host() -> None:
    """Correct on both kinds of host: no `gpus` key without a driver, one reading per GPU with."""
    out = io.StringIO()
    Reporter(True, 10, "auto", None, stream=out).event("train", step=1)
    event = json.loads(out.getvalue())
    gpus = _nvml_gpu_count()
    if gpus == 0:
        assert "gpus" not in event
        return
    assert [g["index"] for g in event["gpus"]] == list(range(gpus))
    for g in event["gpus"]:
        assert 0 <= g["util_pct"] <= 100 and 0 <= g["mem_used_gib"] <= g["mem_total_gib"] > 0
        assert g["temp_c"] > 0 and g["power_w"] > 0


def test_relaunch_decision_and_command(monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "job-master-0")
    monkeypatch.setenv("MASTER_PORT", "23456")
    assert needs_torchrun()
    argv = torchrun_argv(["lr=1e-3"], "/tmp/logs")
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    # Each worker's streams teed through files, each piece named by the worker's global rank.
    assert argv[3:8] == ["--tee", "3", "--log-dir", "/tmp/logs", "--log-line-prefix-template"]
    assert argv[8] == TORCHRUN_PIECE_PREFIX == "\x1e${rank}\x1f"
    joined = " ".join(argv[9:])
    assert joined == (
        "--nnodes 2 --node-rank 1 --nproc-per-node 4 --master-addr job-master-0 "
        "--master-port 23456 -m trainer lr=1e-3"
    )
    monkeypatch.setenv("LOCAL_RANK", "0")  # a torchrun child never re-launches
    assert not needs_torchrun()
    monkeypatch.setenv("PET_NPROC_PER_NODE", "1")
    monkeypatch.delenv("LOCAL_RANK")
    assert not needs_torchrun()
    monkeypatch.setenv("PET_NPROC_PER_NODE", "gpu")  # torchrun resolves it: one per GPU
    assert needs_torchrun() and "--nproc-per-node gpu" in " ".join(torchrun_argv([], "/tmp"))


def test_a_trainjob_pod_of_one_process_takes_its_nodes_place_and_of_more_relaunches(
    monkeypatch,
) -> None:
    """A TrainJob pod has only PET_* (no MASTER_ADDR, RANK, WORLD_SIZE). With one process per
    pod, that process is its node's rank: it takes what a PyTorchJob pod of one process is
    given, the PET master's address and port, not a default. With more, it goes through
    torchrun, pointed at the same."""
    # take_trainjob_place writes os.environ: this test's own copy, which no later test sees.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    trainjob = {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29500",
    }
    for name, value in trainjob.items():
        monkeypatch.setenv(name, value)
    assert not needs_torchrun()
    take_trainjob_place()
    given = {n: os.environ.get(n) for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    assert given == {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "tj-node-0-0.tj",
        "MASTER_PORT": "29500",
    }
    assert "LOCAL_RANK" not in os.environ and not needs_torchrun()  # as a PyTorchJob's pod

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name)
    for nproc in ("2", "auto"):
        monkeypatch.setenv("PET_NPROC_PER_NODE", nproc)
        assert needs_torchrun()
        take_trainjob_place()  # nothing: torchrun gives each process its place
        assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
        assert " ".join(torchrun_argv(["lr=1e-3"], "/tmp/logs")[9:]) == (
            f"--nnodes 3 --node-rank 2 --nproc-per-node {nproc} --master-addr tj-node-0-0.tj "
            "--master-port 29500 -m trainer lr=1e-3"
        )
    monkeypatch.setenv("LOCAL_RANK", "0")  # torchrun's workers: no second relaunch
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert not needs_torchrun()


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: threads only add hand-off overhead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["vision", "lm", "examples.custom_task.my_task:build"])
def test_tasks_build_and_learn_a_little(name: str, one_thread) -> None:
    torch.manual_seed(0)
    task = load_task(name, {})
    model = task.build_model()
    train, _ = task.build_datasets()
    batch = next(iter(torch.utils.data.DataLoader(train, batch_size=16)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss, metrics = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert math.isfinite(losses[0]) and losses[-1] < 0.85 * losses[0]
    assert all(v.dim() == 0 for v in metrics.values())


def test_trainer_config_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; import trainer.config; "
        "import trainer.config as c; c.load_config(None, ['lr=1e-3'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_linear_lr_scaling_with_world_size() -> None:
    from trainer.config import build_config
    from trainer.parts.optimizer import build_optimizer

    model = torch.nn.Linear(4, 2)
    cfg = build_config({"lr": 1e-3, "scale_lr": True})
    opt = build_optimizer(model, cfg, world_size=4, device=torch.device("cpu"))
    assert [g["lr"] for g in opt.param_groups] == [4e-3, 4e-3]
    # Matrices decay, biases do not.
    assert [g["weight_decay"] for g in opt.param_groups] == [cfg.weight_decay, 0.0]
    plain = build_optimizer(model, build_config({"lr": 1e-3}), 4, torch.device("cpu"))
    assert plain.param_groups[0]["lr"] == 1e-3


def test_checkpoint_keys_have_no_compile_prefix(tmp_path: Path, one_rank_group) -> None:
    """A 1-rank gloo group, as a one-replica job has: the model is torch.compile(model) with no
    DDP around it (nobody to all-reduce with), and the checkpoint holds the plain model."""
    from tests.trainer.conftest import TEST_TASK
    from trainer.config import build_config
    from trainer.train import Trainer

    cfg = build_config(
        {"task": TEST_TASK, "compile": True, "ema_decay": 0.9, "checkpoint": {"dir": str(tmp_path)}}
    )
    env = one_rank_group
    trainer = Trainer(
        cfg, env, load_task(cfg.task, cfg.task_args), Reporter(False, 1, "never", None)
    )
    assert env.distributed and not trainer.ddp
    assert trainer.model is trainer.fwd_model
    assert type(trainer.model).__name__ == "OptimizedModule"
    assert trainer.step_flags is None and trainer.train_step.grads_to_none
    state = trainer.state_dict()
    assert sorted(state["model"]) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert sorted(state["ema"]["model"]) == sorted(state["model"])
    assert len(state["rng"]) == 1 and state["config"]["compile"] is True


def test_small_eval_set_gets_one_smaller_batch_per_rank() -> None:
    data = TensorDataset(torch.arange(10))
    loader = build_loader(
        data, 8, rank=1, world_size=2, seed=0, shuffle=False, num_workers=0, pin_memory=False
    )
    assert [b[0].tolist() for b in loader] == [[1, 3, 5, 7, 9]]
