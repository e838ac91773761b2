"""Resume without a shared filesystem: rank 0 alone reads, the others receive the state by
broadcast (trainer/checkpoint/broadcast.py), in chunks, never as one pickled object. Real gloo
ranks."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    REPO,
    checkpoints,
    common_args,
    free_port,
    kubeflow_env,
    read_checkpoint,
    run_pods,
    spawn_ranks,
)

CHUNK = 1000  # bytes: tensors straddle chunks, chunks hold several tensors


def _expected() -> dict:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(40, 30, generator=g)  # 4,800 bytes: five chunks, the last shared
    return {
        "model": {"w": big, "wt": big.t(), "half": torch.randn(7, generator=g).bfloat16()},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]},
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 5),
        "ids": torch.arange(300, dtype=torch.int64),
        "rng": [{"python": (3, (1, 2), None), "torch": torch.arange(816, dtype=torch.uint8)}],
        "step": 12,
        "config": {"lr": 0.1, "name": "x"},
    }


def _worker(rank: int, port: int, out: str) -> None:
    import os

    from trainer import distributed as distributed_
    from trainer.checkpoint.broadcast import broadcast_state

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        pickled = []
        real = distributed_.broadcast_object

        def measured(obj):
            pickled.append(len(pickle.dumps(obj)))
            return real(obj)

        distributed_.broadcast_object = measured
        got = broadcast_state(_expected() if rank == 0 else None, chunk_bytes=CHUNK)
        want = _expected()
        assert got.keys() == want.keys()
        for key in ("model", "optimizer"):
            for k, v in want[key].items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(got[key][k], v) and got[key][k].dtype == v.dtype, k
        assert got["optimizer"]["param_groups"] == [{"lr": 0.1}]
        assert torch.equal(got["optimizer"]["state"][0]["step"], torch.tensor(3.0))
        assert torch.equal(got["mask"], want["mask"]) and got["empty"].shape == (0, 5)
        assert torch.equal(got["ids"], want["ids"])
        assert got["rng"][0]["python"] == (3, (1, 2), None)
        assert torch.equal(got["rng"][0]["torch"], want["rng"][0]["torch"])
        assert got["step"] == 12 and got["config"] == {"lr": 0.1, "name": "x"}
        Path(out, f"rank{rank}.json").write_text(json.dumps({"pickled": pickled}))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_every_rank_gets_rank_0s_state_and_only_its_skeleton_is_pickled(tmp_path: Path) -> None:
    spawn_ranks(_worker, (free_port(), str(tmp_path)))
    tensor_bytes = sum(
        t.numel() * t.element_size()
        for t in (_expected()["model"]["w"], _expected()["ids"], _expected()["rng"][0]["torch"])
    )
    for rank in (0, 1):
        (pickled,) = json.loads((tmp_path / f"rank{rank}.json").read_text())["pickled"]
        assert pickled < tensor_bytes / 4  # the skeleton: shapes and dtypes, not the data


@pytest.mark.slow
def test_a_resume_needs_the_checkpoint_only_where_rank_0_runs(tmp_path: Path) -> None:
    """Two pods that share no disk (a relative checkpoint.dir, each pod its own working
    directory): rank 0's pod has the checkpoints, rank 1's never sees them. With the step-6
    checkpoint gone, both resume from step 4 and end bit for bit where they ended before."""
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    for pod in pods:
        pod.mkdir()

    def job() -> list:
        master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
        worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
        args = common_args(Path("."), max_steps=6, **{"checkpoint.every_steps": 2})
        envs = [{**env, "PYTHONPATH": str(REPO)} for env in (master, worker)]
        return run_pods(envs, args, timeout=180, cwds=pods)

    first = job()
    assert [r.rc for r in first] == [0, 0], first[1].stderr[-2000:]
    assert [p.name for p in checkpoints(pods[0] / "ckpt")][-1] == "step_00000006"
    straight = read_checkpoint(pods[0] / "ckpt" / "step_00000006")
    shutil.rmtree(pods[0] / "ckpt" / "step_00000006")

    resumed = job()
    assert [r.rc for r in resumed] == [0, 0], resumed[1].stderr[-3000:]
    (note,) = resumed[0].of("resume")
    assert note["step"] == 4 and note["path"] == str(pods[0] / "ckpt" / "step_00000004")
    assert [e["step"] for e in resumed[0].of("train")] == [6]
    assert not (pods[1] / "ckpt").exists()  # rank 1 never had the checkpoints, nor made any
    again = read_checkpoint(pods[0] / "ckpt" / "step_00000006")
    for k in straight["model"]:  # rank 1 trained on from the state rank 0 sent, or these differ
        assert torch.equal(straight["model"][k], again["model"][k]), k


@pytest.mark.slow
def test_a_named_resume_starts_on_every_pod_though_only_rank_0s_has_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A named checkpoint on a ``rank0_only`` volume: two pods of two processes each (the pod's
    own torchrun), ``resume`` a path that only rank 0's pod has (relative to its working
    directory). The worker's pod starts, and all four ranks resume from what rank 0 read."""
    pods = [tmp_path / "pod0", tmp_path / "pod1"]
    for pod in pods:
        pod.mkdir()
    first = run_pods(
        [{**kubeflow_env(nproc_per_node=1, world_size=1), "PYTHONPATH": str(REPO)}],
        common_args(Path("."), max_steps=4, **{"checkpoint.dir": "saved"}),
        cwds=pods[:1],
    )
    assert first[0].rc == 0, first[0].stderr[-2000:]
    named = "saved/step_00000004"
    assert (pods[0] / named / "manifest.json").exists() and not (pods[1] / "saved").exists()

    master = kubeflow_env(nproc_per_node=2, world_size=4, rank=0)
    worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
    envs = [{**env, "PYTHONPATH": str(REPO)} for env in (master, worker)]
    args = common_args(Path("."), max_steps=6, batch_size=4, resume=named)
    results = run_pods(envs, args, timeout=240, cwds=pods)
    assert [r.rc for r in results] == [0, 0], results[1].stderr[-3000:]
    (note,) = results[0].of("resume")
    assert note["step"] == 4 and note["path"] == named
    assert [e["step"] for e in results[0].of("train")] == [6]
    assert results[0].of("start")[0]["world_size"] == 4
