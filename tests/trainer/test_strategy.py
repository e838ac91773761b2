"""Strategy fsdp's parts that need no training: what a model's blocks are, the parameter counts
the controller's estimate uses (against the real models), and the start's check that every rank
writes its shards where the others can read them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.trainer.conftest import free_port, spawn_ranks
from trainer.parts.blocks import blocks_of
from trainer.sizing import parameter_count
from trainer.tasks import load_task


def test_the_blocks_are_the_task_s_else_the_largest_module_list_else_the_children() -> None:
    lm = load_task("lm", {"n_layer": 3})
    model = lm.build_model()
    assert blocks_of(lm, model) == list(model.blocks)

    class Two(nn.Module):  # a small list of heads and a larger one of layers
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList(nn.Linear(4, 2) for _ in range(2))
            self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))

    two = Two()
    assert blocks_of(object(), two) == list(two.layers)
    flat = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert blocks_of(object(), flat) == [flat[0], flat[2]]  # children with parameters


@pytest.mark.parametrize(
    ("task", "args"),
    [
        ("lm", {}),
        ("lm", {"n_layer": 3, "n_embd": 48, "n_head": 6, "block_size": 32, "bias": True}),
        ("vision", {}),
        ("vision", {"num_classes": 7, "width": 18}),
    ],
)
def test_the_estimate_counts_a_built_in_model_s_parameters(task: str, args: dict) -> None:
    model = load_task(task, args).build_model()
    assert parameter_count(task, args) == sum(p.numel() for p in model.parameters())


def test_a_task_of_one_s_own_is_not_counted() -> None:
    assert parameter_count("tests.trainer.tasks:build", {}) is None
    assert parameter_count("lm", {"colour": 3}) is None  # arguments the task refuses


def _open_apart(rank: int, port: int, base: str) -> None:
    """Rank r's checkpoint.dir is its own directory, as on pods that each mount a volume of
    their own: the start refuses it on every rank."""
    from tests.trainer.trainers import join
    from trainer import distributed
    from trainer.checkpoint.sharded import ShardedCheckpointManager
    from trainer.config import ConfigError

    join(rank, 2, port)
    try:
        with pytest.raises(ConfigError) as refused:
            ShardedCheckpointManager(f"{base}/rank{rank}", keep=1, is_main=rank == 0)
        Path(base, f"said{rank}").write_text("\n".join(refused.value.problems))
    finally:
        distributed.teardown()


@pytest.mark.slow
def test_a_checkpoint_dir_that_is_not_one_place_for_all_ranks_is_refused_on_every_rank(
    tmp_path: Path,
) -> None:
    spawn_ranks(_open_apart, (free_port(), str(tmp_path)))
    expected = (
        f"checkpoint.dir: rank 1 does not see what rank 0 writes in {tmp_path}/rank1 (got "
        "strategy=fsdp, where every rank writes its shard there and reads the others' to "
        "resume). Use s3://..., or a volume every pod mounts (ReadWriteMany)"
    )
    assert (tmp_path / "said0").read_text() == (tmp_path / "said1").read_text() == expected


def test_fsdp_on_one_process_writes_a_one_shard_checkpoint(tmp_path: Path) -> None:
    """Without a process group nothing is sharded (there is no one to share with), and the
    checkpoint is still a sharded one, which any world size resumes."""
    from tests.trainer.trainers import alone, train

    settings = {
        "task": "tests.trainer.tasks:build",
        "strategy": "fsdp",
        "max_steps": 2,
        "batch_size": 8,
        "checkpoint": {"dir": str(tmp_path)},
    }
    run = train(settings, alone())
    assert not run["sharded"]
    assert sorted(p.name for p in (tmp_path / "step_00000002").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "manifest.json",
        "state.pt",
    ]
    assert torch.load(tmp_path / "step_00000002" / "state.pt")["sharded"] == ["model", "optimizer"]


def test_fsdp_on_a_one_rank_group_shards_and_compiles_each_block(one_rank_group, tmp_path):
    """A process group of one rank (a one-replica job) is sharded all the same; with compile
    each block is compiled on its own before it is sharded; the root, whose forward runs between
    the blocks, is not compiled."""
    from torch.distributed.fsdp import FSDPModule

    from trainer.config import build_config
    from trainer.telemetry.events import Reporter
    from trainer.train import Trainer

    cfg = build_config(
        {
            "task": "lm",
            "task_args": {"n_layer": 2, "n_embd": 32, "block_size": 16},
            "strategy": "fsdp",
            "compile": True,
            "checkpoint": {"dir": str(tmp_path)},
        }
    )
    trainer = Trainer(
        cfg, one_rank_group, load_task(cfg.task, cfg.task_args), Reporter(False, 1, "never", None)
    )
    model = trainer.raw_model
    assert isinstance(model, FSDPModule) and trainer.model is trainer.fwd_model is model
    assert all(isinstance(b, FSDPModule) for b in model.blocks)
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert getattr(model, "_compiled_call_impl", None) is None
