"""The real trainer checkpointing to S3 (moto's server, tests/trainer/s3.py): a job with no
volume at all resumes exactly; a bad location is exit 2 on every rank before the first step; a
trainer SIGKILLed anywhere in an upload leaves nothing that a restart would read."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    REPO,
    base_env,
    common_args,
    kubeflow_env,
    run,
    run_pods,
)
from trainer.checkpoint.manager import read_path
from trainer.contract import EXIT_CONFIG
from trainer.health.ledger import RECORD


def _pods(tmp_path: Path, env: dict[str, str]) -> tuple[list[dict[str, str]], list[Path]]:
    """A 2-pod PyTorchJob's envs (one rank each), each pod in an empty working directory."""
    master = kubeflow_env(nproc_per_node=1, world_size=2, rank=0)
    worker = {**master, "RANK": "1", "PET_NODE_RANK": "1"}
    cwds = [tmp_path / "pod0", tmp_path / "pod1"]
    for cwd in cwds:
        cwd.mkdir(exist_ok=True)
    return [{**e, **env, "PYTHONPATH": str(REPO)} for e in (master, worker)], cwds


@pytest.mark.slow
def test_a_two_pod_job_with_no_volume_checkpoints_to_s3_and_resumes_exactly(
    tmp_path: Path, moto, s3
) -> None:
    url = f"{s3}/jobs/a"
    envs, cwds = _pods(tmp_path, moto.env)
    args = common_args(Path("."), max_steps=6, **{"checkpoint.every_steps": 2})
    args = [a for a in args if not a.startswith("checkpoint.dir=")] + [f"checkpoint.dir={url}"]

    first = run_pods(envs, args, cwds=cwds)
    assert [r.rc for r in first] == [0, 0], first[0].stderr[-3000:]
    events = first[0].of("checkpoint")
    assert [e["step"] for e in events] == [2, 4, 6]
    assert events[-1]["path"] == f"{url}/step_00000006"
    assert all(e["bytes"] > 1000 and e["stall_s"] >= 0 and e["write_s"] > 0 for e in events)
    bucket = s3[len("s3://") :]
    objects = ("manifest.json", "state.pt")
    saved = [k for k in moto.keys(bucket) if k != f"jobs/a/{RECORD}"]  # beside: the ledger
    assert saved == [f"jobs/a/step_0000000{i}/{o}" for i in (2, 4, 6) for o in objects]
    assert [list(cwd.iterdir()) for cwd in cwds] == [[], []]  # no pod wrote a file of its own

    straight = read_path(f"{url}/step_00000006")
    client = moto.client()
    for key in ("manifest.json", "state.pt"):  # as keep-last-k would: manifest first
        client.delete_object(Bucket=bucket, Key=f"jobs/a/step_00000006/{key}")
    resumed = run_pods(envs, args, cwds=cwds)
    assert [r.rc for r in resumed] == [0, 0], resumed[0].stderr[-3000:]
    (note,) = resumed[0].of("resume")
    assert note == {"event": "resume", "step": 4, "path": f"{url}/step_00000004", "skipped": []}
    assert [e["step"] for e in resumed[0].of("train")] == [6]
    again = read_path(f"{url}/step_00000006")
    for k in straight["model"]:
        assert torch.equal(straight["model"][k], again["model"][k]), k
    assert torch.equal(
        straight["optimizer"]["state"][0]["exp_avg"], again["optimizer"]["state"][0]["exp_avg"]
    )


@pytest.mark.slow
def test_a_bad_checkpoint_location_is_exit_2_on_every_rank_before_training(
    tmp_path: Path, moto
) -> None:
    """A bucket that is not there, for one: every rank probes the location before its first
    step and says the server's answer in one line. The other answers (wrong credentials, an
    endpoint with nothing listening, one that never answers) are the probe's own, in
    tests/trainer/test_storage.py; what a rank does with any of them is this."""
    url = "s3://no-such-bucket-here/jobs/a"
    answer = "NoSuchBucket: The specified bucket does not exist"
    envs, cwds = _pods(tmp_path, moto.env)
    results = _run_bad(envs, cwds, url)
    for rank, r in enumerate(results):
        assert r.rc == EXIT_CONFIG, f"rank {rank}: {r.stderr[-2000:]}"
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("checkpoint.dir:")]
        assert line.startswith(f"checkpoint.dir: cannot write, read and delete in {url} ({answer}")
        assert "Traceback" not in r.stderr
        assert r.of("start") == []  # before the first step


def _run_bad(envs: list[dict[str, str]], cwds: list[Path], url: str) -> list:
    args = [a for a in common_args(Path(".")) if not a.startswith("checkpoint.dir=")]
    return run_pods(envs, [*args, f"checkpoint.dir={url}"], timeout=180, cwds=cwds)


def _killpoints(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.trainer.killpoints", *args]


def _read_kill_log(path: Path) -> tuple[list[tuple[int, int, str, str]], dict[int, str]]:
    points, states = [], {}
    for line in path.read_text().splitlines():
        word, *fields = line.split()
        if word == "point":
            points.append((int(fields[0]), int(fields[1]), fields[2], fields[3]))
        else:
            states[int(fields[0])] = fields[1]
    return points, states


#: The request after which a step's checkpoint is complete: its manifest PUT.
COMPLETE = ("after:PutObject", "manifest.json")


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_anywhere_inside_an_s3_upload_leaves_the_newest_complete_one(
    tmp_path: Path, moto, s3
) -> None:
    """Kills at 14 random requests of the background uploads (around each multipart part, the
    completion, the manifest, the pruning), then a fresh process opens each prefix as a
    restarted pod would: the newest checkpoint whose manifest was stored, intact, nothing older
    lost than ``keep`` allows, no open upload and no stray object left."""
    keep, kills = 2, 14
    seed = int(os.environ.get("DDPJOB_KILL_SEED", random.randrange(2**32)))  # replay a failure
    env = base_env(**moto.env, KILLPOINTS_S3=s3)
    # A model of ~6 MB (19 MB with AdamW's state): each save is a multipart upload of 4 parts.
    extra = {
        "checkpoint.every_steps": 1,
        "checkpoint.keep": keep,
        "eval_batches": 1,
        "task_args.hidden": 120_000,
    }
    trainer_args = common_args(tmp_path, max_steps=4, log_every=100, **extra)

    dry = run(_killpoints("run", str(tmp_path), "0", "--", *trainer_args), env=env, timeout=300)
    assert dry.rc == 0 and json.loads(dry.stdout) == {"0": 0}, dry.stderr[-2000:]
    plan, _ = _read_kill_log(tmp_path / "0" / "log")
    pools: dict[str, list[int]] = {}
    for n, _step, kind, name in plan:
        pools.setdefault(f"{kind} {name}", []).append(n)
    assert sum(1 for _, _, k, o in plan if (k, o) == COMPLETE) == 4
    assert len(pools["after:UploadPart state.pt"]) == 4 * 4  # multipart, not one PUT
    rng = random.Random(seed)
    shuffled = {key: rng.sample(ns, len(ns)) for key, ns in sorted(pools.items())}
    picks: list[int] = []
    while len(picks) < kills:
        picks += [pool.pop() for pool in shuffled.values() if pool][: kills - len(picks)]

    kill_runs = _killpoints("run", str(tmp_path), *map(str, picks), "--", *trainer_args)
    killed = run(kill_runs, env=env, timeout=900)
    assert killed.rc == 0, killed.stderr[-2000:]
    statuses = {int(n): rc for n, rc in json.loads(killed.stdout).items()}
    loaded = run(_killpoints("load", str(keep), *(f"{s3}/{n}" for n in picks)), env=env)
    assert loaded.rc == 0, loaded.stderr[-2000:]
    after = {o["dir"].rpartition("/")[2]: o for o in map(json.loads, loaded.stdout.splitlines())}

    for n in sorted(picks):
        _, step, kind, name = plan[n - 1]
        where = f"seed {seed}, killed at point {n} (step {step}, {kind} {name})"
        out = (tmp_path / str(n) / "out").read_text()
        assert statuses[n] == -signal.SIGKILL, f"{where}: {out[-2000:]}"
        passed, states = _read_kill_log(tmp_path / str(n) / "log")
        assert passed[-1] == plan[n - 1], where
        completed = [s for _, s, k, o in passed if (k, o) == COMPLETE]
        got = after[str(n)]
        assert got["skipped"] == [], where
        on_disk = {int(name[5:13]): fp for name, fp in got["files"].items()}
        assert set(on_disk) <= set(completed), where
        assert set(completed[-keep:]) <= set(on_disk), f"{where}: a good checkpoint was lost"
        assert all(on_disk[s] == states[s] for s in on_disk), f"{where}: {got['files']}"
        assert got["other"] == [], where
        newest = completed[-1] if completed else None
        want = newest and {"name": f"step_{newest:08d}", "step": newest, "fp": states[newest]}
        assert got["chosen"] == want, where
