"""run --local --container: each node a container of the real trainer image, built here.

The pure parts (names, env, flags, GPU slices) are checked as values. Everything else runs real
containers of the image ``localkube.builds.images.trainer_image()`` builds from this checkout
(podman here: there is no Docker daemon), through the CLI as a user runs it: the quickstart trains
in two containers; a preempted run ends 143 with a checkpoint in the mapped directory, owned by the
invoking user, that the next run resumes; a failing node is explained; the env is the operator's (a
TrainJob gets exactly its five PET variables); Ctrl-C, a killed controller and leftovers of dead
runs leave no container or network behind. Without podman these fail with one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from controller.errors import UserError
from controller.local.container import (
    Mount,
    boxes,
    checkpoint_note,
    cpus,
    gpu_slices,
    launcher_env,
    mounts,
    run_argv,
)
from controller.local.engine import (
    LABEL_JOB,
    LABEL_OWNER,
    LABEL_RUN,
    Engine,
    find_runs,
    owner_alive,
    owner_id,
)
from controller.spec import validate_spec
from localkube.builds import images
from tests.controller.conftest import PYTHON, REPO, minimal
from tests.timeouts import outside_test_timeout
from tools import podman
from trainer.contract import is_event, parse_event

PODMAN = Engine("podman", "/usr/bin/podman")
DOCKER = Engine("docker", "/usr/bin/docker")
QUICKSTART = REPO / "examples" / "quickstart.yaml"
#: The settings this machine's podman needs (runc, no default ulimits), unless the caller has
#: its own: the same file the image build uses.
CONTAINERS_CONF = os.environ.get("CONTAINERS_CONF", str(podman.CONTAINERS_CONF))
ENV = {**os.environ, "PYTHONPATH": str(REPO), "CONTAINERS_CONF": CONTAINERS_CONF}


# ---------------------------------------------------------------------------------------------
# Pure: what each container is


def test_containers_are_named_after_the_pods_the_operator_creates():
    v1 = validate_spec(minimal(name="qs", nodes=3))
    assert [(b.pod, b.aliases, b.container) for b in boxes(v1, "ab12cd")] == [
        ("qs-master-0", ("qs-master-0",), "qs-master-0-ab12cd"),
        ("qs-worker-0", ("qs-worker-0",), "qs-worker-0-ab12cd"),
        ("qs-worker-1", ("qs-worker-1",), "qs-worker-1-ab12cd"),
    ]
    elastic = validate_spec(minimal(name="el", nodes=2, elastic={"min_nodes": 1, "max_nodes": 2}))
    assert [b.pod for b in boxes(elastic, "x")] == ["el-worker-0", "el-worker-1"]
    tj = validate_spec(minimal(name="tj", nodes=2, api="trainjob"))
    assert [b.aliases for b in boxes(tj, "x")] == [
        ("tj-node-0-0", "tj-node-0-0.tj"),
        ("tj-node-0-1", "tj-node-0-1.tj"),
    ]


def test_launcher_env_names_the_master_pod():
    v1 = validate_spec(minimal(name="qs", nodes=2, nproc_per_node=2))
    assert launcher_env(v1, 1) == {
        "PYTHONUNBUFFERED": "0", "MASTER_PORT": "23456", "MASTER_ADDR": "qs-master-0",
        "WORLD_SIZE": "4", "RANK": "1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "2",
    }  # fmt: skip
    elastic = validate_spec(minimal(name="el", nodes=2, elastic={"min_nodes": 1, "max_nodes": 3}))
    env = launcher_env(elastic, 1)
    assert env["PET_RDZV_ENDPOINT"] == "el-worker-0:23456" and "MASTER_ADDR" not in env
    tj = validate_spec(minimal(name="tj", nodes=2, api="trainjob"))
    assert launcher_env(tj, 1) == {
        "PYTHONUNBUFFERED": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500",
    }  # fmt: skip


def _argv(engine: Engine, spec, **kw) -> list[str]:
    (box,) = boxes(spec, "r1")[:1]
    args = {"run_id": "r1", "network": "net", "owner": "h/1/2", "env": {"A": "1"},
            "secret_names": [], "volumes": [], "gpus": [], "cpus": "1", **kw}  # fmt: skip
    return run_argv(engine, spec, box, **args)


def test_run_argv_carries_the_pods_settings(tmp_path):
    spec = validate_spec(
        minimal(name="qs", resources={"cpu": "500m", "memory": "1Gi"}, shm_size="256Mi",
                trainer={"max_steps": 5}, secret_env={"TOKEN": {"secret": "s", "key": "k"}})
    )  # fmt: skip
    ckpt = Mount("ckpt", tmp_path / "ckpt", tmp_path / "ckpt", "/ckpt", False)
    data = Mount("data", tmp_path / "data", tmp_path / "data" / "sub", "/data", True)
    argv = _argv(PODMAN, spec, secret_names=["TOKEN"], volumes=[ckpt, data], cpus="0.5")
    text = " ".join(argv)
    assert argv[:5] == ["/usr/bin/podman", "run", "--rm", "--pull", "never"]
    for flags in (
        "--name qs-master-0-r1 --hostname qs-master-0 --network net --network-alias=qs-master-0",
        f"--label {LABEL_RUN}=r1 --label {LABEL_OWNER}=h/1/2 --label {LABEL_JOB}=qs",
        "--user 1000:1000 --security-opt no-new-privileges --cap-drop ALL",
        f"--shm-size {256 * 2**20} --memory {2**30} --memory-swap {2**30} --cpus 0.5",
        "--env A=1 --env TOKEN ",  # the secret by name: its value never shows in ps
        f"--volume {tmp_path}/ckpt:/ckpt --volume {tmp_path}/data/sub:/data:ro",
        "--entrypoint python repo/trainer:1 -m trainer max_steps=5",
    ):
        assert flags in text, flags
    assert "--label app.kubernetes.io/instance=qs" in text
    assert "--userns" not in text and "--gpus" not in text and "--device" not in text
    assert text.endswith("repo/trainer:1 -m trainer max_steps=5")


def test_a_shipped_workdir_is_the_containers_working_directory(tmp_path):
    """run --local --container --workdir: the unpacked copy at /workdir, the pods' path, and
    the container's working directory."""
    spec = validate_spec(minimal(name="wd"))
    copy = Mount("workdir", tmp_path / "copy", tmp_path / "copy", "/workdir", False)
    text = " ".join(_argv(PODMAN, spec, volumes=[copy], working_dir="/workdir"))
    assert f"--volume {tmp_path}/copy:/workdir --workdir /workdir --entrypoint python" in text
    assert "--workdir" not in " ".join(_argv(PODMAN, spec))


def test_a_rank0_only_volume_is_in_node_0s_container_alone(tmp_path):
    """As on the pods: the Master mounts a rank0_only volume, its Workers do not."""
    volume = {"name": "ckpt", "claim": "rwo", "mount_path": "/ckpt", "rank0_only": True}
    spec = validate_spec(minimal(nodes=2, volumes=[volume]))
    (ckpt,) = mounts(spec, tmp_path)
    args = {"run_id": "r1", "network": "net", "owner": "h/1/2", "env": {}, "secret_names": [],
            "volumes": [ckpt], "gpus": [], "cpus": "1"}  # fmt: skip
    master, worker = (run_argv(PODMAN, spec, box, **args) for box in boxes(spec, "r1"))
    assert f"--volume {tmp_path}/ckpt:/ckpt" in " ".join(master)
    assert "--volume" not in worker


def test_rootless_podman_maps_the_image_user_to_the_invoker():
    spec = validate_spec(minimal())
    argv = _argv(Engine("podman", "podman", rootless=True), spec)
    assert argv[argv.index("--userns") + 1] == "keep-id:uid=1000,gid=1000"


def test_each_node_gets_gpus_of_its_own_as_each_pod_does():
    spec = validate_spec(minimal(nodes=2, nproc_per_node=2, resources={"gpus": 2}))
    assert gpu_slices(spec, 4) == [[0, 1], [2, 3]]
    podman = " ".join(_argv(PODMAN, spec, gpus=[2, 3]))
    assert "--device nvidia.com/gpu=2 --device nvidia.com/gpu=3" in podman
    docker = _argv(DOCKER, spec, gpus=[2, 3])
    assert docker[docker.index("--gpus") + 1] == '"device=2,3"'
    with pytest.raises(UserError, match=r"^resources.gpus: nodes \(2\) x resources.gpus \(2\) = 4"):
        gpu_slices(spec, 3)
    with pytest.raises(UserError, match=r"this machine has no NVIDIA GPU"):
        gpu_slices(spec, 0)
    assert gpu_slices(validate_spec(minimal(nodes=2)), 0) == [[], []]


def test_cpu_is_capped_at_this_machine():
    assert cpus(validate_spec(minimal(resources={"cpu": "96"})), 2) == "2"
    assert cpus(validate_spec(minimal(resources={"cpu": "1500m"})), 8) == "1.5"


def test_a_checkpoint_dir_on_no_volume_is_noted(tmp_path):
    ckpt = Mount("ckpt", tmp_path, tmp_path, "/ckpt", False)
    on_volume = validate_spec(minimal(trainer={"checkpoint": {"dir": "/ckpt/run"}}))
    assert checkpoint_note(on_volume, "/workspace", [ckpt]) is None
    relative = validate_spec(minimal(trainer={"checkpoint": {"dir": "runs/x"}}))
    note = checkpoint_note(relative, "/workspace", [ckpt])
    assert note and "runs/x (/workspace/runs/x in the container) is on no volume" in note
    assert checkpoint_note(validate_spec(minimal(args=["x=1"])), "/workspace", []) is None
    on_s3 = validate_spec(minimal(trainer={"checkpoint": {"dir": "s3://ckpt/run"}}))
    assert checkpoint_note(on_s3, "/workspace", []) is None


def test_owners_are_alive_while_their_process_runs():
    host = socket.gethostname()
    assert owner_alive(owner_id())
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not owner_alive(f"{host}/{dead.pid}/1")  # /proc has no such process
    assert not owner_alive(f"{host}/{dead.pid}/0")  # no start time: kill(pid, 0) says so
    assert not owner_alive(f"{host}/{os.getpid()}/1")  # our pid, another start: reused
    assert owner_alive(f"another-host/{dead.pid}/1")  # not ours to judge
    assert owner_alive("garbage")


class _Canned(Engine):
    """An engine whose listings are what the real CLIs print (docker cannot run here)."""

    def __init__(self, name: str, outputs: dict[str, str]):
        super().__init__(name, name)
        object.__setattr__(self, "outputs", outputs)

    def call(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        key = " ".join(args[:2]) if args[0] == "network" else args[0]
        return subprocess.CompletedProcess(args, 0, self.outputs.get(key, ""), "")


def test_runs_are_found_in_podman_and_docker_listings():
    podman_ps = json.dumps(
        [
            {"Names": ["a-r1"], "Labels": {LABEL_RUN: "r1", LABEL_OWNER: "h/1/2"}},
            {"Names": ["b-r1"], "Labels": {LABEL_RUN: "r1", LABEL_OWNER: "h/1/2"}},
        ]
    )
    podman_net = json.dumps([{"name": "ddpjob-x-r2", "labels": {LABEL_RUN: "r2"}}])
    docker_ps = "\n".join(
        json.dumps({"Names": n, "Labels": f"{LABEL_RUN}=r1,{LABEL_OWNER}=h/1/2"})
        for n in ("a-r1", "b-r1")
    )
    docker_net = json.dumps([{"Name": "ddpjob-x-r2", "Labels": {LABEL_RUN: "r2"}}])

    def nets(ids: str, inspect: str) -> dict[str, str]:
        return {"network ls": ids + "\n", "network inspect": inspect}

    for engine in (
        _Canned("podman", {"ps": podman_ps, **nets("ddpjob-x-r2", podman_net)}),
        _Canned("docker", {"ps": docker_ps, **nets("4f2a9c", docker_net)}),
    ):
        found = find_runs(engine)
        assert found.containers == {"r1": ["a-r1", "b-r1"]}, engine.name
        assert found.owners["r1"] == "h/1/2" and found.runs == ["r1", "r2"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", str(QUICKSTART), "--local", "--engine", "podman"],
         "error: --engine: chooses the engine of --container runs (got --engine podman without "
         "--container). Add --container, or leave --engine out"),
        (["run", "--cleanup", str(QUICKSTART)],
         f"error: run --cleanup: takes no SPEC (got {QUICKSTART}); it removes what any earlier "
         "run --container left behind. Run `python -m controller run --cleanup` alone"),
        (["run", "--local", "--container"],
         "error: run: a SPEC is needed (got none). Run `python -m controller run SPEC --local "
         "[--container]`"),
    ],
)  # fmt: skip
def test_run_flags_that_do_not_fit_are_one_line(argv, expected, capsys):
    from controller.cli.main import main

    assert main(argv) == 2
    assert capsys.readouterr().err == expected + "\n"


# ---------------------------------------------------------------------------------------------
# Real containers of the image built from this checkout


def _need_podman() -> str:
    path = shutil.which("podman")
    if path is None:
        pytest.fail("podman is not on PATH: run `make node-deps` (root, apt) to install it")
    return path


@pytest.fixture(scope="session")
def image() -> str:
    """The trainer image of this checkout (built when missing or stale)."""
    _need_podman()
    os.environ.setdefault("CONTAINERS_CONF", CONTAINERS_CONF)
    with outside_test_timeout():
        return images.trainer_image()


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_need_podman(), *args], env=ENV, capture_output=True, text=True, check=False
    )


def leftovers(job: str) -> list[str]:
    """Containers and networks of ``job``'s runs that still exist."""
    ps = podman("ps", "-a", "--filter", f"label={LABEL_JOB}={job}", "--format", "{{.Names}}")
    nets = podman("network", "ls", "--filter", f"label={LABEL_JOB}={job}", "--format", "{{.Name}}")
    return ps.stdout.split() + nets.stdout.split()


def ddpjob(*args: str, cwd: Path, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "controller", *args], cwd=cwd, env={**ENV, **kw.pop("env", {})},
        capture_output=True, text=True, timeout=timeout, **kw,
    )  # fmt: skip


def start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-m", "controller", *args], cwd=cwd, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def events(stdout: str) -> list[dict]:
    return [e for x in stdout.splitlines() if (e := parse_event(x)) is not None]


def script_spec(name: str, image: str, script: str, **fields) -> dict:
    """A spec whose containers run ``script`` with the image's python instead of the trainer."""
    command = ["python", "-c", textwrap.dedent(script)]
    return {"name": name, "image": image, "command": command, "args": [], **fields}


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def owners(root: Path) -> set[tuple[int, int]]:
    return {(p.stat().st_uid, p.stat().st_gid) for p in [root, *root.rglob("*")]}


@pytest.mark.slow
def test_quickstart_trains_in_two_containers_of_the_image(image, tmp_path):
    r = ddpjob(
        "run", str(QUICKSTART), "--local", "--container", "--set", f"image={image}",
        "--set", "trainer.max_steps=20", "--set", "trainer.eval_every=10",
        "--set", "trainer.task_args.image_size=16", "--set", "trainer.warmup_steps=2",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    seen = events(r.stdout)
    start_event, done = seen[0], seen[-1]
    assert start_event["event"] == "start" and start_event["world_size"] == 2
    assert done["event"] == "done" and done["reason"] == "completed" and done["step"] == 20
    assert any(e["event"] == "eval" for e in seen)
    logs = tmp_path / "runs" / "quickstart" / "logs"
    assert '"event": "train"' in (logs / "rank-0.log").read_text()
    assert "[rank 1] joined: rank 1 of 2" in (logs / "rank-1.log").read_text()
    assert "(podman)" in r.stderr and "master quickstart-master-0:23456" in r.stderr
    assert "note: trainer.checkpoint.dir runs/quickstart/checkpoints" in r.stderr
    assert "job succeeded" in r.stderr
    assert leftovers("quickstart") == []


PREEMPTIBLE = {
    "nodes": 2,
    "resources": {"cpu": "1", "memory": "2Gi"},
    "shm_size": "256Mi",
    "env": {"OMP_NUM_THREADS": "1"},
    "volumes": [{"name": "ckpt", "claim": "ckpt", "mount_path": "/ckpt"}],
    "trainer": {
        "task_args": {"image_size": 16}, "device": "cpu", "max_steps": 100000, "log_every": 5,
        "eval_every": 0, "checkpoint": {"dir": "/ckpt/run", "every_steps": 100000},
        "resume": "auto",
    },
}  # fmt: skip


@pytest.mark.slow
def test_a_preempted_run_ends_143_with_a_checkpoint_the_next_run_resumes(image, tmp_path):
    spec = write(tmp_path, {"name": "ct-preempt", "image": image, **PREEMPTIBLE})
    proc = start("run", str(spec), "--local", "--container", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:  # rank 0 trains: preempt it as a node drain would
        if is_event(line, "train"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM; exit codes 0: 143, 1: 143" in err
    (done,) = [e for e in events(out) if e["event"] == "done"]
    assert done["reason"] == "preempted"
    volume = tmp_path / "runs" / "ct-preempt" / "volumes" / "ckpt"
    assert "volume ckpt: runs/ct-preempt/volumes/ckpt at /ckpt" in err
    written = sorted((volume / "run").glob("step_*/manifest.json"))
    assert written, f"no checkpoint in {volume}"
    # Rootful podman maps the containers' uid 1000 to uid 1000 here; the run hands the
    # directory back to whoever ran it (root here: the chown needs it).
    assert owners(volume) == {(os.getuid(), os.getgid())}

    r = ddpjob(
        "run", str(spec), "--local", "--container",
        "--set", f"trainer.max_steps={done['step'] + 5}", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (resumed,) = [e for e in events(r.stdout) if e["event"] == "resume"]
    assert resumed["step"] == done["step"] and resumed["path"].startswith("/ckpt/run/")
    assert events(r.stdout)[-1]["reason"] == "completed"
    assert owners(volume) == {(os.getuid(), os.getgid())}
    assert leftovers("ct-preempt") == []


# Rank 1 fails with exit 3 once rank 0 has its SIGTERM handler (rank 0 says so in the shared
# volume); rank 0 would sleep for minutes but notes the SIGTERM it gets.
FAILING = """
    import os, signal, sys, time
    if os.environ["RANK"] == "1":
        print("rank 1: about to fail", flush=True)
        while not os.path.exists("/vol/rank0-ready"):
            time.sleep(0.05)
        sys.exit(3)
    def on_term(signum, frame):
        open("/vol/rank0-got-sigterm", "w").write("SIGTERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    open("/vol/rank0-ready", "w").close()
    print("rank 0: training", flush=True)
    time.sleep(300)
"""
VOLUME = [{"name": "vol", "claim": "vol", "mount_path": "/vol"}]


@pytest.mark.slow
def test_a_failing_node_is_explained_and_stops_the_other(image, tmp_path):
    spec = write(tmp_path, script_spec("ct-fail", image, FAILING, nodes=2, volumes=VOLUME))
    r = ddpjob("run", str(spec), "--local", "--container", "--grace-s", "60", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "error: rank 1 exited with code 3 after " in r.stderr
    assert "stopped the other ranks (exit codes 0: 143, 1: 3)" in r.stderr
    tail = r.stderr.split("last lines of runs/ct-fail/logs/rank-1.log:\n")[1]
    assert "    rank 1: about to fail\n" in tail  # (after an engine's line, on some hosts)
    assert "Traceback" not in r.stderr
    marker = tmp_path / "runs" / "ct-fail" / "volumes" / "vol" / "rank0-got-sigterm"
    assert marker.read_text() == "SIGTERM"
    assert leftovers("ct-fail") == []


@pytest.mark.slow
def test_a_command_missing_from_the_image_is_explained(image, tmp_path):
    spec = write(tmp_path, {"name": "ct-nocmd", "image": image, "command": ["no-such-program"],
                            "args": []})  # fmt: skip
    r = ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "error: rank 0 exited with code 127 after " in r.stderr
    assert "no-such-program" in r.stderr  # the engine's own line, among the last lines
    assert r.stderr.rstrip().endswith(
        "exit 127: the spec's command was not found in the image (check command:)"
    )
    assert leftovers("ct-nocmd") == []


# Each node prints what its pod would see, as one JSON line. The worker reaches the master by
# the name and port the launcher gave, as a rendezvous would, and tells it its hostname.
PROBE = """
    import json, os, socket, time
    status = open("/proc/self/status").read()
    def field(name):
        return status.split(name + ":")[1].split()[0]
    launcher = {k: v for k, v in os.environ.items()
                if k.startswith("PET_") or k in ("MASTER_ADDR", "MASTER_PORT", "RANK",
                                                 "WORLD_SIZE", "LOCAL_RANK")}
    master = os.environ.get("MASTER_ADDR") or os.environ["PET_MASTER_ADDR"]
    port = int(os.environ.get("MASTER_PORT") or os.environ["PET_MASTER_PORT"])
    rank = int(os.environ.get("RANK") or os.environ["PET_NODE_RANK"])
    me, peer = socket.gethostname(), None
    if rank == 0:
        server = socket.create_server(("", port))
        server.settimeout(120)
        peer = server.accept()[0].recv(64).decode()
    # A TrainJob's pods start together: the master's name may resolve a moment later (torchrun
    # retries). A PyTorchJob's worker starts once the master's name resolves: no retry.
    for _ in range(300 if "PET_MASTER_ADDR" in os.environ else 1):
        try:
            master_ip = socket.gethostbyname(master)
            break
        except OSError:
            time.sleep(0.2)
    if rank == 1:
        for _ in range(300):  # until the master listens
            try:
                socket.create_connection((master, port), timeout=5).sendall(me.encode())
                break
            except OSError:
                time.sleep(0.2)
    cgroup_v1 = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    memory = open(cgroup_v1 if os.path.exists(cgroup_v1) else "/sys/fs/cgroup/memory.max").read()
    shm = os.statvfs("/dev/shm")
    print(json.dumps({
        "launcher": launcher, "hostname": me, "master_ip": master_ip, "peer": peer,
        "my_ip": socket.gethostbyname(me), "uid": os.getuid(), "gid": os.getgid(),
        "cap_eff": field("CapEff"), "no_new_privs": field("NoNewPrivs"), "memory": int(memory),
        "shm": shm.f_blocks * shm.f_frsize, "token": os.environ.get("TOKEN"),
        "user_env": os.environ.get("MY_VAR"),
    }))
"""


def _probe_lines(tmp_path: Path, name: str, nodes: int) -> list[dict]:
    logs = tmp_path / "runs" / name / "logs"
    out = []
    for i in range(nodes):
        lines = [x for x in (logs / f"rank-{i}.log").read_text().splitlines() if x[:1] == "{"]
        out.append(json.loads(lines[-1]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_each_container_gets_what_its_pod_would(image, tmp_path, api):
    name = f"ct-env-{api}"
    spec = write(tmp_path, script_spec(
        name, image, PROBE, api=api, nodes=2, env={"MY_VAR": "x"},
        secret_env={"TOKEN": {"secret": "creds", "key": "token"}},
        resources={"cpu": "1", "memory": "1Gi"}, shm_size="128Mi",
    ))  # fmt: skip
    r = ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path, env={"TOKEN": "s3cret"})
    assert r.returncode == 0, r.stderr[-3000:]
    seen = _probe_lines(tmp_path, name, 2)
    for i, node in enumerate(seen):
        if api == "trainjob":
            # Trainer v2's torch plugin: these five, nothing else of a launcher's.
            assert node["launcher"] == {
                "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(i),
                "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500",
            }  # fmt: skip
            assert node["hostname"] == f"{name}-node-0-{i}"
        else:
            assert node["launcher"] == {
                "MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2",
                "RANK": str(i), "PET_NNODES": "2", "PET_NODE_RANK": str(i),
                "PET_NPROC_PER_NODE": "1",
            }  # fmt: skip
            assert node["hostname"] == [f"{name}-master-0", f"{name}-worker-0"][i]
        assert node["master_ip"] == seen[0]["my_ip"]  # the master's name resolves to it
        assert (node["uid"], node["gid"]) == (1000, 1000)
        assert node["cap_eff"] == "0000000000000000" and node["no_new_privs"] == "1"
        assert node["memory"] == 2**30 and node["shm"] == 128 * 2**20
        assert (node["token"], node["user_env"]) == ("s3cret", "x")
    assert seen[0]["peer"] == seen[1]["hostname"]  # the worker reached the master
    assert leftovers(name) == []


@pytest.mark.slow
def test_a_workdir_runs_in_the_image_at_the_pods_path(image, tmp_path):
    """The same folder as a pod gets it: the packed copy at /workdir, its working directory
    and the head of PYTHONPATH; the image's own code is not where it runs."""
    from tests.projects import git_repository

    git_repository(
        tmp_path / "project",
        {
            ".gitignore": "secret.txt\n",
            "secret.txt": "x",
            "mypkg/__init__.py": "VALUE = 'own'\n",
            "train.py": (
                "import json, os, mypkg\nfrom pathlib import Path\n"
                "print(json.dumps({'cwd': os.getcwd(), 'value': mypkg.VALUE, "
                "'pythonpath': os.environ['PYTHONPATH'], 'uid': os.getuid(), "
                "'files': sorted(str(p) for p in Path('.').rglob('*') if p.is_file())}))\n"
            ),
        },
    )
    name = "ct-workdir"
    spec = write(tmp_path, {"name": name, "image": image, "nodes": 2, "workdir": "project",
                            "command": ["python", "train.py"], "args": []})  # fmt: skip
    r = ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for node in _probe_lines(tmp_path, name, 2):
        assert (node["cwd"], node["value"], node["uid"]) == ("/workdir", "own", 1000)
        assert node["pythonpath"].split(":")[0] == "/workdir"
        assert node["files"] == [".ddpjob-digest", ".gitignore", "mypkg/__init__.py", "train.py"]
    assert leftovers(name) == []


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_a_missing_image_is_one_line(tmp_path):
    _need_podman()
    spec = write(tmp_path, minimal(name="ct-noimage", image="localhost/ddpjob-no-such:0"))
    line = _one_line(ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path))
    assert line.startswith(
        "error: image: localhost/ddpjob-no-such:0 is not among podman's local images"
    )
    assert "`podman pull localhost/ddpjob-no-such:0`" in line


def test_no_engine_is_one_line(tmp_path):
    spec = write(tmp_path, minimal(name="ct-noengine"))
    empty = tmp_path / "bin"
    empty.mkdir()
    r = ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path, env={"PATH": str(empty)})
    assert _one_line(r) == (
        "error: run --container: no container engine here (got docker: not on PATH; podman: "
        "not on PATH). Install podman or start the Docker daemon, or run without --container"
    )


def test_gpus_the_machine_lacks_are_one_line(tmp_path):
    _need_podman()
    from controller.local.container import host_gpus

    spec = write(tmp_path, minimal(name="ct-gpu", nodes=2, resources={"gpus": 16}))
    line = _one_line(ddpjob("run", str(spec), "--local", "--container", cwd=tmp_path))
    if host_gpus() == 0:
        assert line.startswith(
            "error: resources.gpus: the spec asks for 16 GPU(s) per node and this machine has "
            "no NVIDIA GPU"
        )
    else:
        assert line.startswith("error: resources.gpus: nodes (2) x resources.gpus (16) = 32")


# Both ranks note the SIGTERM they get in the shared volume, then exit 143 as the trainer does.
TRAPPING = """
    import os, signal, sys, time
    def on_term(signum, frame):
        open("/vol/got-sigterm-" + os.environ["RANK"], "w").write("SIGTERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    time.sleep(300)
"""


def _ready(tmp_path: Path, name: str) -> bool:
    log = tmp_path / "runs" / name / "logs" / "rank-1.log"
    return log.exists() and "ready" in log.read_text()


@pytest.mark.slow
def test_ctrl_c_stops_every_container_and_leaves_nothing(image, tmp_path):
    spec = write(tmp_path, script_spec("ct-int", image, TRAPPING, nodes=2, volumes=VOLUME))
    proc = start("run", str(spec), "--local", "--container", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            break
    wait_for(lambda: _ready(tmp_path, "ct-int"), 60, "rank 1 to be ready")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT; exit codes 0: 143, 1: 143" in err
    volume = tmp_path / "runs" / "ct-int" / "volumes" / "vol"
    assert [(volume / f"got-sigterm-{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2
    assert leftovers("ct-int") == []


@pytest.mark.slow
def test_a_killed_controller_leaves_nothing_behind(image, tmp_path):
    """SIGKILL gives the controller no chance: its janitor stops and removes the containers,
    removes the network, and hands the volume back."""
    spec = write(tmp_path, script_spec("ct-kill", image, TRAPPING, nodes=2, volumes=VOLUME))
    proc = start("run", str(spec), "--local", "--container", cwd=tmp_path)
    wait_for(lambda: _ready(tmp_path, "ct-kill"), 120, "rank 1 to be ready")
    assert len(leftovers("ct-kill")) == 3  # two containers and the network, while it runs
    proc.kill()
    proc.wait()
    wait_for(lambda: leftovers("ct-kill") == [], 60, "the janitor to remove the run")
    volume = tmp_path / "runs" / "ct-kill" / "volumes" / "vol"
    assert [(volume / f"got-sigterm-{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2
    wait_for(lambda: owners(volume) == {(os.getuid(), os.getgid())}, 10, "the hand-back")


def _leave_behind(image: str, run: str, owner: str) -> None:
    """What a run whose controller died before its janitor could act leaves: a network and a
    container on it, labelled as the runner labels them."""
    labels = ["--label", f"{LABEL_RUN}={run}", "--label", f"{LABEL_OWNER}={owner}",
              "--label", f"{LABEL_JOB}=ct-left"]  # fmt: skip
    assert podman("network", "create", *labels, f"ddpjob-ct-left-{run}").returncode == 0
    proc = podman(
        "run", "-d", "--name", f"ct-left-{run}", "--network", f"ddpjob-ct-left-{run}", *labels,
        "--entrypoint", "python", image, "-c", "import time; time.sleep(300)",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_leftovers_of_dead_runs_are_removed_at_start_and_by_cleanup(image, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_owner = f"{socket.gethostname()}/{dead.pid}/1"
    try:
        _leave_behind(image, "dead01", dead_owner)
        _leave_behind(image, "live01", owner_id())  # ours: alive
        hello = script_spec("ct-start", image, "print('hello')")
        r = ddpjob("run", str(write(tmp_path, hello)), "--local", "--container", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert (
            "removed 1 container(s) and 1 network(s) left by 1 earlier run(s) whose controller "
            "is gone (dead01)"
        ) in r.stderr
        assert sorted(leftovers("ct-left")) == ["ct-left-live01", "ddpjob-ct-left-live01"]

        _leave_behind(image, "dead02", dead_owner)
        r = ddpjob("run", "--cleanup", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "left by 1 earlier run(s) whose controller is gone (dead02)" in r.stderr
        assert f"left run live01 alone: its controller (pid {os.getpid()}) is still running" in (
            r.stderr
        )
        assert sorted(leftovers("ct-left")) == ["ct-left-live01", "ddpjob-ct-left-live01"]
    finally:
        podman("rm", "-f", "-t", "0", "ct-left-live01", "ct-left-dead01", "ct-left-dead02")
        for run in ("live01", "dead01", "dead02"):
            podman("network", "rm", "-f", f"ddpjob-ct-left-{run}")
