"""run --local: one process per node with the operator's env; a failing rank stops the rest.

The end-to-end test runs the real trainer (2 nodes, gloo on CPU). The failure and signal tests
use tiny Python commands as the "container", so they take a second and need no torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from controller.errors import JobFailed, UserError
from controller.local.processes import node_command, node_path, operator_env, run_local, spec_env
from controller.spec import validate_spec
from tests.controller.conftest import PYTHON, REPO, minimal
from tests.trainer.conftest import lines_by_rank
from trainer.contract import START, is_event, parse_event


def spec_running(script: str, **fields):
    """A spec whose container runs ``script`` (Python) instead of the trainer."""
    return validate_spec(minimal(command=["python", "-c", textwrap.dedent(script)], args=[],
                                 **fields))  # fmt: skip


def test_operator_env_for_a_worker():
    spec = validate_spec(minimal(nodes=3, nproc_per_node=2, resources={"gpus": 2, "memory": "4Gi"}))
    assert operator_env(spec, 2, 29400) == {
        "PYTHONUNBUFFERED": "0",
        "MASTER_PORT": "29400",
        "MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": "6",
        "RANK": "2",
        "PET_NNODES": "3",
        "PET_NODE_RANK": "2",
        "PET_NPROC_PER_NODE": "2",
    }


def test_a_trainjob_gets_only_trainer_v2s_five_pet_variables():
    """Trainer v2's torch plugin sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
    PET_MASTER_ADDR and PET_MASTER_PORT, nothing else: no MASTER_ADDR, RANK or WORLD_SIZE (the
    trainer tells the two launchers apart by that). PYTHONUNBUFFERED is render's, in the env."""
    spec = validate_spec(minimal(name="tj", nodes=3, nproc_per_node=2, api="trainjob"))
    assert operator_env(spec, 2, 29400) == {
        "PYTHONUNBUFFERED": "1",
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29400",
    }


def test_secret_env_comes_from_the_callers_environment_or_fails_by_name():
    spec = validate_spec(
        minimal(env={"A": "1"}, secret_env={"TOKEN": {"secret": "creds", "key": "token"}})
    )
    assert spec_env(spec, {"TOKEN": "t"}) == {"A": "1", "TOKEN": "t"}
    with pytest.raises(UserError) as info:
        spec_env(spec, {})
    assert info.value.problems == [
        "secret_env.TOKEN: Secret creds/token cannot be read locally; export TOKEN=... to run "
        "--local"
    ]


def test_node_command_is_this_python_running_the_trainer():
    spec = validate_spec(minimal(trainer={"max_steps": 5, "lr": 0.01}))
    assert node_command(spec) == [sys.executable, "-m", "trainer", "lr=0.01", "max_steps=5"]


def test_elastic_nodes_get_the_operators_rendezvous_env_not_a_master():
    spec = validate_spec(
        minimal(nodes=2, elastic={"min_nodes": 1, "max_nodes": 3, "max_restarts": 2})
    )
    env = operator_env(spec, 1, 4242)
    assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:4242" and env["PET_RDZV_BACKEND"] == "c10d"
    assert (env["PET_NNODES"], env["PET_MAX_RESTARTS"]) == ("1:3", "2")
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)


def test_a_console_script_of_this_environment_runs_without_activating_it(tmp_path, write_spec):
    """`command: [torchrun, train.py]` finds torchrun as the image would, even when the shell's
    PATH does not have this interpreter's venv on it (tests run `.venv/bin/python -m pytest`)."""
    venv_bin = os.path.dirname(PYTHON)
    assert os.path.exists(os.path.join(venv_bin, "torchrun"))
    train = tmp_path / "train.py"
    train.write_text(
        "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )
    spec = write_spec(minimal(command=["torchrun", "--standalone", "--nproc-per-node=1",
                                       str(train)], args=[]))  # fmt: skip
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {**os.environ, "PATH": os.pathsep.join(path or ["/usr/bin", "/bin"])}
    env.pop("VIRTUAL_ENV", None)
    assert shutil.which("torchrun", path=env["PATH"]) is None  # the bug's precondition
    result = subprocess.run(
        [PYTHON, "-m", "controller", "run", str(spec), "--local", "--logs-dir", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rank 0 of 1" in (tmp_path / "rank-0.log").read_text()


def test_node_path_puts_this_interpreters_bin_first_once():
    here = os.path.dirname(sys.executable)
    assert node_path({"PATH": f"/usr/bin:{here}:/bin"}).split(os.pathsep) == [
        here,
        "/usr/bin",
        "/bin",
    ]


def test_a_command_that_cannot_start_is_a_user_error(tmp_path):
    spec = validate_spec(minimal(nodes=2, command=["no-such-program-ddpjob"], args=[]))
    with pytest.raises(UserError, match=r"command: cannot start 'no-such-program-ddpjob'"):
        run_local(spec, logs_dir=tmp_path)


def test_each_node_gets_the_operator_env_and_its_own_log(tmp_path, capsys):
    spec = spec_running(
        """
        import json, os
        keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NODE_RANK", "PET_NNODES", "MY_VAR"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        """,
        nodes=3, env={"MY_VAR": "x"},
    )  # fmt: skip
    assert run_local(spec, logs_dir=tmp_path) == 0
    seen = [json.loads((tmp_path / f"rank-{i}.log").read_text()) for i in range(3)]
    for i, env in enumerate(seen):
        assert env == {"RANK": str(i), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                       "PET_NODE_RANK": str(i), "PET_NNODES": "3", "MY_VAR": "x"}  # fmt: skip
    out, err = capsys.readouterr()
    assert json.loads(out) == seen[0]  # rank 0 shown (passthrough: stdout is not a TTY)
    assert "job succeeded" in err and f"logs: {tmp_path}/rank-{{0..2}}.log" in err


def test_each_node_of_a_trainjob_sees_exactly_the_trainer_v2_env(tmp_path, monkeypatch):
    """No launcher variable of the caller's shell leaks in (a PyTorchJob's RANK would make the
    trainer read the env as the v1 operator's). Beside Trainer v2's five, a node gets only
    torchrun's output settings (tee each worker's lines, its files beside the node's log), which
    name each line's process and place no process in the job."""
    monkeypatch.setenv("WORLD_SIZE", "9")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "elsewhere:1")
    spec = spec_running(
        """
        import json, os
        launcher = ("PET_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "ROLE_")
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(launcher)}))
        """,
        nodes=2, api="trainjob",
    )  # fmt: skip
    assert run_local(spec, logs_dir=tmp_path) == 0
    seen = [json.loads((tmp_path / f"rank-{i}.log").read_text()) for i in range(2)]
    port = seen[0]["PET_MASTER_PORT"]
    assert port.isdigit()
    for i, env in enumerate(seen):
        assert env == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(i),
                       "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port,
                       "PET_TEE": "3", "PET_LOG_DIR": str(tmp_path / f"torchrun-{i}")}  # fmt: skip


# Rank 1 fails with exit 3 once rank 0 has its SIGTERM handler (rank 0 says so in a file);
# rank 0 would run for a minute but records the SIGTERM it gets.
FAILING = """
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    ready = os.environ["MARKER"] + ".ready"
    if rank == 1:
        print("rank 1: about to fail", flush=True)
        while not os.path.exists(ready):
            time.sleep(0.01)
        sys.exit(3)
    def on_term(signum, frame):
        open(os.environ["MARKER"], "w").write("SIGTERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, {handler})
    open(ready, "w").close()
    print("rank 0: training", flush=True)
    time.sleep(60)
"""


def test_a_failing_rank_stops_the_others_and_reports_its_exit_code(tmp_path):
    marker = tmp_path / "rank0-got-sigterm"
    spec = spec_running(FAILING.format(handler="on_term"), nodes=2, env={"MARKER": str(marker)})
    with pytest.raises(JobFailed) as info:
        run_local(spec, logs_dir=tmp_path, grace_s=10)
    message = str(info.value)
    assert message.startswith("rank 1 exited with code 3 after ")
    assert "stopped the other ranks (exit codes 0: 143, 1: 3)" in message
    assert f"last lines of {tmp_path}/rank-1.log:\n    rank 1: about to fail" in message
    assert marker.read_text() == "SIGTERM"
    assert info.value.exit_code == 1


def test_each_rank_is_told_the_grace_period_it_runs_under(tmp_path):
    """``--grace-s``, else the spec's ``grace_period_s``, else Kubernetes' 30: what a pod's
    trainer reads as ``DDPJOB_GRACE_PERIOD_S`` to measure its checkpoint writes against."""
    script = """
        import os
        path = os.path.join(os.environ["OUT"], "rank" + os.environ["RANK"])
        open(path, "w").write(os.environ["DDPJOB_GRACE_PERIOD_S"])
    """
    for grace_period_s, grace_s, told in ((None, None, "30"), (90, None, "90"), (90, 2.5, "2.5")):
        out = tmp_path / f"{grace_period_s}-{grace_s}"
        out.mkdir()
        fields = {"grace_period_s": grace_period_s} if grace_period_s else {}
        spec = spec_running(script, nodes=2, env={"OUT": str(out)}, **fields)
        assert run_local(spec, logs_dir=out, grace_s=grace_s) == 0
        assert [(out / f"rank{r}").read_text() for r in (0, 1)] == [told, told]


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    spec = spec_running(FAILING.format(handler="signal.SIG_IGN"), nodes=2,
                        env={"MARKER": str(tmp_path / "m")})  # fmt: skip
    # 137: killed when the grace period ran out (its minute of sleep would have ended 0)
    with pytest.raises(JobFailed, match=r"exit codes 0: 137, 1: 3"):
        run_local(spec, logs_dir=tmp_path, grace_s=1.0)


def test_ctrl_c_stops_every_rank_and_exits_130(tmp_path, write_spec):
    marker = tmp_path / "marker"
    script = textwrap.dedent("""
        import os, signal, sys, time
        def on_term(signum, frame):
            open(os.environ["MARKER"] + os.environ["RANK"], "w").write("SIGTERM")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    """)
    path = write_spec(minimal(nodes=2, command=["python", "-c", script], args=[],
                              env={"MARKER": str(marker)}))  # fmt: skip
    proc = subprocess.Popen(
        [PYTHON, "-m", "controller", "run", str(path), "--local", "--logs-dir", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"  # rank 0 is up
    deadline = time.monotonic() + 20
    while "ready" not in _read(tmp_path / "rank-1.log") and time.monotonic() < deadline:
        time.sleep(0.05)  # rank 1 has its SIGTERM handler once it says ready
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT; exit codes 0: 143, 1: 143" in err
    assert [(tmp_path / f"marker{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2


def _read(path):
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.slow
def test_quickstart_trains_on_two_cpu_nodes_with_the_real_trainer(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [PYTHON, "-m", "controller", "run", str(REPO / "examples" / "quickstart.yaml"),
         "--local", "--set", "trainer.max_steps=20", "--set", "trainer.eval_every=10",
         "--set", "trainer.task_args.image_size=16", "--set", "trainer.warmup_steps=2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    start, done = events[0], events[-1]
    assert start["event"] == "start" and start["world_size"] == 2
    assert done["event"] == "done" and done["reason"] == "completed" and done["step"] == 20
    assert any(e["event"] == "eval" for e in events)
    logs = tmp_path / "runs" / "quickstart" / "logs"
    assert (logs / "rank-0.log").read_text().count('"event": "train"') == 1  # log_every=20
    # The other rank says it joined (and nothing else on a good run): every rank's log shows it.
    assert "[rank 1] joined: rank 1 of 2 (local rank 0)" in (logs / "rank-1.log").read_text()
    assert (tmp_path / "runs/quickstart/checkpoints").is_dir()
    assert "job succeeded" in result.stderr


def _run_local(spec, tmp_path) -> subprocess.CompletedProcess:
    """``run SPEC --local`` from ``tmp_path``, its per-rank logs there too."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [PYTHON, "-m", "controller", "run", str(spec), "--local", "--logs-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_an_elastic_spec_runs_locally_through_the_rendezvous(tmp_path, write_spec):
    """Elastic jobs have no master: the nodes meet at the c10d rendezvous, as on a cluster."""
    spec = write_spec(
        minimal(
            nodes=2,
            elastic={"min_nodes": 2, "max_nodes": 2},
            trainer={"max_steps": 4, "log_every": 2, "task_args": {"image_size": 16},
                     "checkpoint": {"dir": str(tmp_path / "ckpt")}},
        )
    )  # fmt: skip
    result = _run_local(spec, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("rank-*.log")))
    starts = [e for x in logs.splitlines() if is_event(x, START) and (e := parse_event(x))]
    assert len(starts) == 1 and starts[0]["world_size"] == 2  # one rank 0, a world of two
    assert '"reason": "completed"' in logs


@pytest.mark.slow
def test_a_trainjob_spec_trains_locally_from_the_pet_variables(tmp_path, write_spec):
    """With only the PET_* variables and one process per node, each node's trainer takes its
    node's rank: one rank 0, a world of two, as in a TrainJob's pods."""
    spec = write_spec(
        minimal(
            nodes=2,
            api="trainjob",
            trainer={"max_steps": 4, "log_every": 2, "task_args": {"image_size": 16},
                     "checkpoint": {"dir": str(tmp_path / "ckpt")}},
        )
    )  # fmt: skip
    result = _run_local(spec, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    starts = [e for x in lines if is_event(x, START) and (e := parse_event(x))]
    assert len(starts) == 1 and starts[0]["world_size"] == 2, result.stdout[-2000:]
    rank1 = (tmp_path / "rank-1.log").read_text()
    assert '"event": "start"' not in rank1  # node 1 runs global rank 1 only
    assert '"reason": "completed"' in result.stdout


@pytest.mark.slow
def test_run_local_tracks_the_job_in_mlflow_as_a_pod_does(tmp_path, write_spec, mlflow_server):
    """The spec's MLFLOW_TRACKING_URI reaches the nodes: one run named after the job, its config
    as params, every log window's loss, FINISHED; the job's API and image as tags."""
    spec = write_spec(
        minimal(
            name="tracked-locally",
            nodes=2,
            env={"MLFLOW_TRACKING_URI": mlflow_server.url, "MLFLOW_EXPERIMENT_NAME": "local"},
            trainer={"max_steps": 6, "log_every": 2, "task_args": {"image_size": 16},
                     "checkpoint": {"dir": str(tmp_path / "ckpt")}},
        )
    )  # fmt: skip
    result = _run_local(spec, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = mlflow_server.runs("local")
    assert run["info"]["run_name"] == "tracked-locally" and run["info"]["status"] == "FINISHED"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["max_steps"] == "6" and params["task_args.image_size"] == "16"
    assert [s for s, _ in mlflow_server.history(run["info"]["run_id"], "loss")] == [2, 4, 6]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["ddpjob.api"] == "pytorchjob" and tags["ddpjob.image"] == "repo/trainer:1"
    tracking = [json.loads(x) for x in result.stdout.splitlines() if '"tracking"' in x]
    assert tracking and tracking[0]["run_id"] == run["info"]["run_id"]


#: A user's script under its own torchrun: every process prints long lines unbuffered, each
#: print's arguments one write each.
CHATTY = """
import os
rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
for i in range(100):
    print("USERSCRIPT", rank, world, i, *["x" * 50] * 40)
"""
USERSCRIPT_LINE = re.compile(r"\[rank (\d)\] USERSCRIPT (\d) 4 (\d+)( x{50}){40}")


@pytest.mark.slow
def test_every_process_of_a_node_reaches_its_log_in_whole_lines_named_by_rank(tmp_path, write_spec):
    """2 nodes x 2 processes of a spec's own torchrun command: each node's log holds every line
    of its two processes whole, after the process's global rank; the run prints no traceback."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    spec = write_spec(minimal(nodes=2, nproc_per_node=2, api="trainjob",
                              command=["torchrun", str(script)], args=[]))  # fmt: skip
    result = _run_local(spec, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    for node in (0, 1):
        log = (tmp_path / f"rank-{node}.log").read_text()
        printed = [line for line in log.splitlines() if "USERSCRIPT" in line]
        seen = lines_by_rank(printed, USERSCRIPT_LINE)
        assert seen == {2 * node: list(range(100)), 2 * node + 1: list(range(100))}
        assert "Traceback" not in log, log[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
