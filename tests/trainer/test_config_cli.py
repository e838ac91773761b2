"""Bad configuration: exit 2, one line naming the key, no traceback (before any process group)."""

from __future__ import annotations

import sys

import pytest

from tests.trainer.conftest import kubeflow_env, run, trainer_cmd
from trainer.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["lr=-1"], "lr: Input should be greater than 0 (got -1)"),
        (["max_stepz=10"], "max_stepz: unknown key"),
        (["checkpoint.keep=0"], "checkpoint.keep: Input should be greater than or equal to 1"),
        (["checkpoint.dirr=/tmp/x"], "checkpoint.dirr: unknown key"),
        (["precision=fp8"], "precision: Input should be 'fp32', 'bf16' or 'fp16' (got fp8)"),
        (["batch_size=many"], "batch_size: Input should be a valid integer"),
        (["warmup_steps=500", "max_steps=100"], "warmup_steps (500) < max_steps (100)"),
        (["task=no.such.module:build"], "task: cannot import no (got no.such.module:build)"),
        (["task=trainer.tasks:nope"], "task: trainer.tasks has no callable nope"),
        (["task_args.colour=3"], "task_args: got an unexpected keyword argument 'colour'"),
        (["lr"], "lr: expected key=value"),
        (
            ["strategy=fsdp", "precision=fp16"],
            "precision: not with strategy fsdp (got fp16): fp16 needs a loss scaler",
        ),
        (
            ["strategy=fsdp", "sync_batchnorm=true"],
            "sync_batchnorm: not with strategy fsdp (got True): SyncBatchNorm is strategy ddp's",
        ),
        (
            ["strategy=fsdp", "ddp.static_graph=true"],
            "ddp: not with strategy fsdp (got {'static_graph': True}): these are the DDP wrapper's",
        ),
        (["strategy=zero3"], "strategy: Input should be 'ddp' or 'fsdp' (got zero3)"),
    ],
)
def test_bad_value_exits_2_naming_the_key(args: list[str], expected: str) -> None:
    r = run(trainer_cmd(*args))
    assert r.rc == 2, r.stderr
    assert expected in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""  # no events: nothing started


def test_bad_yaml_file_names_line(tmp_path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_steps: 10\nlr: [\n")
    r = run(trainer_cmd("--config", str(cfg)))
    assert r.rc == 2 and f"{cfg}:" in r.stderr and "YAML syntax error" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_key_in_kubeflow_pod_fails_before_torchrun() -> None:
    # With nprocPerNode=2 the trainer would re-launch itself; a bad key must still be exit 2.
    r = run(trainer_cmd("ddp.bucket_cap_mb=0"), env=kubeflow_env(2, 2))
    assert r.rc == 2
    assert "ddp.bucket_cap_mb: Input should be greater than 0 (got 0)" in r.stderr
    assert "torch.distributed" not in r.stderr and "Traceback" not in r.stderr


def test_the_relaunching_parent_imports_no_torch_and_a_missing_task_module_fails_there() -> None:
    """In a pod the trainer re-launches itself under torchrun (here nprocPerNode=2); that first
    process only decides and waits, so it must not import torch (seconds of CPU, and memory it
    would hold while the workers train): a task module that does not exist is found missing
    there, before torchrun, with torch never imported (-X importtime lists every import)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "trainer", "task=no.such.module:build"]
    r = run(cmd, env=kubeflow_env(2, 2))
    assert r.rc == 2, r.stderr[-2000:]
    assert "task: cannot import no (got no.such.module:build)" in r.stderr
    imported = [line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line]
    assert "trainer.config" in imported and "trainer.launch" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    assert "torch.distributed" not in r.stderr.replace("import time:", "")


@pytest.mark.slow
def test_a_bad_factory_argument_in_a_relaunched_pod_is_exit_2_said_once() -> None:
    """What needs the task's code (its factory's arguments) is checked by the workers torchrun
    started; each exits 2, the pod exits 2, and only local rank 0 prints the line."""
    r = run(trainer_cmd("task_args.colour=3", "max_steps=1"), env=kubeflow_env(2, 2), timeout=240)
    assert r.rc == 2, r.stderr[-3000:]
    line = "task_args: got an unexpected keyword argument 'colour'"
    assert r.stderr.count(line) == 1, r.stderr[-3000:]


SLOW_RANK_0_TASK = """
import os, time

if os.environ.get("LOCAL_RANK") == "0":
    time.sleep(60)  # torchrun stops this worker long before: local rank 1 exits 2 first


def build(size=1):
    raise AssertionError("the bad argument fails before the factory runs")
"""


@pytest.mark.slow
def test_a_bad_factory_argument_is_said_once_though_local_rank_0_is_stopped_before_it_can(
    tmp_path,
) -> None:
    """The workers check the task's arguments as they import its module, each at its own pace;
    torchrun stops the others once the first exits. Here local rank 0 is still importing when
    local rank 1 exits 2: the line is said once anyway, by the re-launching parent."""
    (tmp_path / "slow_rank_0_task.py").write_text(SLOW_RANK_0_TASK)
    env = {**kubeflow_env(2, 2), "PYTHONPATH": str(tmp_path)}
    cmd = trainer_cmd("task=slow_rank_0_task:build", "task_args.colour=3", "max_steps=1")
    r = run(cmd, env=env, timeout=240)
    assert r.rc == 2, r.stderr[-3000:]
    line = "task_args: got an unexpected keyword argument 'colour'"
    assert r.stderr.count(line) == 1, r.stderr[-3000:]
    assert "exitcode  : -15" in r.stderr  # rank 0 was stopped, not done


def test_precedence_cli_over_file_over_defaults(tmp_path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_steps: 50\nlr: 0.1\ncheckpoint: {keep: 7}\n")
    c = load_config(cfg, ["lr=3e-4", "checkpoint.every_steps=5"])
    assert (c.max_steps, c.lr, c.checkpoint.keep, c.checkpoint.every_steps) == (50, 3e-4, 7, 5)
    assert c.batch_size == 32  # default untouched


def test_unknown_nested_key_is_reported_with_its_path() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["ddp.bucket_cap=1", "seed=-1"])
    assert "ddp.bucket_cap: unknown key (got 1)" in e.value.problems
    assert any(p.startswith("seed: ") for p in e.value.problems)


def test_missing_resume_file_in_kubeflow_pod_is_exit_2() -> None:
    r = run(trainer_cmd("resume=/no/such/step_00000001.pt"), env=kubeflow_env(2, 2))
    assert r.rc == 2
    assert "resume: no such checkpoint (got /no/such/step_00000001.pt)" in r.stderr


def test_plain_exponent_is_a_number_but_a_quoted_one_stays_a_string() -> None:
    """YAML 1.1 reads a plain 1e-3 as text, so the trainer makes it a number; quoting opts out
    (the controller quotes string values, e.g. a checkpoint directory named "1e5")."""
    from trainer.config import parse_overrides

    got = parse_overrides(["lr=1e-3", 'checkpoint.dir="1e5"', "task_args.name='2e3'"])
    assert got == {"lr": 0.001, "checkpoint": {"dir": "1e5"}, "task_args": {"name": "2e3"}}
