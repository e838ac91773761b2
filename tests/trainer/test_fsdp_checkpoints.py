"""Sharded checkpoints (strategy fsdp) on real gloo ranks: every rank writes its own shard, to a
directory and to S3; a resume is exact on the same world size and reshards onto another; a
kill -9 inside a save leaves the newest complete checkpoint; a damaged one is skipped; SIGTERM
checkpoints and exits 143; a checkpoint of the other strategy is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from torch.multiprocessing.spawn import ProcessException

from tests.trainer.conftest import (
    common_args,
    free_port,
    kubeflow_env,
    parse_events,
    spawn_ranks,
    start,
)
from tests.trainer.test_resume import _wait_for_event
from tests.trainer.trainers import alone, join, result, run_all, same, train, whole

LM = {"task": "lm", "task_args": {"n_layer": 2, "n_embd": 32, "block_size": 16, "dropout": 0.1}}


def _lm(ckpt: str, max_steps: int, **more: Any) -> dict[str, Any]:
    """The lm task sharded, with dropout (every rank's RNG stream matters to an exact resume),
    an EMA and two micro-batches a step, checkpointing every 4 steps into ``ckpt``."""
    return {
        **LM,
        "strategy": "fsdp",
        "ema_decay": 0.9,
        "max_steps": max_steps,
        "batch_size": 4,
        "grad_accum": 2,
        "lr": 3e-3,
        "log_every": 1,
        "eval_batches": 1,
        "checkpoint": {"dir": ckpt, "every_steps": 4, "keep": 10},
        **more,
    }


def _objects(ckpt: Path, step: int) -> list[str]:
    return sorted(p.name for p in (ckpt / f"step_{step:08d}").iterdir())


@pytest.mark.slow
def test_resume_is_exact_on_two_ranks_and_reshards_onto_one_and_four(
    tmp_path: Path, s3: str, moto
) -> None:
    """Two ranks train 8 steps straight into a directory, and into S3 8 steps preempted at
    step 3 and resumed: the same losses and weights, exactly. The step-3 checkpoint, written by
    two ranks, resumes one rank and four: each starts from exactly its weights and goes on down
    the curve."""
    straight, bucket = tmp_path / "straight", f"{s3}/job"
    runs = [
        ("straight", _lm(str(straight), 8), None),
        ("first", _lm(bucket, 8), 3),
        ("second", _lm(bucket, 8), None),
    ]
    spawn_ranks(run_all, (free_port(), 2, str(tmp_path), runs, moto.env))
    got = {name: result(tmp_path, name) for name, *_ in runs}

    # One shard per rank and DCP's index, beside rank 0's state and the manifest, in both places.
    per_rank = [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json", "state.pt"]
    assert _objects(straight, 4) == _objects(straight, 8) == per_rank
    manifest = json.loads((straight / "step_00000008" / "manifest.json").read_text())
    assert manifest["strategy"] == "fsdp" and manifest["world_size"] == 2
    from trainer.checkpoint.storage import open_store

    in_bucket = sorted(n for n in open_store(bucket).list() if n.startswith("step_00000003/"))
    assert in_bucket == [f"step_00000003/{n}" for n in per_rank]

    first, second, whole_run = got["first"], got["second"], got["straight"]
    assert second["resumed"] == 3 and first["resumed"] is None
    assert first["losses"] + second["losses"] == whole_run["losses"]  # bitwise: exact resume
    same(second["weights"], whole_run["weights"], "resumed vs straight", 0, 0)
    same(second["ema"], whole_run["ema"], "resumed EMA vs straight", 0, 0)

    # Onto four ranks and onto one (no process group), from the two-rank checkpoint in S3.
    four = tmp_path / "four"
    four.mkdir()
    from_3 = _lm(bucket, 5, resume=f"{bucket}/step_00000003")
    spawn_ranks(run_all, (free_port(), 4, str(four), [("resumed", from_3)], moto.env), 4)
    got["four"] = result(four, "resumed")
    got["one"] = train(from_3, alone())
    for name in ("four", "one"):
        run = got[name]
        assert run["resumed"] == 3, name
        same(run["start"], first["weights"], f"{name} ranks' start vs the checkpoint", 0, 0)
        # Other batches on other ranks: not the same losses, but the curve goes on from there,
        # nowhere near where a fresh model starts.
        assert run["losses"][0] == pytest.approx(whole_run["losses"][3], rel=0.1), name
        assert run["losses"][0] < whole_run["losses"][0] - 0.2, name


def _kill_inside_a_save(
    rank: int, port: int, out: str, kill_rank: int, kill_object: str, kill_step: int
) -> None:
    """Train on two ranks (steps 2, 4, 6 checkpointed, the whole weights kept at each) and
    SIGKILL rank ``kill_rank`` halfway through its write of ``kill_object`` of step
    ``kill_step``, as a preempted pod would die: its loop wherever it had got to."""
    from trainer.checkpoint import storage
    from trainer.train import Trainer

    writer = storage.LocalStore.writer

    def killing_writer(self, name: str):
        context = writer(self, name)
        if rank != kill_rank or name != f"step_{kill_step:08d}/{kill_object}":
            return context

        class Halfway:
            def __enter__(self):
                f = context.__enter__()
                real = f.write

                def write(data) -> int:
                    view = memoryview(data).cast("B")
                    real(view[: len(view) // 2])
                    f.sink.flush()
                    Path(out, "killed").write_text(name)
                    os.kill(os.getpid(), signal.SIGKILL)
                    return len(view)

                f.write = write
                return f

            def __exit__(self, *exc):
                return context.__exit__(*exc)

        return Halfway()

    storage.LocalStore.writer = killing_writer
    real_state = Trainer.state_dict

    def state_dict(trainer: Trainer):  # the weights each checkpoint must hold, kept on the side
        weights = whole(trainer.raw_model)
        if rank == 0:
            Path(out, f"weights_{trainer.step}.json").write_text(json.dumps(weights))
        return real_state(trainer)

    Trainer.state_dict = state_dict
    env = join(rank, 2, port)
    settings = _lm(f"{out}/ckpt", 8, checkpoint={"dir": f"{out}/ckpt", "every_steps": 2})
    train(settings, env)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_rank", "kill_object"),
    [
        (1, "__1_0.distcp"),  # rank 1 mid-shard: rank 0's shard may be complete, the step not
        (0, "manifest.json"),  # every shard and state.pt stored, the manifest torn
    ],
)
def test_a_kill_9_inside_a_sharded_save_leaves_the_newest_complete_checkpoint(
    tmp_path: Path, kill_rank: int, kill_object: str
) -> None:
    with pytest.raises(ProcessException):
        spawn_ranks(_kill_inside_a_save, (free_port(), str(tmp_path), kill_rank, kill_object, 4))
    ckpt = tmp_path / "ckpt"
    assert (tmp_path / "killed").read_text() == f"step_00000004/{kill_object}"  # it died there

    # The next pod: one rank, resuming from what the two left.
    run = train(_lm(str(ckpt), 3, checkpoint={"dir": str(ckpt), "every_steps": 0}), alone())
    assert run["resumed"] == 2 and run["skipped"] == []  # nothing torn was ever complete
    weights = json.loads((tmp_path / "weights_2.json").read_text())
    same(run["start"], weights, "the resumed weights vs step 2's", 0, 0)
    # What the dead step left went when the location was opened (or when rank 0's write failed).
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step_")) == [
        "step_00000002",
        "step_00000003",
    ]


@pytest.mark.slow
def test_a_damaged_shard_falls_back_and_the_other_strategy_is_refused(tmp_path: Path) -> None:
    """One rank alone (a sharded checkpoint is that too: one shard): the newest checkpoint with
    a torn shard is skipped for the one before; a ddp run refuses an fsdp checkpoint and an fsdp
    run a ddp one, each in one line, before training."""
    from trainer.config import ConfigError

    sharded, whole_dir = tmp_path / "fsdp", tmp_path / "ddp"
    train(_lm(str(sharded), 8), alone())
    shard = sharded / "step_00000008" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    run = train(_lm(str(sharded), 9, checkpoint={"dir": str(sharded), "every_steps": 0}), alone())
    assert run["resumed"] == 4
    (note,) = run["skipped"]
    assert note.startswith(f"{sharded}/step_00000008: unreadable (") and "__0_0.distcp" in note

    ddp = {**_lm(str(whole_dir), 2), "strategy": "ddp"}
    train(ddp, alone())
    with pytest.raises(ConfigError) as refused:
        train({**ddp, "checkpoint": {"dir": str(sharded)}, "max_steps": 12}, alone())
    assert refused.value.problems == [
        f"resume: {sharded}/step_00000009 is a strategy fsdp checkpoint of 1 shard; this run's "
        "strategy is ddp (got strategy=ddp). Resume it with strategy=fsdp, or start "
        "fresh: resume=never or another checkpoint.dir"
    ]
    with pytest.raises(ConfigError) as refused:
        train(_lm(str(whole_dir), 4), alone())
    assert refused.value.problems == [
        f"resume: {whole_dir}/step_00000002 is a strategy ddp checkpoint; this run's strategy "
        "is fsdp (got strategy=fsdp). Resume it with strategy=ddp, or start fresh: "
        "resume=never or another checkpoint.dir"
    ]


@pytest.mark.slow
def test_sigterm_writes_every_rank_s_shard_and_exits_143(tmp_path: Path) -> None:
    """Preemption of a two-process pod (torchrun re-launched by the trainer): the step in
    flight ends, every rank writes its shard, and the pod exits 143 once the checkpoint is
    complete."""
    args = common_args(
        tmp_path,
        max_steps=10_000,
        log_every=1,
        strategy="fsdp",
        **{"task_args.sleep_s": 0.05, "checkpoint.every_steps": 100_000},
    )
    proc = start(args, kubeflow_env(nproc_per_node=2, world_size=2))
    _wait_for_event(proc, lambda e: e["event"] == "train" and e["step"] >= 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    events = parse_events(out)
    (ckpt,) = [e for e in events if e["event"] == "checkpoint"]
    assert events[-1]["reason"] == "preempted" and ckpt["step"] == events[-1]["step"]
    assert ckpt["shards"] == 2
    manifest = json.loads((Path(ckpt["path"]) / "manifest.json").read_text())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "state.pt"} == set(manifest["objects"])
