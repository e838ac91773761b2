"""``run SPEC --local --container``: each node of the job as a container of the spec's image.

``run --local`` runs this machine's Python; this runs the image, so what trains here is what a
cluster will run. One container per node, with docker where a daemon answers, else podman, on a
network of the run's own, each given what its pod would get:

- the launcher's env. PyTorchJob: MASTER_ADDR = the master pod's name ``<name>-master-0`` (a
  network alias of the master's container: it resolves on the run's network), MASTER_PORT 23456,
  RANK, WORLD_SIZE, PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PYTHONUNBUFFERED (elastic: the
  c10d rendezvous at ``<name>-worker-0``). TrainJob: the torch plugin's five variables only,
  PET_MASTER_ADDR = ``<name>-node-0-0.<name>``. Then the spec's env, and its secret_env from this
  shell (passed by name, so no value shows in ``ps``);
- the pod's command and args, shm size, memory and cpu limits (cpu capped at this machine's);
- the restricted profile: uid and gid 1000, no new privileges, every capability dropped;
- each volume as a directory, ``runs/<name>/volumes/<volume>`` (its sub_path inside), created
  and printed; read_only volumes mount read-only. The containers' uid 1000 must write there and
  the invoking user own the result: see :func:`hand_over`;
- GPUs when the spec asks: node i gets this machine's GPUs i*g .. i*g+g-1, as each pod gets its
  own (podman: CDI ``nvidia.com/gpu=<index>``, docker: ``--gpus device=...``).

A PyTorchJob's workers start once the master's container runs (its name resolves from then on),
as the operator's init container holds them until ``nslookup <name>-master-0`` answers; an
elastic job's and a TrainJob's containers start together, as their pods do.

Rank 0 drives the progress bar, every node's output goes to ``runs/<name>/logs/rank-<node>.log``,
a failing node stops the others and is reported with its exit code and last lines, Ctrl-C or
SIGTERM stops every container (SIGTERM to its PID 1, SIGKILL after the grace period): the same
runner as ``run --local`` (controller/local/processes.py), with containers for processes.

Nothing stays behind: containers run with ``--rm``; at the end the run's containers and network
are removed. A janitor process (controller/local/janitor.py) does it if the controller is killed.
Every object carries the run id and its owner (controller/local/engine.py), so a run first removes
what runs whose controller is gone left behind; ``run --cleanup`` does only that.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import IO, Any

from controller.errors import DdpjobError, JobFailed, UserError
from controller.kubeflow import (
    ENV_MASTER_ADDR,
    PORT,
    TRAINER_UID,
    TRAINJOB_MASTER_PORT,
    TRAINJOB_REPLICATED_JOB,
    WORKDIR_PATH,
    WORKDIR_VOLUME,
    trainjob_master_addr,
)
from controller.local.engine import (
    LABEL_JOB,
    LABEL_OWNER,
    LABEL_RUN,
    Engine,
    find_engine,
    owner_id,
    reap,
    remove,
)
from controller.local.janitor import Janitor, chown_tree
from controller.local.processes import (
    LocalWorkdir,
    Node,
    _Runner,
    _sayer,
    _signals_to,
    grace_s_of,
    node_env,
    operator_env,
)
from controller.progress import Progress
from controller.render.pod import container_args, container_command, pod_labels
from controller.spec import JobSpec, parse_quantity
from trainer import contract

#: Where CDI specs live (podman passes GPUs as CDI devices named by them).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


class EngineFailed(DdpjobError):
    """The container engine could not do what a run needs (create its network, start)."""

    exit_code = 1


# --------------------------------------------------------------------------------------------
# What each node's container is: names, env, mounts, GPUs (pure: spec in, values out)


@dataclass(frozen=True)
class Box:
    """One node as a container: the pod it stands for and the container's name."""

    index: int
    pod: str  # the pod's name on a cluster: the container's hostname and network alias
    aliases: tuple[str, ...]  # names the other nodes reach it by
    container: str  # unique on this machine: the pod's name and the run id


def boxes(spec: JobSpec, run_id: str) -> list[Box]:
    """The nodes' containers, named after the pods the job's operator would create."""
    if spec.api == "trainjob":
        pods = [f"{spec.name}-{TRAINJOB_REPLICATED_JOB}-0-{i}" for i in range(spec.nodes)]
    elif spec.elastic:
        pods = [f"{spec.name}-worker-{i}" for i in range(spec.nodes)]
    else:
        workers = [f"{spec.name}-worker-{i}" for i in range(spec.nodes - 1)]
        pods = [f"{spec.name}-master-0", *workers]
    out = []
    for i, pod in enumerate(pods):
        # A TrainJob's pods are also <pod>.<jobset> under the JobSet's headless Service: the
        # name PET_MASTER_ADDR gives.
        aliases = (pod, f"{pod}.{spec.name}") if spec.api == "trainjob" else (pod,)
        out.append(Box(i, pod, aliases, f"{pod}-{run_id}"))
    return out


def launcher_env(spec: JobSpec, node: int) -> dict[str, str]:
    """What the job's operator injects into the pod of ``node``, with the pods' real names."""
    if spec.api == "trainjob":
        # Trainer v2's torch plugin sets these five and nothing else (no MASTER_ADDR, RANK or
        # WORLD_SIZE); PYTHONUNBUFFERED comes first in the trainer's env, as render puts it.
        env = operator_env(spec, node, TRAINJOB_MASTER_PORT)
        env[ENV_MASTER_ADDR] = trainjob_master_addr(spec.name)
        return env
    env = operator_env(spec, node, PORT)
    first = boxes(spec, "")[0].pod
    if spec.elastic:
        env[contract.PET_RDZV_ENDPOINT] = f"{first}:{PORT}"
    else:
        env[contract.MASTER_ADDR] = first
    return env


@dataclass(frozen=True)
class Mount:
    """A volume of the spec as a directory of this machine."""

    volume: str
    host_dir: Path  # runs/<name>/volumes/<volume>
    source: Path  # host_dir, or its sub_path
    target: str
    read_only: bool
    rank0_only: bool = False  # on node 0's container alone, as on the Master pod


def mounts(spec: JobSpec, root: Path) -> list[Mount]:
    """Each volume of the spec at ``root/<volume name>`` (absolute)."""
    out = []
    for v in spec.volumes:
        host_dir = (root / v.name).absolute()
        source = host_dir / v.sub_path if v.sub_path else host_dir
        out.append(Mount(v.name, host_dir, source, v.mount_path, v.read_only, v.rank0_only))
    return out


def cpus(spec: JobSpec, host_cpus: int) -> str:
    """The cpu limit as ``--cpus`` takes it, at most this machine's CPUs (docker refuses
    more)."""
    wanted = parse_quantity(spec.resources.cpu)
    return _decimal(min(wanted, Decimal(host_cpus)))


def run_argv(
    engine: Engine,
    spec: JobSpec,
    box: Box,
    *,
    run_id: str,
    network: str,
    owner: str,
    env: dict[str, str],
    secret_names: list[str],
    volumes: list[Mount],
    gpus: list[int],
    cpus: str,
    working_dir: str | None = None,
) -> list[str]:
    """``<engine> run ...`` for one node: the pod's settings as the engine's flags
    (``working_dir``: the container's, where a workdir is shipped)."""
    memory = str(int(parse_quantity(spec.resources.memory)))
    argv = [
        *engine.argv("run", "--rm", "--pull", "never"),
        *("--name", box.container, "--hostname", box.pod, "--network", network),
        *(f"--network-alias={alias}" for alias in box.aliases),
        *("--label", f"{LABEL_RUN}={run_id}", "--label", f"{LABEL_OWNER}={owner}"),
        *("--label", f"{LABEL_JOB}={spec.name}"),
        *(x for k, v in pod_labels(spec).items() for x in ("--label", f"{k}={v}")),
        # The restricted profile, as the pod's securityContext asks (seccomp: the default).
        *("--user", f"{TRAINER_UID}:{TRAINER_UID}"),
        *("--security-opt", "no-new-privileges", "--cap-drop", "ALL"),
        *("--shm-size", str(int(parse_quantity(spec.shm_size)))),
        # memory-swap = memory: no swap, as the kubelet runs pods.
        *("--memory", memory, "--memory-swap", memory, "--cpus", cpus),
    ]
    if engine.name == "podman" and engine.rootless:
        # Rootless, the container's uid 1000 would be a subordinate id of the invoker's; map it
        # to the invoker instead, so files in the volumes are theirs.
        argv += ["--userns", f"keep-id:uid={TRAINER_UID},gid={TRAINER_UID}"]
    argv += [x for k, v in env.items() for x in ("--env", f"{k}={v}")]
    argv += [x for k in secret_names for x in ("--env", k)]  # the value: from our environment
    for m in volumes:
        if box.index == 0 or not m.rank0_only:
            argv += ["--volume", f"{m.source}:{m.target}{':ro' if m.read_only else ''}"]
    if gpus and engine.name == "podman":
        argv += [x for i in gpus for x in ("--device", f"nvidia.com/gpu={i}")]
    elif gpus:
        argv += ["--gpus", '"device=' + ",".join(str(i) for i in gpus) + '"']
    if working_dir:
        argv += ["--workdir", working_dir]
    command = container_command(spec)
    return [*argv, "--entrypoint", command[0], spec.image, *command[1:], *container_args(spec)]


def gpu_slices(spec: JobSpec, host_gpus: int) -> list[list[int]]:
    """Which of this machine's GPUs each node gets; UserError when there are not enough."""
    per_node = spec.resources.gpus
    if not per_node:
        return [[] for _ in range(spec.nodes)]
    if host_gpus == 0:
        raise UserError(
            f"resources.gpus: the spec asks for {per_node} GPU(s) per node and this machine has "
            "no NVIDIA GPU (got none from /proc/driver/nvidia/gpus or nvidia-smi). Run it where "
            "GPUs are, or on CPU with --set resources.gpus=0"
        )
    wanted = spec.nodes * per_node
    if wanted > host_gpus:
        raise UserError(
            f"resources.gpus: nodes ({spec.nodes}) x resources.gpus ({per_node}) = {wanted} "
            f"GPUs, and this machine has {host_gpus} (got {host_gpus}). Each node gets GPUs of "
            "its own, as each pod does: lower nodes or resources.gpus with --set"
        )
    return [list(range(i * per_node, (i + 1) * per_node)) for i in range(spec.nodes)]


def checkpoint_note(spec: JobSpec, workdir: str, volumes: list[Mount]) -> str | None:
    """A note when the trainer's checkpoints would land in no volume (lost with the container,
    as in a pod without a PVC); None when they do, go to object storage (``s3://``), or the
    spec's own args decide."""
    if spec.args is not None:
        return None
    configured = spec.trainer.checkpoint.dir
    if "://" in configured:
        return None
    path = PurePosixPath(workdir) / configured  # an absolute dir stays itself
    for m in volumes:
        target = PurePosixPath(m.target)
        if not m.read_only and (path == target or target in path.parents):
            return None
    return (
        f"note: trainer.checkpoint.dir {configured} ({path} in the container) is on no volume: "
        "checkpoints go with the containers, as in a pod without a PVC"
    )


# --------------------------------------------------------------------------------------------
# This machine: GPUs, and who owns the volume directories


def host_gpus() -> int:
    """NVIDIA GPUs on this machine (0 when there is no driver)."""
    proc_dir = Path("/proc/driver/nvidia/gpus")
    if proc_dir.is_dir():
        return len(list(proc_dir.iterdir()))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in proc.stdout.splitlines())


def check_cdi() -> None:
    """podman passes GPUs as CDI devices: an ``nvidia.com/gpu`` CDI spec must exist."""
    for d in CDI_DIRS:
        for f in sorted(d.glob("*")) if d.is_dir() else []:
            try:
                if "nvidia.com/gpu" in f.read_text(errors="replace"):
                    return
            except OSError:
                continue
    raise UserError(
        "resources.gpus: podman passes GPUs as CDI devices and finds no nvidia.com/gpu CDI spec "
        f"(got none in {', '.join(map(str, CDI_DIRS))}). Generate one: "
        "`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
    )


@dataclass
class Ownership:
    """How the volume directories are made writable by the containers' uid 1000 and given back
    to the invoking user afterwards."""

    #: chown -R these back to ``uid:gid`` after the run (we are root, rootful engine).
    hand_back: list[Path]
    uid: int
    gid: int
    #: Said after the run: the files are not the invoker's and could not be made so.
    after_note: str | None = None


def hand_over(volumes: list[Mount], engine: Engine) -> Ownership:
    """Make each writable volume directory writable by the containers' uid 1000.

    - rootless podman maps uid 1000 to the invoker (``--userns keep-id``): nothing to do;
    - the invoker is uid 1000: nothing to do (a rootful engine maps 1000 to 1000);
    - the invoker is root (rootful engine): chown -R 1000:1000 now, back to root after the run
      (and by the janitor if we are killed), so the trainer can also resume from and prune
      what an earlier run left;
    - anyone else: the directories become mode 0777; what the containers write belongs to uid
      1000 (or the engine's mapping of it), and we say so after the run.
    """
    uid, gid = os.getuid(), os.getgid()
    writable = [m.host_dir for m in volumes if not m.read_only]
    own = Ownership([], uid, gid)
    if (engine.name == "podman" and engine.rootless) or uid == TRAINER_UID or not writable:
        return own
    if uid == 0 and not engine.rootless:
        try:
            for d in writable:
                chown_tree(d, TRAINER_UID, TRAINER_UID)
            own.hand_back = writable
            return own
        except OSError:  # e.g. a root-squashed NFS: fall back to open modes below
            give_back(Ownership(writable, uid, gid))
    try:
        for d in writable:
            for parent, dirs, _ in os.walk(d):
                for name in (".", *dirs):
                    os.chmod(os.path.join(parent, name), 0o777)
    except OSError as e:
        raise UserError(
            f"volumes: {e.filename} cannot be made writable for the image's uid {TRAINER_UID} "
            f"(got {e.strerror}). Make it writable, or remove it and let the run create it"
        ) from None
    own.after_note = (
        f"note: what the containers wrote in {', '.join(map(str, writable))} belongs to uid "
        f"{TRAINER_UID}, the image's user as {engine.name} maps it, not to you (uid {uid})"
    )
    return own


def give_back(own: Ownership) -> None:
    """chown -R the handed-over directories back to the invoker (as far as it goes)."""
    for d in own.hand_back:
        with contextlib.suppress(OSError):
            chown_tree(d, own.uid, own.gid)


# --------------------------------------------------------------------------------------------
# The run


def run_container(
    spec: JobSpec,
    *,
    engine: str = "auto",
    logs_dir: str | Path | None = None,
    grace_s: float | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    workdir: LocalWorkdir | None = None,
) -> int:
    """Run ``spec``'s nodes as containers of its image; 0 when every node exits 0, 128+signal
    when stopped, JobFailed else. UserError (nothing started) for a missing engine, image,
    secret or GPU. ``workdir``: mounted at /workdir, the containers' working directory, as a
    pod's unpacked workdir is."""
    say = _sayer(err or sys.stderr)
    grace_s = grace_s_of(spec, grace_s)
    extra_env = node_env(spec, grace_s)
    chosen, gpus, workdir_in_image = _preflight(spec, engine)
    working_dir = WORKDIR_PATH if workdir is not None else None
    if workdir is not None:
        extra_env.update(workdir.env(spec, at=WORKDIR_PATH))
    _say_reaped(reap(chosen), say)

    run_id = secrets.token_hex(3)
    network = f"ddpjob-{spec.name}-{run_id}"
    nodes = boxes(spec, run_id)
    logs = Path(logs_dir) if logs_dir else Path("runs") / spec.name / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    volumes = mounts(spec, Path("runs") / spec.name / "volumes")
    for m in volumes:
        m.source.mkdir(parents=True, exist_ok=True)
    if workdir is not None:
        volumes.append(Mount(WORKDIR_VOLUME, workdir.path, workdir.path, WORKDIR_PATH, False))
    own, janitor = Ownership([], os.getuid(), os.getgid()), None
    try:
        own = hand_over(volumes, chosen)
        janitor = Janitor(
            {
                "engine": {"name": chosen.name, "path": chosen.path, "rootless": chosen.rootless},
                "containers": [b.container for b in nodes],
                "networks": [network],
                "grace_s": grace_s,
                "hand_back": {"dirs": [*map(str, own.hand_back)], "uid": own.uid, "gid": own.gid},
            }
        )
        owner = owner_id()
        _create_network(chosen, network, run_id=run_id, owner=owner, job=spec.name)
        secrets_ = {k: extra_env[k] for k in spec.secret_env}
        plain = {k: v for k, v in extra_env.items() if k not in secrets_}
        host_cpus = os.cpu_count() or 1
        argvs = [
            run_argv(
                chosen, spec, box, run_id=run_id, network=network, owner=owner,
                env={**launcher_env(spec, box.index), **plain}, secret_names=[*secrets_],
                volumes=volumes, gpus=gpus[box.index], cpus=cpus(spec, host_cpus),
                working_dir=working_dir,
            )
            for box in nodes
        ]  # fmt: skip
        _say_plan(say, spec, chosen, network, nodes, volumes, working_dir or workdir_in_image, logs)
        client_env = {**os.environ, **secrets_}  # `--env NAME` takes its value from here
        progress = Progress(out or sys.stdout)
        runner = _ContainerRunner(spec, chosen, nodes, argvs, client_env, logs, progress)
        with _signals_to(runner):
            runner.start()
            runner.wait(grace_s)
        return runner.outcome(say)
    finally:
        remove(chosen, [b.container for b in nodes], [network])
        give_back(own)
        if janitor is not None:
            janitor.dismiss()
        if own.after_note:
            say(own.after_note)


def _preflight(spec: JobSpec, choice: str) -> tuple[Engine, list[list[int]], str]:
    """The engine, each node's GPUs and the image's workdir; UserError before anything runs."""
    engine = find_engine(choice)
    gpus = gpu_slices(spec, host_gpus() if spec.resources.gpus else 0)
    if spec.resources.gpus and engine.name == "podman":
        check_cdi()
    workdir = engine.image_workdir(spec.image)
    if workdir is None:
        raise UserError(
            f"image: {spec.image} is not among {engine.name}'s local images (got no image by "
            f"that name; nothing is pulled). Build it (`make image IMAGE=... TAG=...`) or "
            f"`{engine.name} pull {spec.image}`, or use another with --set image=REF"
        )
    return engine, gpus, workdir


def _create_network(engine: Engine, network: str, *, run_id: str, owner: str, job: str) -> None:
    proc = engine.call(
        "network", "create", "--label", f"{LABEL_RUN}={run_id}",
        "--label", f"{LABEL_OWNER}={owner}", "--label", f"{LABEL_JOB}={job}", network,
    )  # fmt: skip
    if proc.returncode != 0:
        raise EngineFailed(
            f"run --container: {engine.name} network create {network} failed (got "
            f"{(proc.stderr or proc.stdout).strip()})"
        )


def _say_plan(
    say: Any,
    spec: JobSpec,
    engine: Engine,
    network: str,
    nodes: list[Box],
    volumes: list[Mount],
    workdir: str,
    logs: Path,
) -> None:
    """What the run is about to do, where its volumes and logs are: a few lines on stderr."""
    port = TRAINJOB_MASTER_PORT if spec.api == "trainjob" else PORT
    say(
        f"run --local --container {spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node} "
        f"process(es), world size {spec.world_size}, image {spec.image} "
        f"({engine.name}{', rootless' if engine.rootless else ''})"
    )
    say(
        f"network {network}: {'rendezvous' if spec.elastic else 'master'} "
        f"{nodes[0].aliases[-1]}:{port}; containers {', '.join(b.container for b in nodes)}"
    )
    host_cpus = os.cpu_count() or 1
    if parse_quantity(spec.resources.cpu) > host_cpus:
        say(f"cpu: {spec.resources.cpu} per node, capped at this machine's {host_cpus}")
    for m in volumes:
        mode = ", read-only" if m.read_only else ""
        say(f"volume {m.volume}: {_shown(m.source)} at {m.target}{mode}")
    note = checkpoint_note(spec, workdir, volumes)
    if note:
        say(note)
    say(f"logs: {logs}/rank-{{0..{spec.nodes - 1}}}.log")


def cleanup(engine: str = "auto", err: IO[str] | None = None) -> int:
    """``run --cleanup``: remove what runs whose controller is gone left behind."""
    say = _sayer(err or sys.stderr)
    reaped = reap(find_engine(engine))
    if not _say_reaped(reaped, say):
        say("run --cleanup: nothing left behind by earlier runs")
    for run, owner in sorted(reaped.live.items()):
        pid = owner.split("/")[1] if owner.count("/") == 2 else owner
        say(f"left run {run} alone: its controller (pid {pid}) is still running")
    return 0


def _say_reaped(reaped: Any, say: Any) -> bool:
    if not reaped.runs:
        return False
    say(
        f"removed {reaped.containers} container(s) and {reaped.networks} network(s) left by "
        f"{len(reaped.runs)} earlier run(s) whose controller is gone ({', '.join(reaped.runs)})"
    )
    return True


class _ContainerRunner(_Runner):
    """``run --local``'s runner with a container per node: started by ``<engine> run``, stopped
    through the engine (the client's exit status is the container's)."""

    def __init__(
        self,
        spec: JobSpec,
        engine: Engine,
        nodes: list[Box],
        argvs: list[list[str]],
        client_env: dict[str, str],
        logs: Path,
        progress: Progress,
    ):
        super().__init__(spec, argvs[0], {}, PORT, logs, progress)
        self.engine, self.boxes, self.argvs, self.client_env = engine, nodes, argvs, client_env
        self.stopper: threading.Thread | None = None
        self.killed = False
        # A PyTorchJob's workers wait for the master (the operator's init container); an
        # elastic job's and a TrainJob's pods start together and meet at the rendezvous.
        self.master_first = spec.api == "pytorchjob" and not spec.elastic

    def start(self) -> None:
        for box, argv in zip(self.boxes, self.argvs, strict=True):
            if box.index == 1 and self.master_first and not self._master_up():
                return  # the master failed, or we were told to stop: start no more
            log_path = self.logs / f"rank-{box.index}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
            try:
                proc = subprocess.Popen(
                    argv,
                    env=self.client_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # Ctrl-C reaches us; we stop the containers
                )
            except OSError as e:
                log.close()
                self._kill()
                raise UserError(
                    f"run --container: cannot start {argv[0]} ({e.strerror}). Check the engine"
                ) from None
            node = Node(box.index, proc, log_path, log)
            self.nodes.append(node)
            self._thread(self._watch, node)
            self._thread(self._pump, node, proc.stdout)
            self._thread(self._pump, node, proc.stderr)

    def _master_up(self) -> bool:
        """Wait until the master's container runs (from then on its name resolves), as the
        operator's init container holds each worker until ``<name>-master-0`` resolves."""
        master, name = self.nodes[0], self.boxes[0].container
        while not self.signalled and master.proc.poll() is None:
            running = self.engine.call(
                "container", "inspect", "--format", "{{.State.Running}}", name
            )
            if running.stdout.strip() == "true":
                return True
            time.sleep(0.2)
        return not self.signalled and master.proc.poll() == 0

    def _terminate(self) -> None:
        # SIGTERM to each container's PID 1, as the kubelet sends it. A container still being
        # created cannot take a signal yet: keep asking until it has, or has ended.
        if self.stopper is None:
            self.stopper = threading.Thread(target=self._term_until_taken, daemon=True)
            self.stopper.start()

    def _term_until_taken(self) -> None:
        pending = {node.index for node in self.nodes}
        while pending and not self.killed:
            for node in self.nodes:
                if node.index not in pending:
                    continue
                name = self.boxes[node.index].container
                if node.proc.poll() is not None or (
                    self.engine.call("kill", "--signal", "TERM", name).returncode == 0
                ):
                    pending.discard(node.index)
            if pending:
                time.sleep(0.5)

    def _kill(self) -> None:
        # SIGKILL to the containers (the client's exit status becomes 137), then the clients.
        self.killed = True
        self.engine.call("kill", *(b.container for b in self.boxes[: len(self.nodes)]))
        super()._kill()

    def outcome(self, say: Any) -> int:
        try:
            return super().outcome(say)
        except JobFailed as e:
            hint = _engine_hint(self.engine, self.failed.exit_code if self.failed else None, e)
            if hint:
                raise JobFailed(f"{e}\n{hint}") from None
            raise


def _engine_hint(engine: Engine, code: int | None, err: JobFailed) -> str:
    """What to do when the engine, not the trainer, failed a node (exit 125/126/127)."""
    text = str(err)
    if code not in (125, 126, 127):
        return ""
    if "error setting rlimit" in text:
        return (
            f"{engine.name} could not set the container's rlimits here (no CAP_SYS_RESOURCE): "
            "point CONTAINERS_CONF at a containers.conf with `default_ulimits = []` under "
            "[containers] (this repository's tools/containers.conf has it)"
        )
    if code == 125:
        return f"exit 125 is {engine.name}'s own: it could not create or start the container"
    if code == 127:
        return "exit 127: the spec's command was not found in the image (check command:)"
    return (
        "exit 126: the spec's command could not be invoked in the image, or the runtime "
        "refused to start it (see the Error: line above)"
    )


def _decimal(value: Decimal) -> str:
    return format(value.normalize(), "f")  # 2, 0.5: never 2E+0


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (as the logs line)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
