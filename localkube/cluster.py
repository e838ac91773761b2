"""Start and stop the local Kubernetes cluster on 127.0.0.1.

State lives in ``<repo>/.cluster/``: ``kubeconfig`` (admin), ``state.json`` (the pids this module
started, with their start times so a recycled pid is never signalled), ``logs/``, ``pki/``,
``etcd/``. ``up()`` is idempotent: with a live cluster it only
prints the export line. ``down()`` stops exactly the recorded processes and removes the state.

What runs, in what order: ``sequence.py`` (each room's components say how they start and how
each is probed). Pids, the state file and the lock: ``procs.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.cache import cache_dir

from . import procs, versions
from .addons import kueue
from .builds import gotools
from .controlplane import bootstrap
from .controlplane.context import Component, Context, Step, http_get
from .procs import LocalkubeError, StateFile, proc_start_time, state_lock
from .sequence import FINAL_PROBES, HOST_CHECKS, HOST_RESETS, SEQUENCE, components, port_names

REPO_ROOT = Path(__file__).resolve().parents[1]
STATE_DIR_NAME = ".cluster"


@dataclass
class ControlPlane:
    """The local cluster rooted at ``repo/.cluster``."""

    repo: Path = REPO_ROOT
    log: object = field(default=sys.stderr)

    def __post_init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    @property
    def state_dir(self) -> Path:
        return self.repo / STATE_DIR_NAME

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state(self) -> StateFile:
        return StateFile(self.state_dir / "state.json")

    def say(self, message: str) -> None:
        print(f"[localkube] {message}", file=self.log, flush=True)

    def read_state(self) -> dict | None:
        return self.state.read()

    # ------------------------------------------------------------------ liveness

    def is_live(self) -> bool:
        """True when the recorded processes all run and the API server is ready."""
        state = self.read_state()
        if not state or not self.kubeconfig.exists():
            return False
        if set(state.get("processes", {})) != {c.name for c in components()}:
            return False
        if procs.dead(state["processes"]):
            return False
        try:
            return http_get(f"{state['server']}/readyz", self._context(state).admin_ssl()) == "ok"
        except Exception:  # refused, TLS, timeout: not live
            return False

    def export_line(self) -> str:
        return f"export KUBECONFIG={self.kubeconfig}"

    # ------------------------------------------------------------------ up

    def up(self, owner: str = "cli", lease: bool = False) -> dict:
        """Build missing tools, start everything, wait until ready; no-op when already live.

        ``owner`` is recorded when this call starts the cluster: "cli" (``make cluster-up``,
        stopped only by ``make cluster-down``) or "fixture" (stopped by the last pytest
        session using it). With ``lease`` this process registers as a user of the cluster.
        """
        with state_lock(self.repo):
            live = self.is_live()
            if live and self._outdated(self.read_state()):
                users = self._other_sessions()
                if users:
                    self.say(
                        f"running cluster predates the current harness/tools; kept for "
                        f"sessions {', '.join(users)} (run `make cluster-down` later)"
                    )
                else:
                    self.say("running cluster predates the current harness/tools; restarting")
                    live = False
                    if self.read_state().get("owner") == "cli":
                        owner = "cli"  # still stopped only by `make cluster-down`
            if live:
                self.say("already up")
                state = self.read_state()
                if owner == "cli" and state.get("owner") != "cli":
                    # `make cluster-up` adopts a fixture-started cluster: only cluster-down
                    # stops it now, not the end of the test session that started it.
                    state["owner"] = "cli"
                    self.state.write(state)
            else:
                state = self.read_state()
                if state:
                    self.say("stale state found; stopping what it recorded")
                    self._stop(state)
                try:
                    state = self._up(owner)
                except BaseException:
                    # Stop what this attempt started; keep .cluster/logs for the post-mortem.
                    partial = self.read_state()
                    if partial:
                        self._stop(partial)
                        self.state.path.unlink(missing_ok=True)
                    raise
            if lease:
                self._lease_path(os.getpid()).parent.mkdir(exist_ok=True)
                self._lease_path(os.getpid()).write_text(proc_start_time(os.getpid()) or "")
            return state

    def _outdated(self, state: dict) -> bool:
        """True when the running cluster was started from other tools or harness code."""
        return (
            state.get("tools") != str(gotools.tools_dir())
            or state.get("harness") != _harness_hash()
        )

    def _other_sessions(self) -> list[str]:
        """Pids of other live processes holding a lease on the cluster."""
        users = []
        for path in (self.state_dir / "sessions").glob("*"):
            if (
                int(path.name) != os.getpid()
                and proc_start_time(int(path.name)) == path.read_text()
            ):
                users.append(path.name)
        return users

    def _lease_path(self, pid: int) -> Path:
        return self.state_dir / "sessions" / str(pid)

    def release(self) -> bool:
        """Drop this process's lease; stop the cluster if a fixture started it and no other
        live session holds a lease. Return True when the cluster was stopped."""
        with state_lock(self.repo):
            self._lease_path(os.getpid()).unlink(missing_ok=True)
            state = self.read_state()
            if not state or state.get("owner") != "fixture":
                return False
            others = self._other_sessions()
            if others:
                self.say(f"left running for sessions {', '.join(others)}")
                return False
            self._down_locked()
            return True

    def _context(self, state: dict) -> Context:
        from .controlplane.pki import PKI

        return Context(
            repo=self.repo,
            state_dir=self.state_dir,
            bindir=Path(state["tools"]) / "bin",
            manifests=Path(state["tools"]) / "manifests",
            ports=state["ports"],
            pki=PKI.load(Path(state["pki"])),
            kubectl=self.kubectl,
        )

    def _up(self, owner: str = "cli") -> dict:
        t0 = time.monotonic()
        for check in HOST_CHECKS:
            check(self.repo)
        built = gotools.build(self.log)
        if built:
            self.say("built " + ", ".join(f"{k} {v:.0f}s" for k, v in built.items()))
        t_ready = time.monotonic()
        self._reset_host()
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        names = port_names()
        ports = dict(zip(names, procs.free_ports(len(names)), strict=True))
        state: dict = {
            "server": f"https://127.0.0.1:{ports['apiserver']}",
            "ports": ports,
            "pki": str(self.state_dir / "pki"),
            "tools": str(gotools.tools_dir()),
            "versions": versions.VERSIONS,
            "nodes": list(bootstrap.KWOK_NODES),
            "owner": owner,
            "harness": _harness_hash(),
            "processes": {},
        }
        self.state.write(state)
        bootstrap.issue_credentials(self.state_dir, state["server"])
        ctx = self._context(state)
        timings: dict[str, float] = {}
        started_at: dict[str, float] = {}
        started: list[Component] = []
        later: list[Component] = []
        for entry in SEQUENCE:
            t = time.monotonic()
            if isinstance(entry, Step):
                entry.run(ctx)
                timings[entry.name] = time.monotonic() - t
                continue
            started_at[entry.name] = round(time.monotonic() - t_ready, 2)
            self._start(state, ctx, entry)
            started.append(entry)
            if entry.wait == "now":
                timings[entry.name] = self._wait(entry.name, entry, ctx, started)
            else:
                later.append(entry)
        t = time.monotonic()
        ready_at: dict[str, float] = {}
        for entry in later:
            self._wait(entry.name, entry, ctx, started)
            ready_at[entry.name] = round(time.monotonic() - t_ready, 2)
        for what, probe in FINAL_PROBES:
            self._poll(what, lambda p=probe: p(ctx), 60, started)
        timings["components-ready"] = time.monotonic() - t
        state["timings"] = {k: round(v, 2) for k, v in timings.items()}
        # Seconds after the start (tools built) each component was started and was ready.
        state["started_at"], state["ready_at"] = started_at, ready_at
        state["up_seconds"] = round(time.monotonic() - t_ready, 2)
        state["total_seconds"] = round(time.monotonic() - t0, 2)
        self.state.write(state)
        self.say(f"ready in {state['up_seconds']:.1f}s (kubeconfig {self.kubeconfig})")
        if not kueue.ENABLED:
            self.say(kueue.DISABLED_HINT)
        return state

    def _start(self, state: dict, ctx: Context, component: Component) -> None:
        if component.prepare is not None:
            component.prepare(ctx)
        env = None
        if component.env is not None:
            env = {**procs.base_env(), **component.env(ctx)}
        proc, record = procs.spawn(
            component.argv(ctx), self.state_dir / "logs" / f"{component.name}.log", self.repo, env
        )
        self._children[component.name] = proc
        state["processes"][component.name] = record
        self.state.write(state)

    def _check_running(self, names: list[Component]) -> None:
        for component in names:
            proc = self._children.get(component.name)
            if proc is not None and proc.poll() is not None:
                log = self.state_dir / "logs" / f"{component.name}.log"
                tail = log.read_text(errors="replace")[-3000:]
                raise LocalkubeError(
                    f"localkube: {component.name} exited during start-up "
                    f"(got exit {proc.returncode}). Last log lines:\n{tail}"
                )

    def _wait(
        self, what: str, component: Component, ctx: Context, started: list[Component]
    ) -> float:
        return self._poll(what, lambda: component.ready(ctx), component.timeout_s, started)

    def _poll(self, what: str, probe, timeout_s: float, started: list[Component]) -> float:
        """Poll ``probe()`` until truthy; return the seconds waited. While waiting, a started
        component that exits fails the start with its last log lines."""
        start = time.monotonic()
        last_err: object = None
        while time.monotonic() - start < timeout_s:
            self._check_running(started)
            try:
                if probe():
                    return time.monotonic() - start
            except Exception as exc:  # not ready yet: refused, 503, kubectl error
                last_err = exc
            time.sleep(0.2)
        raise LocalkubeError(
            f"localkube: {what} not ready after {timeout_s:.0f}s (got {last_err!r}). "
            f"See {self.state_dir / 'logs'}."
        )

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster (admin credentials)."""
        argv = [str(gotools.bin_path("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise LocalkubeError(
                f"localkube: kubectl {' '.join(args)} failed (got exit {proc.returncode}): "
                f"{proc.stderr.strip()}"
            )
        return proc

    # ------------------------------------------------------------------ one component

    def restart_component(self, name: str, down_s: float = 0.0) -> float:
        """Stop one component (SIGTERM, SIGKILL after 3 s), leave it down ``down_s`` seconds,
        start it again with its recorded argv and wait until it is ready. The state file keeps
        the new pid, so ``down`` still stops it. Returns the seconds it was unavailable.

        For fault tests: an API server restart under a running watch or log stream.
        """
        component = next(c for c in components() if c.name == name)
        t0 = time.monotonic()
        with state_lock(self.repo):
            state = self.read_state()
            info = state["processes"][name]
        procs.terminate(info["pid"], info["start"], 3.0)
        for _ in range(200):
            if proc_start_time(info["pid"]) != info["start"]:
                break
            time.sleep(0.05)
        time.sleep(down_s)
        env = None
        if component.env is not None:
            env = {**procs.base_env(), **component.env(self._context(state))}
        proc, record = procs.spawn(
            info["argv"], self.state_dir / "logs" / f"{name}.log", self.repo, env
        )
        self._children[name] = proc
        with state_lock(self.repo):
            state = self.read_state()
            state["processes"][name] = record
            self.state.write(state)
        self._wait(name, component, self._context(state), [component])
        return time.monotonic() - t0

    # ------------------------------------------------------------------ down

    def down(self) -> None:
        """Stop exactly the processes recorded in state.json and remove the state folder."""
        with state_lock(self.repo):
            self._down_locked()

    def _down_locked(self) -> None:
        state = self.read_state()
        if state:
            self._stop(state)
        else:
            if self.state_dir.exists():
                self.say("no state.json; removing the state folder")
            self._reset_host()
        keep = os.environ.get("DDPJOB_CLUSTER_KEEP_LOGS") == "1"
        if keep and (self.state_dir / "logs").exists():
            dest = cache_dir() / "cluster-logs" / time.strftime("%Y%m%d-%H%M%S")
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self.state_dir / "logs", dest)
            self.say(f"logs kept in {dest}")
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop(self, state: dict) -> None:
        recorded = state.get("processes", {})
        for component in reversed(components()):
            info = recorded.get(component.name)
            if info:
                procs.terminate(info["pid"], info["start"], 5, self.say, component.name)
        self._reset_host()
        self.say("stopped")

    def _reset_host(self) -> None:
        for reset in HOST_RESETS:
            reset(self.repo, self.say)

    # ------------------------------------------------------------------ figures

    def pss_mib(self) -> dict[str, float]:
        """The proportional set size (MiB) of each recorded process (see procs.memory_mib)."""
        return procs.memory_mib((self.read_state() or {}).get("processes", {}), "Pss")

    def rss_mib(self) -> dict[str, float]:
        """The resident memory (MiB) of each recorded process."""
        return procs.memory_mib((self.read_state() or {}).get("processes", {}), "VmRSS")


def _harness_hash() -> str:
    """Hash of the harness code that decides what runs in the cluster (every room but the
    builds, which the tools folder's name covers): a running cluster started from other code is
    restarted by the next ``up``."""
    here = Path(__file__).resolve().parent
    files = [here / "sequence.py", here / "cluster.py"]
    for room in ("controlplane", "node", "addons"):
        files += sorted((here / room).glob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]
