"""Process bookkeeping for the local cluster: the state file, spawning (also in a mount namespace
of its own), and stopping exactly what was started.

A process is recorded with its kernel start time beside its pid, so a recycled pid is never
signalled. ``up`` and ``down`` serialise on a file lock per checkout, so two pytest sessions (or
make and pytest) never start or stop the cluster at the same time.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from tools.cache import cache_dir, file_lock


class LocalkubeError(RuntimeError):
    """The local cluster could not be built, started, reached or stopped."""


#: Where :func:`free_ports` looks: below the kernel's ephemeral range (``ip_local_port_range``),
#: the NodePort range (30000-32767) and the ports torch and Kubeflow use by default (23456,
#: 29400, 29500), which a test or a user's torchrun on this machine may ask for by number.
PORTS_FROM, PORTS_TO = 20000, 23400


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))  # every address: a component may listen on any of them
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free now, outside the kernel's ephemeral range.

    The components bind them up to a minute later. A port from the ephemeral range (the
    kernel's pick for ``bind(0)``) can meanwhile become the local end of any outgoing
    connection on the machine, and the component then fails to start ("bind: address already
    in use"). Nothing takes a port below that range without asking for it by number."""
    low = min(_ephemeral_range()[0], PORTS_TO)
    pool = list(range(PORTS_FROM, low))
    random.shuffle(pool)
    picked = [p for p in pool[: 50 * n] if _bindable(p)][:n]
    if len(picked) < n:
        raise LocalkubeError(
            f"localkube: no {n} free TCP ports from {PORTS_FROM} to {low} for the cluster's "
            "components. Free some of them; if the kernel's ephemeral range "
            f"(net.ipv4.ip_local_port_range) starts below {PORTS_TO}, start it at {PORTS_TO} "
            "or above."
        )
    return picked


def proc_start_time(pid: int) -> str | None:
    """The kernel start time of ``pid`` (field 22 of /proc/pid/stat), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def _lock_path(repo: Path) -> Path:
    digest = hashlib.sha256(str(repo).encode()).hexdigest()[:12]
    base = cache_dir() / "locks"
    base.mkdir(parents=True, exist_ok=True)
    return base / f"cluster-{digest}.lock"


def state_lock(repo: Path):
    """Serialise up/down between processes (two pytest sessions, make and pytest)."""
    return file_lock(_lock_path(repo))


class StateFile:
    """``state.json``: what ``up`` started (pids with start times, argv), ports, paths."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def write(self, state: dict) -> None:
        """Replace the file atomically (a reader never sees half of it)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.path)


def base_env() -> dict[str, str]:
    """The environment of every component: ours without KUBECONFIG, at most 2 Go threads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env.setdefault("GOMAXPROCS", "2")
    return env


def spawn(
    argv: list[str], log_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, dict]:
    """Start ``argv`` in its own session, output appended to ``log_path``.

    Returns the process and its record for the state file: pid, start time, argv.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env or base_env(),
            start_new_session=True,
        )
    start = None
    for _ in range(50):
        start = proc_start_time(proc.pid)
        if start:
            break
        time.sleep(0.01)
    return proc, {"pid": proc.pid, "start": start, "argv": argv}


def in_private_mounts(
    binds: list[tuple[Path, Path]], keep: list[Path], argv: list[str]
) -> list[str]:
    """``argv`` run in a mount namespace of its own where each ``(source, target)`` of
    ``binds`` is bind-mounted over its target, and each folder of ``keep`` (the files the
    command reads: its binary's folder, its state) still shows what it shows here.

    Every source and kept folder is opened before the first bind and mounted from that open
    handle, so no bind can hide another's source, whatever the order; a kept folder that a bind
    covered (a checkout under /tmp, when /tmp is a bind's target) is bound back at its own path.
    The host sees none of these mounts. Without root, a user namespace makes them allowed.
    """
    plan = json.dumps(
        {"binds": [[str(s), str(t)] for s, t in binds], "keep": [str(k) for k in keep]}
    )
    as_root = [] if os.geteuid() == 0 else ["--map-root-user"]
    run = "import sys; from localkube.procs import mount_and_exec; mount_and_exec(sys.argv[1:])"
    return ["unshare", "--mount", *as_root, "--", sys.executable, "-c", run, plan, *argv]


_MS_BIND = 4096


def mount_and_exec(args: list[str]) -> NoReturn:
    """The inside of :func:`in_private_mounts` (``args``: the plan, then the command): open,
    bind, bind back what was covered, exec. Exits 1 with one line when a mount fails."""
    plan, argv = json.loads(args[0]), args[1:]
    binds = [(source, target) for source, target in plan["binds"]]
    keep = sorted(plan["keep"], key=len)  # a parent first: binding it back may uncover a child
    libc = ctypes.CDLL(None, use_errno=True)
    handles = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in {s for s, _ in binds} | set(keep)}

    def bind(path: str, target: str) -> None:
        source = f"/proc/self/fd/{handles[path]}".encode()
        if libc.mount(source, target.encode(), None, _MS_BIND, None) != 0:
            why = os.strerror(ctypes.get_errno())
            sys.exit(f"localkube: cannot bind {path} over {target} ({why}) for {argv[0]}")

    for source, target in binds:
        bind(source, target)
    for path in keep:
        try:
            covered = not os.path.samestat(os.stat(path), os.fstat(handles[path]))
        except FileNotFoundError:
            covered = True
        if covered:
            os.makedirs(path, exist_ok=True)  # inside a bind's source, never on the host's own
            bind(path, path)
    os.execvp(argv[0], argv)


def dead(processes: dict[str, dict]) -> list[str]:
    """Names of recorded processes that are gone or whose pid now belongs to another."""
    return [n for n, info in processes.items() if proc_start_time(info["pid"]) != info["start"]]


def terminate(pid: int, start: str, timeout_s: float, say=None, name: str = "") -> None:
    """SIGTERM ``pid`` if it is still the recorded process; SIGKILL after ``timeout_s``."""
    if proc_start_time(pid) != start:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc_start_time(pid) != start:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if say is not None:
        say(f"{name} (pid {pid}) ignored SIGTERM for {timeout_s:.0f}s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def memory_mib(processes: dict[str, dict], field: str) -> dict[str, float]:
    """``field`` (``Pss`` from smaps_rollup or ``VmRSS`` from status) of each live process, MiB.

    The components share one binary, so RSS counts its text pages once per process and PSS
    does not: PSS is what the cluster really costs.
    """
    out: dict[str, float] = {}
    source = "smaps_rollup" if field == "Pss" else "status"
    for name, info in processes.items():
        try:
            text = Path(f"/proc/{info['pid']}/{source}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(f"{field}:"):
                out[name] = int(line.split()[1]) / 1024
    return out
