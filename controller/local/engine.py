"""The container engine on this machine, docker or podman, driven through its CLI.

    engine = find_engine("auto")    # docker where a daemon answers, else podman; UserError if none
    engine.image_workdir(ref)       # None: the image is not in the engine's local store
    reap(engine)                    # objects of runs whose controller process is gone

``run --local --container`` (controller/local/container.py) is the one user. Every container and
network a run creates carries :data:`LABEL_RUN` (the run id) and :data:`LABEL_OWNER` (which
controller process owns it), so leftovers of a controller that was killed can be told apart
from those of a run still going, and removed.

podman on some hosts needs its own settings (e.g. ``default_ulimits = []`` where setting rlimits
is refused): they come from the caller's ``CONTAINERS_CONF``, which the engine's CLI reads.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Any

from controller.errors import UserError

#: The run id, on every container and network of one ``run --local --container``.
LABEL_RUN = "io.ddpjob.local-run"
#: ``<host>/<pid>/<start>`` of the controller that owns the run (see :func:`owner_id`).
LABEL_OWNER = "io.ddpjob.owner"
#: The spec's name (what ``podman ps --filter label=io.ddpjob.job=NAME`` finds).
LABEL_JOB = "io.ddpjob.job"

ENGINES = ("docker", "podman")
#: A daemon that takes longer than this to answer ``docker info`` counts as absent.
PROBE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Engine:
    """A container engine's CLI: ``docker`` (a daemon answered) or ``podman``."""

    name: str
    path: str
    #: The engine runs without root: container uids map to the invoker's subordinate ids.
    rootless: bool = False

    def argv(self, *args: str) -> list[str]:
        return [self.path, *args]

    def call(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``<engine> args``; never raises for a non-zero exit (callers read returncode)."""
        try:
            return subprocess.run(
                self.argv(*args),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(self.argv(*args), 124, "", "timed out")

    def image_workdir(self, ref: str) -> str | None:
        """The image's working directory ("/" when unset), or None when the engine's local store
        has no image ``ref`` (nothing is ever pulled)."""
        proc = self.call("image", "inspect", "--format", "{{.Config.WorkingDir}}", ref)
        if proc.returncode != 0:
            return None
        return proc.stdout.strip() or "/"


def find_engine(choice: str = "auto") -> Engine:
    """docker when its daemon answers, else podman (``choice`` forces one); UserError if none."""
    why: dict[str, str] = {}
    if choice in ("auto", "docker"):
        docker = shutil.which("docker")
        if docker is None:
            why["docker"] = "not on PATH"
        else:
            proc = Engine("docker", docker).call(
                "info", "--format", "{{json .SecurityOptions}}", timeout_s=PROBE_TIMEOUT_S
            )
            if proc.returncode == 0:
                return Engine("docker", docker, rootless="rootless" in proc.stdout)
            why["docker"] = _first_line(proc.stderr) or f"docker info exited {proc.returncode}"
    if choice in ("auto", "podman"):
        podman = shutil.which("podman")
        if podman is not None:
            # podman has no daemon to ask: run by a non-root user it is rootless.
            return Engine("podman", podman, rootless=os.geteuid() != 0)
        why["podman"] = "not on PATH"
    got = "; ".join(f"{name}: {text}" for name, text in why.items())
    if choice == "auto":
        raise UserError(
            f"run --container: no container engine here (got {got}). Install podman or start "
            "the Docker daemon, or run without --container"
        )
    other = "podman" if choice == "docker" else "docker"
    raise UserError(
        f"--engine: {choice} cannot run containers here (got {got}). "
        f"Use --engine {other} or --engine auto"
    )


# --------------------------------------------------------------------------------------------
# Owners: which controller process a run's objects belong to


def owner_id(pid: int | None = None) -> str:
    """``<host>/<pid>/<start>`` of a process: its start time (clock ticks since boot, from
    /proc) tells a reused pid from the original; 0 where there is no /proc."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{_start_ticks(pid) or 0}"


def owner_alive(owner: str) -> bool:
    """Whether the process an owner label names still runs. Another host's owner, or a label
    that cannot be read, counts as alive: never remove what may be someone else's run."""
    try:
        host, pid_text, start_text = owner.split("/")
        pid, start = int(pid_text), int(start_text)
    except ValueError:
        return True
    if host != socket.gethostname():
        return True
    if start:
        return _start_ticks(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime), counted after the command name, which may hold spaces and ")".
    return int(stat.rpartition(")")[2].split()[19])


# --------------------------------------------------------------------------------------------
# Finding and removing a run's objects


@dataclass
class Found:
    """Labelled containers and networks, by run id: what :func:`reap` saw."""

    containers: dict[str, list[str]] = field(default_factory=dict)  # run id -> container names
    networks: dict[str, list[str]] = field(default_factory=dict)  # run id -> network names
    owners: dict[str, str] = field(default_factory=dict)  # run id -> owner label

    @property
    def runs(self) -> list[str]:
        return sorted(set(self.containers) | set(self.networks))


def find_runs(engine: Engine, run_id: str | None = None) -> Found:
    """Every container and network labelled as a ``run --local --container`` object (or only
    those of ``run_id``)."""
    selector = f"{LABEL_RUN}={run_id}" if run_id else LABEL_RUN
    found = Found()
    # podman: one JSON array; docker: `{{json .}}` is one object a line (its `--format json`
    # needs docker 23).
    fmt = "json" if engine.name == "podman" else "{{json .}}"
    proc = engine.call("ps", "-a", "--filter", f"label={selector}", "--format", fmt)
    for item in _json_items(proc.stdout if proc.returncode == 0 else ""):
        labels = _labels(item.get("Labels"))
        names = item.get("Names")
        name = names[0] if isinstance(names, list) else str(names or item.get("ID", ""))
        run = labels.get(LABEL_RUN, "")
        found.containers.setdefault(run, []).append(name)
        found.owners.setdefault(run, labels.get(LABEL_OWNER, ""))
    proc = engine.call("network", "ls", "--filter", f"label={selector}", "-q")
    ids = proc.stdout.split() if proc.returncode == 0 else []
    if ids:
        proc = engine.call("network", "inspect", *ids)
        for item in _json_items(proc.stdout if proc.returncode == 0 else ""):
            labels = _labels(item.get("Labels", item.get("labels")))
            run = labels.get(LABEL_RUN, "")
            found.networks.setdefault(run, []).append(str(item.get("Name", item.get("name"))))
            found.owners.setdefault(run, labels.get(LABEL_OWNER, ""))
    return found


def remove(engine: Engine, containers: list[str], networks: list[str], grace_s: float = 0) -> None:
    """Stop (SIGTERM, then SIGKILL after ``grace_s``) and remove containers, then networks."""
    if containers:
        if grace_s > 0:
            engine.call("stop", "-t", str(int(grace_s)), *containers, timeout_s=grace_s + 60)
        force = ["-f", "-t", "0"] if engine.name == "podman" else ["-f"]
        engine.call("rm", *force, *containers)
    if networks:
        engine.call("network", "rm", *(["-f"] if engine.name == "podman" else []), *networks)


@dataclass
class Reaped:
    """What :func:`reap` removed, and the runs it left alone because their owner lives."""

    runs: list[str] = field(default_factory=list)
    containers: int = 0
    networks: int = 0
    live: dict[str, str] = field(default_factory=dict)  # run id -> owner


def reap(engine: Engine) -> Reaped:
    """Remove the containers and networks of every run whose controller process is gone."""
    found = find_runs(engine)
    out = Reaped()
    for run in found.runs:
        owner = found.owners.get(run, "")
        if owner_alive(owner):
            out.live[run] = owner
            continue
        containers, networks = found.containers.get(run, []), found.networks.get(run, [])
        remove(engine, containers, networks)
        out.runs.append(run)
        out.containers += len(containers)
        out.networks += len(networks)
    return out


def _json_items(text: str) -> list[dict[str, Any]]:
    """podman prints one JSON array; docker one JSON object per line."""
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    items = data if isinstance(data, list) else [data]
    return [x for x in items if isinstance(x, dict)]


def _labels(value: Any) -> dict[str, str]:
    """Labels as a dict: podman gives a mapping, ``docker ps`` a ``k=v,k=v`` string."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        pairs = (part.partition("=") for part in value.split(",") if part)
        return {k: v for k, _, v in pairs}
    return {}


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
