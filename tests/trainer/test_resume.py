"""Exact resume after kill -9, preemption by SIGTERM, and falling back past a torn checkpoint."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.trainer.conftest import (
    REPO,
    base_env,
    checkpoints,
    common_args,
    kubeflow_env,
    parse_events,
    read_checkpoint,
    run,
    start,
    torchrun_cmd,
    trainer_cmd,
)
from trainer.contract import GOODPUT, parse_event
from trainer.health.ledger import RECORD


def _records(record_dir: Path, rank: int, field: str = "ids") -> list:
    lines = (record_dir / f"rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line)[field] for line in lines]


def _wait_for_event(proc: subprocess.Popen, pred, timeout: float = 120) -> list[dict]:
    """Read the child's stdout until an event matches ``pred``; return the events seen."""
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        if (event := parse_event(line)) is not None:
            seen.append(event)
            if pred(seen[-1]):
                return seen
        assert time.monotonic() < deadline, "timed out waiting for an event"
    raise AssertionError(f"process ended first; events: {seen}")


@pytest.mark.long
@pytest.mark.slow
def test_kill_9_after_checkpoint_then_resume_is_bitwise_exact(tmp_path: Path) -> None:
    """Also what ``deterministic`` and ``num_workers`` do to this run: deterministic algorithms
    and cuBLAS's fixed workspace inside every rank's step (the environment sets no workspace),
    and two DataLoader workers a rank loading every batch, resumed mid-epoch (8 steps an epoch)
    onto exactly the batches of the straight run."""
    n, accum = 6, 2
    env = base_env()
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)

    # Dropout makes every rank's RNG stream matter; the sleep keeps the killed run mid-way.
    def args(name: str, **kw) -> list[str]:
        return common_args(
            tmp_path / name,
            max_steps=2 * n,
            grad_accum=accum,
            log_every=1,
            deterministic=True,
            num_workers=2,
            **{
                "checkpoint.every_steps": n,
                "task_args.dropout": 0.3,
                "eval_every": 4,
                "task_args.record_dir": str(tmp_path / name / "rec"),
            },
            **kw,
        )

    straight = run(torchrun_cmd(2, *args("straight")), env=env)
    assert straight.rc == 0, straight.stderr[-2000:]

    # Run to the step-n checkpoint, then kill -9 every process of the job, launcher included
    # (torchrun starts each worker in its own session, so walk the process tree).
    proc = subprocess.Popen(
        torchrun_cmd(2, *args("resumed", **{"task_args.sleep_s": 0.2})),
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    saved: list[int] = []

    def past_the_checkpoint(e: dict) -> bool:  # two steps past the step-n checkpoint
        saved.extend([e["step"]] if e["event"] == "checkpoint" else [])
        return bool(saved) and e["event"] == "train" and e["step"] >= n + 2

    try:
        seen = _wait_for_event(proc, past_the_checkpoint)
    finally:
        job = psutil.Process(proc.pid)
        for p in [*job.children(recursive=True), job]:
            p.send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=60)
    assert saved == [n]
    # The kill landed mid-run, or the resume below would prove nothing: the launcher died of
    # SIGKILL (not an exit of its own), only the step-n checkpoint exists, and no rank got
    # through all of its micro-batches.
    assert proc.returncode == -signal.SIGKILL
    ckpts = [p.name for p in checkpoints(tmp_path / "resumed" / "ckpt")]
    assert ckpts == [f"step_{n:08d}"]
    for rank in (0, 1):
        assert n * accum <= len(_records(tmp_path / "resumed" / "rec", rank)) < 2 * n * accum

    # What the killed run wrote beside its checkpoints (trainer/health/ledger.py), before the
    # resumed run rewrites it.
    record = json.loads((tmp_path / "resumed" / "ckpt" / RECORD).read_text())["runs"][-1]

    resumed = run(torchrun_cmd(2, *args("resumed")), env=env)
    assert resumed.rc == 0, resumed.stderr[-8000:]  # the rank's own error is above torchrun's
    (note,) = resumed.of("resume")
    assert note["step"] == n and note["path"].endswith(f"step_{n:08d}")
    _check_the_ledger(record, seen, resumed, n, killed_at)

    final = checkpoints(tmp_path / "straight" / "ckpt")[-1]
    a = read_checkpoint(final)
    b = read_checkpoint(tmp_path / "resumed" / "ckpt" / final.name)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k  # bitwise, not allclose
    # Every rank's RNG is in the checkpoint, and they differ: each rank seeds with seed + rank.
    assert len(a["rng"]) == 2 and not torch.equal(a["rng"][0]["torch"], a["rng"][1]["torch"])
    assert torch.equal(a["optimizer"]["state"][0]["exp_avg"], b["optimizer"]["state"][0]["exp_avg"])
    assert [e["loss"] for e in straight.of("train")][n:] == [e["loss"] for e in resumed.of("train")]

    # Same samples in the same order on every rank: the killed run's first n steps plus the
    # resumed run's steps (the killed run may have got a little past n; those are replayed).
    for rank in (0, 1):
        want = _records(tmp_path / "straight" / "rec", rank)
        got = _records(tmp_path / "resumed" / "rec", rank)
        first, rest = got[: n * accum], got[-(n * accum) :]
        assert len(want) == 2 * n * accum
        assert first + rest == want
    assert resumed.of("train")[-1]["epoch"] == 1  # the resumed part crossed into the next epoch
    for rank in (0, 1):
        rec = tmp_path / "resumed" / "rec"
        # Every batch from a DataLoader worker (-1 would be the main process), both serving.
        assert {w for ws in _records(rec, rank, "workers") for w in ws} == {0, 1}
        assert set(_records(rec, rank, "deterministic")) == {True}
        assert set(_records(rec, rank, "cublas_workspace")) == {":4096:8"}


def _check_the_ledger(record: dict, killed: list[dict], resumed, n: int, killed_at: float) -> None:
    """The ledger (trainer/health/ledger.py) of a run killed past its step-n checkpoint and resumed:
    the resumed run names the steps the killed one trained again and the time it lost, checked
    against what the killed run printed and wrote beside its checkpoints (``record``)."""

    def _sums_to_its_time(v: dict) -> None:
        parts = sum(v[k] for k in ("startup_s", "productive_s", "stall_s", "eval_s", "lost_s"))
        assert parts + v["other_s"] == pytest.approx(v["ended_at"] - v["launched_at"], abs=0.01)

    printed = [e["step"] for e in killed if e["event"] == "train"]
    # The record is rewritten in the background after each window (and a heartbeat): it holds
    # the last window printed, or the one before if the kill came first, or a step after it.
    assert record["last_step"] >= printed[-1] - 1

    goodput = resumed.of(GOODPUT)
    killed_view, this = goodput[0]["runs"]  # the killed run, settled at the start
    assert killed_view["id"] == record["id"] and this["start_step"] == n
    assert killed_view["kept_step"] == n
    assert killed_view["lost_steps"] == record["last_step"] - n > 0
    assert killed_view["eval_s"] > 0  # its evaluation at step 4, before the checkpoint
    # Its lost time: from the end of step n's save (after step n's goodput event) to the last
    # moment its record saw it, after the steps it trained for nothing (each >= sleep_s).
    at_n = next(g for g in killed if g["event"] == GOODPUT and g["runs"][-1]["last_step"] == n)
    assert killed_view["lost_steps"] * 0.2 <= killed_view["lost_s"] <= killed_at - at_n["at"]
    assert killed_view["ended_at"] <= killed_at
    _sums_to_its_time(killed_view)

    *_, done = goodput
    assert [r["id"] for r in done["runs"]][:1] == [record["id"]] and len(done["runs"]) == 2
    last = done["runs"][-1]
    assert (last["start_step"], last["last_step"], last["end"]) == (n, 2 * n, "completed")
    assert last["lost_steps"] == 0 and last["lost_s"] == 0 and last["launched_at"] > killed_at
    assert last["productive_s"] > 0 and last["eval_s"] > 0
    _sums_to_its_time(last)


@pytest.mark.long
@pytest.mark.slow
def test_sigterm_checkpoints_exits_143_and_rerun_resumes(tmp_path: Path) -> None:
    """Preemption in a Kubeflow pod with nprocPerNode=2 (the trainer re-launched torchrun)."""
    # More paced steps than the run lives for: the SIGTERM comes whenever the test gets to it.
    args = common_args(
        tmp_path,
        max_steps=10_000,
        log_every=1,
        **{"task_args.sleep_s": 0.05, "checkpoint.every_steps": 100_000},
    )
    env = kubeflow_env(nproc_per_node=2, world_size=2)
    proc = start(args, env)
    _wait_for_event(proc, lambda e: e["event"] == "train" and e["step"] >= 3)
    proc.send_signal(signal.SIGTERM)  # what the kubelet does to the pod's main process
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    events = parse_events(out)
    (ckpt,) = [e for e in events if e["event"] == "checkpoint"]
    done = events[-1]
    assert done["event"] == "done" and done["reason"] == "preempted"
    assert 3 <= ckpt["step"] == done["step"] < 10_000
    assert (Path(ckpt["path"]) / "manifest.json").is_file()

    # log_every=1: one train event per step, whatever the parity of the preempted step (with
    # log_every=2 an odd step would also log the step after it).
    rerun_args = common_args(tmp_path, max_steps=ckpt["step"] + 2, log_every=1)
    rerun = run(trainer_cmd(*rerun_args), env=env)
    assert rerun.rc == 0, rerun.stderr[-2000:]
    assert rerun.of("resume")[0]["step"] == ckpt["step"]
    assert [e["step"] for e in rerun.of("train")] == [ckpt["step"] + 1, ckpt["step"] + 2]


@pytest.mark.slow
def test_sigterm_standalone_exits_143(tmp_path: Path) -> None:
    args = common_args(tmp_path, max_steps=10_000, log_every=1, **{"task_args.sleep_s": 0.02})
    proc = start(args, base_env())
    _wait_for_event(proc, lambda e: e["event"] == "train")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert parse_events(out)[-1]["reason"] == "preempted"
    assert len(checkpoints(tmp_path / "ckpt")) == 1


@pytest.mark.slow
def test_truncated_newest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    first = run(trainer_cmd(*common_args(tmp_path, max_steps=6, **{"checkpoint.every_steps": 3})))
    assert first.rc == 0
    newest = tmp_path / "ckpt" / "step_00000006" / "state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # damaged on disk

    again = run(trainer_cmd(*common_args(tmp_path, max_steps=8, **{"checkpoint.every_steps": 3})))
    assert again.rc == 0, again.stderr[-2000:]
    (note,) = again.of("resume")
    assert note["step"] == 3 and note["path"].endswith("step_00000003")
    assert "step_00000006: unreadable (ValueError: state.pt has" in note["skipped"][0]
    assert "step_00000006: unreadable" in again.stderr  # and a human says so too
    assert again.of("train")[0]["step"] == 4


@pytest.mark.slow
def test_resume_never_starts_fresh_and_keep_prunes(tmp_path: Path) -> None:
    r = run(
        trainer_cmd(
            *common_args(
                tmp_path, max_steps=8, **{"checkpoint.every_steps": 1, "checkpoint.keep": 2}
            )
        )
    )
    assert r.rc == 0
    assert [p.name for p in checkpoints(tmp_path / "ckpt")] == ["step_00000007", "step_00000008"]
    fresh = run(trainer_cmd(*common_args(tmp_path, max_steps=2, resume="never")))
    assert fresh.rc == 0 and fresh.of("resume") == []
    assert fresh.of("start")[0]["step"] == 0


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Resuming a checkpoint written for another model (other task_args, or an lm checkpoint
    from before issue 22's model) is the user's mistake: one line naming the file, no
    traceback, and the checkpoint left in place."""
    first = run(trainer_cmd(*common_args(tmp_path, max_steps=2)))
    assert first.rc == 0, first.stderr[-2000:]
    wider = run(trainer_cmd(*common_args(tmp_path, max_steps=4, **{"task_args.hidden": 32})))
    assert wider.rc == 2
    assert "Traceback" not in wider.stderr
    (line,) = [x for x in wider.stderr.splitlines() if x.startswith("resume:")]
    assert "step_00000002 holds a model of another shape or version" in line
    assert "resume=never" in line
    assert (tmp_path / "ckpt" / "step_00000002" / "manifest.json").exists()


@pytest.mark.slow
def test_unreadable_explicit_resume_path_is_exit_2_on_every_rank(tmp_path: Path) -> None:
    bad = tmp_path / "nope.pt"
    bad.write_bytes(b"not a checkpoint")
    r = run(torchrun_cmd(2, *common_args(tmp_path, resume=str(bad))), timeout=120)
    assert r.rc != 0
    # Every rank learns the mistake from rank 0 (nobody hangs), and one process of the node says
    # it once (local rank 0: the ranks of a node all find the same one), with no traceback of ours.
    assert r.stderr.count("resume: cannot load UnpicklingError") == 1
    assert "exitcode  : 2" in r.stderr, r.stderr[-2000:]
    assert "trainer/checkpoint/manager.py" not in r.stderr


@pytest.mark.slow
def test_a_lost_peer_exits_138_retryable_not_1(tmp_path: Path) -> None:
    """kill -9 of one pod's trainer: the survivor's collective fails, and it must exit with a
    code the operator retries under restartPolicy ExitCode (138), not a permanent 1."""
    args = common_args(tmp_path, max_steps=10_000, log_every=1, **{"task_args.sleep_s": 0.02})
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
    procs = [start(args, env) for env in (master, worker)]
    _wait_for_event(procs[0], lambda e: e["event"] == "train" and e["step"] >= 3)
    procs[1].kill()
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=30)
    assert procs[0].returncode == 138, err[-3000:]
    assert "lost a peer" in err and "Traceback" not in err
    assert parse_events(out)[-1]["reason"] == "peer_lost"


#: A peer that joins the job's process group as rank 1 and is gone at once, before the job's
#: first collective.
_JOINS_AND_DIES = (
    "import os, torch.distributed as dist; dist.init_process_group('gloo'); os._exit(0)"
)


@pytest.mark.slow
def test_a_peer_lost_in_the_jobs_first_collective_exits_138(tmp_path: Path) -> None:
    """Rank 0 learns where every rank runs in the job's first collective, before the trainer
    is built: a peer gone there (a restarted pod that joined a group whose other end was
    leaving) is a lost peer, retried, not a failure of the job."""
    args = common_args(tmp_path, max_steps=10)
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
    rank0 = start(args, master)
    peer = subprocess.run(
        [sys.executable, "-c", _JOINS_AND_DIES], cwd=REPO, env=worker, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert peer.returncode == 0, peer.stderr[-2000:]
    out, err = rank0.communicate(timeout=120)
    assert rank0.returncode == 138, err[-3000:]
    assert "lost a peer" in err and "Traceback" not in err
    assert parse_events(out)[-1]["reason"] == "peer_lost"


@pytest.mark.slow
def test_a_lost_peer_under_the_torchrun_relaunch_still_exits_138(tmp_path: Path) -> None:
    """torchrun reports any worker failure as 1; the relaunching pod must still report 138."""
    args = common_args(tmp_path, max_steps=10_000, log_every=1, **{"task_args.sleep_s": 0.02})
    proc = start(args, kubeflow_env(nproc_per_node=2, world_size=2))
    _wait_for_event(proc, lambda e: e["event"] == "train" and e["step"] >= 3)
    trainers = [
        c
        for c in psutil.Process(proc.pid).children(recursive=True)
        if "trainer" in c.cmdline() and "torch.distributed.run" not in c.cmdline()
    ]
    assert len(trainers) == 2, trainers
    max(trainers, key=lambda c: c.pid).kill()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 138, err[-3000:]


def _killpoints(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.trainer.killpoints", *args]


def _read_kill_log(path: Path) -> tuple[list[tuple[int, int, str, str]], dict[int, str]]:
    """The points a run passed, as (n, step, kind, object), and each saved step's fingerprint."""
    points, states = [], {}
    for line in path.read_text().splitlines():
        word, *fields = line.split()
        if word == "point":
            points.append((int(fields[0]), int(fields[1]), fields[2], fields[3]))
        else:
            states[int(fields[0])] = fields[1]
    return points, states


#: The point after which a step's checkpoint is complete: its manifest renamed into place.
COMPLETE = ("replaced", "manifest.json")


@pytest.mark.slow
def test_sigkill_anywhere_inside_a_checkpoint_write_leaves_the_newest_complete_one(
    tmp_path: Path,
) -> None:
    """The checkpoint promise, tested with real kills: a trainer SIGKILLed at 24 random points
    inside its background checkpoint writes (mid-chunk of the state or the manifest, before and
    after fsync, around each rename, while pruning), its training thread wherever it had got
    to; then a fresh process opens each directory as a restarted pod would. It must load the
    newest checkpoint whose manifest was written, intact, the kill must have lost none of the
    last ``keep`` good ones, and the restart leaves nothing else behind."""
    keep, kills = 2, 24
    seed = int(os.environ.get("DDPJOB_KILL_SEED", time.time_ns() % 2**32))  # replay a failure

    extra = {"checkpoint.every_steps": 1, "checkpoint.keep": keep, "eval_batches": 1}
    trainer_args = common_args(tmp_path, max_steps=5, log_every=100, **extra)

    # A full run counts the points (identical in every run: same data, same state sizes, and
    # one write at a time, in the writer thread).
    dry = run(_killpoints("run", str(tmp_path), "0", "--", *trainer_args))
    assert dry.rc == 0 and json.loads(dry.stdout) == {"0": 0}, dry.stderr[-2000:]
    plan, _ = _read_kill_log(tmp_path / "0" / "log")
    pools: dict[str, list[int]] = {}
    for n, _step, kind, name in plan:
        # Each kind of point on each kind of object is a pool (a step's directory is one).
        pools.setdefault(f"{kind} {name if name.endswith(('.pt', '.json')) else ''}", []).append(n)
    assert {k.split()[0] for k in pools} == {
        "write",
        "write_half",
        "fsync",
        "replace",
        "replaced",
        "unlink",
        "rmdir",
    }
    assert sum(1 for _, _, k, o in plan if (k, o) == COMPLETE) == 5
    assert len(pools["write state.pt"]) >= 5 * 4  # files, not a stub
    # Random points taken from each pool in turn: the few points around a rename are hit as
    # often as the hundreds of data writes.
    rng = random.Random(seed)
    shuffled = {key: rng.sample(ns, len(ns)) for key, ns in sorted(pools.items())}
    picks: list[int] = []
    while len(picks) < kills:
        picks += [pool.pop() for pool in shuffled.values() if pool][: kills - len(picks)]

    kill_runs = _killpoints("run", str(tmp_path), *map(str, picks), "--", *trainer_args)
    killed = run(kill_runs, timeout=600)
    assert killed.rc == 0, killed.stderr[-2000:]
    statuses = {int(n): rc for n, rc in json.loads(killed.stdout).items()}
    # The next pods: one fresh process, started after every kill, opens each directory.
    loaded = run(_killpoints("load", str(keep), *(str(tmp_path / str(n) / "ckpt") for n in picks)))
    assert loaded.rc == 0, loaded.stderr[-2000:]
    after = {Path(o["dir"]).parent.name: o for o in map(json.loads, loaded.stdout.splitlines())}

    for n in sorted(picks):
        _, step, kind, name = plan[n - 1]
        where = f"seed {seed}, killed at point {n} (step {step}, {kind} {name})"
        out = (tmp_path / str(n) / "out").read_text()
        assert statuses[n] == -signal.SIGKILL, f"{where}: {out[-2000:]}"
        passed, states = _read_kill_log(tmp_path / str(n) / "log")
        assert passed[-1] == plan[n - 1], where  # it died exactly there
        completed = [s for _, s, k, o in passed if (k, o) == COMPLETE]
        got = after[str(n)]
        assert got["skipped"] == [], where  # nothing damaged ever counted as complete
        on_disk = {int(name[5:13]): fp for name, fp in got["files"].items()}
        assert set(on_disk) <= set(completed), where
        assert set(completed[-keep:]) <= set(on_disk), f"{where}: a good checkpoint was lost"
        assert all(on_disk[s] == states[s] for s in on_disk), f"{where}: {got['files']}"
        assert got["other"] == [], where  # the restart removed what the dead writer left
        if not completed:
            assert got["chosen"] is None, where
            continue
        newest = completed[-1]
        assert got["chosen"] == {
            "name": f"step_{newest:08d}",
            "step": newest,
            "fp": states[newest],
        }, where
