"""Start and stop the local Kubernetes control plane on 127.0.0.1.

State lives in ``<repo>/.cluster/``: ``kubeconfig`` (admin), ``state.json`` (the PIDs this module
started, with their start times so a recycled PID is never signalled), ``logs/``, ``pki/``,
``etcd/`` and the pod agent's ``pods/``. ``up()`` is idempotent: with a live cluster it only
prints the export line. ``down()`` stops exactly the recorded processes and removes the state.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import tools
from .pki import PKI

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR_NAME = ".cluster"

#: Fake GPU nodes managed by kwok.
NODE_NAMES = ("kwok-node-0", "kwok-node-1")
NODE_CAPACITY = {
    "cpu": "32",
    "memory": "256Gi",
    "pods": "110",
    "nvidia.com/gpu": "8",
    "ephemeral-storage": "1Ti",
}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"

#: Start order; ``down()`` stops in reverse.
PROCESS_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "training-operator",
    "pod-agent",
)


class ClusterError(RuntimeError):
    """The local control plane could not be started, reached or stopped."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _proc_start_time(pid: int) -> str | None:
    """Return the kernel start time of ``pid`` (field 22 of /proc/pid/stat), None if gone."""
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
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddpjob" / "locks"
    base.mkdir(parents=True, exist_ok=True)
    return base / f"cluster-{digest}.lock"


@contextlib.contextmanager
def state_lock(repo: Path = REPO_ROOT):
    """Serialise up/down between processes (two pytest sessions, make and pytest)."""
    with open(_lock_path(repo), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class ControlPlane:
    """The local control plane rooted at ``repo/.cluster``."""

    repo: Path = REPO_ROOT
    log: object = field(default=sys.stderr)

    @property
    def state_dir(self) -> Path:
        return self.repo / STATE_DIR_NAME

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def say(self, message: str) -> None:
        print(f"[cluster] {message}", file=self.log, flush=True)

    # ------------------------------------------------------------------ state

    def read_state(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def _write_state(self, state: dict) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    def _ssl_context(self, state: dict) -> ssl.SSLContext:
        pki = Path(state["pki"])
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _get(self, url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> str:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.read().decode()

    def processes_alive(self, state: dict) -> list[str]:
        """Return the names of recorded processes that are gone or were replaced."""
        dead = []
        for name, info in state.get("processes", {}).items():
            if _proc_start_time(info["pid"]) != info["start"]:
                dead.append(name)
        return dead

    def is_live(self) -> bool:
        """Return True when the recorded processes all run and the apiserver is ready."""
        state = self.read_state()
        if not state or not self.kubeconfig.exists():
            return False
        if set(state.get("processes", {})) != set(PROCESS_ORDER):
            return False
        if self.processes_alive(state):
            return False
        try:
            return self._get(f"{state['server']}/readyz", self._ssl_context(state)) == "ok"
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def export_line(self) -> str:
        return f"export KUBECONFIG={self.kubeconfig}"

    # ------------------------------------------------------------------ processes

    def _spawn(self, state: dict, name: str, argv: list[str], env: dict | None = None) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.repo,
                env=env or self._base_env(),
                start_new_session=True,
            )
        start = None
        for _ in range(50):
            start = _proc_start_time(proc.pid)
            if start:
                break
            time.sleep(0.01)
        state["processes"][name] = {"pid": proc.pid, "start": start, "argv": argv}
        self._write_state(state)
        self._children = getattr(self, "_children", {})
        self._children[name] = proc

    def _base_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        env.setdefault("GOMAXPROCS", "2")
        return env

    def _check_running(self, name: str) -> None:
        proc = getattr(self, "_children", {}).get(name)
        if proc is not None and proc.poll() is not None:
            tail = (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ClusterError(
                f"tests.cluster: {name} exited during start-up (got exit {proc.returncode}). "
                f"Last log lines:\n{tail}"
            )

    def _wait(self, what: str, probe, timeout: float, names: tuple[str, ...] = ()) -> float:
        """Poll ``probe()`` until truthy; return seconds waited. Raise ClusterError on timeout."""
        start = time.monotonic()
        last_err: object = None
        while time.monotonic() - start < timeout:
            for name in names:
                self._check_running(name)
            try:
                if probe():
                    return time.monotonic() - start
            except Exception as exc:
                last_err = exc
            time.sleep(0.2)
        raise ClusterError(
            f"tests.cluster: {what} not ready after {timeout:.0f}s (got {last_err!r}). "
            f"See {self.state_dir / 'logs'}."
        )

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
                    self._write_state(state)
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
                        self.state_file.unlink(missing_ok=True)
                    raise
            if lease:
                self._lease_path(os.getpid()).parent.mkdir(exist_ok=True)
                self._lease_path(os.getpid()).write_text(_proc_start_time(os.getpid()) or "")
            return state

    def _outdated(self, state: dict) -> bool:
        """True when the running cluster was started from other tools or harness code."""
        return (
            state.get("tools") != str(tools.tools_dir()) or state.get("harness") != _harness_hash()
        )

    def _other_sessions(self) -> list[str]:
        """Pids of other live processes holding a lease on the cluster."""
        users = []
        for path in (self.state_dir / "sessions").glob("*"):
            if (
                int(path.name) != os.getpid()
                and _proc_start_time(int(path.name)) == path.read_text()
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

    def _up(self, owner: str = "cli") -> dict:
        t0 = time.monotonic()
        built = tools.build(self.log)
        if built:
            self.say("built " + ", ".join(f"{k} {v:.0f}s" for k, v in built.items()))
        t_ready = time.monotonic()
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        bindir = tools.tools_dir() / "bin"
        manifests = tools.tools_dir() / "manifests"
        ports = {
            k: _free_port()
            for k in (
                "etcd",
                "etcd-peer",
                "apiserver",
                "controller-manager",
                "scheduler",
                "kwok",
                "operator-probe",
                "operator-webhook",
                "operator-metrics",
            )
        }
        server = f"https://127.0.0.1:{ports['apiserver']}"
        state: dict = {
            "server": server,
            "ports": ports,
            "pki": str(self.state_dir / "pki"),
            "tools": str(tools.tools_dir()),
            "versions": tools.VERSIONS,
            "nodes": list(NODE_NAMES),
            "owner": owner,
            "harness": _harness_hash(),
            "processes": {},
        }
        self._write_state(state)
        pki = self._make_pki(state)
        timings: dict[str, float] = {}

        self._spawn(
            state,
            "etcd",
            [
                str(bindir / "etcd"),
                "--name",
                "default",
                "--data-dir",
                str(self.state_dir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{ports['etcd']}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{ports['etcd']}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{ports['etcd-peer']}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{ports['etcd-peer']}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{ports['etcd-peer']}",
                "--listen-metrics-urls",
                "",
                "--unsafe-no-fsync",
                "--snapshot-count",
                "10000",
                "--quota-backend-bytes",
                str(2 * 1024**3),
                "--log-level",
                "warn",
            ],
        )
        timings["etcd"] = self._wait(
            "etcd",
            lambda: '"health":"true"' in self._get(f"http://127.0.0.1:{ports['etcd']}/health"),
            30,
            ("etcd",),
        )

        self._spawn(
            state,
            "kube-apiserver",
            [
                str(bindir / "kube-apiserver"),
                "--etcd-servers",
                f"http://127.0.0.1:{ports['etcd']}",
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(ports["apiserver"]),
                "--cert-dir",
                str(pki.dir),
                "--tls-cert-file",
                str(pki.path("apiserver.crt")),
                "--tls-private-key-file",
                str(pki.path("apiserver.key")),
                "--client-ca-file",
                str(pki.path("ca.crt")),
                "--authorization-mode",
                "Node,RBAC",
                "--enable-admission-plugins",
                "NodeRestriction,PodSecurity",
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                str(pki.path("sa.pub")),
                "--service-account-signing-key-file",
                str(pki.path("sa.key")),
                "--api-audiences",
                "https://kubernetes.default.svc.cluster.local",
                "--kubelet-client-certificate",
                str(pki.path("apiserver-kubelet-client.crt")),
                "--kubelet-client-key",
                str(pki.path("apiserver-kubelet-client.key")),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--endpoint-reconciler-type",
                "none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v",
                "1",
            ],
        )
        ctx = self._ssl_context(state)
        timings["kube-apiserver"] = self._wait(
            "kube-apiserver /readyz",
            lambda: self._get(f"{server}/readyz", ctx) == "ok",
            90,
            ("kube-apiserver", "etcd"),
        )

        self._spawn(
            state,
            "kube-controller-manager",
            [
                str(bindir / "kube-controller-manager"),
                "--kubeconfig",
                str(self.state_dir / "controller-manager.kubeconfig"),
                "--authentication-kubeconfig",
                str(self.state_dir / "controller-manager.kubeconfig"),
                "--authorization-kubeconfig",
                str(self.state_dir / "controller-manager.kubeconfig"),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(ports["controller-manager"]),
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                "--service-account-private-key-file",
                str(pki.path("sa.key")),
                "--root-ca-file",
                str(pki.path("ca.crt")),
                "--cluster-signing-cert-file",
                str(pki.path("ca.crt")),
                "--cluster-signing-key-file",
                str(pki.path("ca.key")),
                "--controllers",
                "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,"
                "-node-route-controller,-persistentvolume-expander",
                "--node-monitor-grace-period",
                "60s",
                "--profiling=false",
                "--v",
                "1",
            ],
        )
        self._spawn(
            state,
            "kube-scheduler",
            [
                str(bindir / "kube-scheduler"),
                "--kubeconfig",
                str(self.state_dir / "scheduler.kubeconfig"),
                "--authentication-kubeconfig",
                str(self.state_dir / "scheduler.kubeconfig"),
                "--authorization-kubeconfig",
                str(self.state_dir / "scheduler.kubeconfig"),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(ports["scheduler"]),
                "--leader-elect=false",
                "--profiling=false",
                "--v",
                "1",
            ],
        )
        t = time.monotonic()
        self._apply_bootstrap(state, manifests)
        timings["bootstrap-objects"] = time.monotonic() - t

        kwok_config = self.state_dir / "kwok.yaml"
        kwok_config.write_text(KWOK_CONFIG)
        self._spawn(
            state,
            "kwok",
            [
                str(bindir / "kwok"),
                "--kubeconfig",
                str(self.state_dir / "kwok.kubeconfig"),
                "--config",
                str(kwok_config),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector",
                f"{KWOK_ANNOTATION}=fake",
                "--node-ip",
                "127.0.0.1",
                "--node-port",
                str(ports["kwok"]),
                "--server-address",
                f"127.0.0.1:{ports['kwok']}",
                "--tls-cert-file",
                str(pki.path("kwok.crt")),
                "--tls-private-key-file",
                str(pki.path("kwok.key")),
                "--enable-crds",
                "Logs",
                "--node-lease-duration-seconds",
                "40",
            ],
        )
        op_env = self._base_env()
        op_env["KUBECONFIG"] = str(self.state_dir / "training-operator.kubeconfig")
        self._spawn(
            state,
            "training-operator",
            [
                str(bindir / "training-operator"),
                "--kubeconfig",
                str(self.state_dir / "training-operator.kubeconfig"),
                "--health-probe-bind-address",
                f"127.0.0.1:{ports['operator-probe']}",
                "--metrics-bind-address",
                f"127.0.0.1:{ports['operator-metrics']}",
                "--webhook-server-port",
                str(ports["operator-webhook"]),
                "--webhook-cert-dir",
                str(self.state_dir / "webhook-certs"),
                # The init container template we ship for `restricted` namespaces: upstream's
                # built-in one sets no securityContext, so PodSecurity refuses Worker pods.
                "--pytorch-init-container-template-file",
                str(self.repo / "k8s" / "operator" / "init-container-restricted.yaml"),
                "--zap-log-level",
                "info",
            ],
            env=op_env,
        )
        self._spawn(
            state,
            "pod-agent",
            [
                sys.executable,
                "-m",
                "tests.cluster.agent",
                "--kubeconfig",
                str(self.kubeconfig),
                "--state-dir",
                str(self.state_dir),
                "--nodes",
                ",".join(NODE_NAMES),
            ],
        )
        t = time.monotonic()
        self._wait_ready(state)
        timings["components-ready"] = time.monotonic() - t
        state["timings"] = {k: round(v, 2) for k, v in timings.items()}
        state["up_seconds"] = round(time.monotonic() - t_ready, 2)
        state["total_seconds"] = round(time.monotonic() - t0, 2)
        self._write_state(state)
        self.say(f"ready in {state['up_seconds']:.1f}s (kubeconfig {self.kubeconfig})")
        return state

    def _make_pki(self, state: dict) -> PKI:
        pki = PKI(Path(state["pki"]))
        pki.service_account_keys()
        pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", "10.0.0.1"),
        )
        pki.issue("kwok", "kwok-kubelet", server=True, dns=("localhost",), ips=("127.0.0.1",))
        webhook_dir = self.state_dir / "webhook-certs"
        webhook_dir.mkdir()
        crt, key = pki.issue(
            "webhook",
            "training-operator-webhook",
            server=True,
            dns=("localhost",),
            ips=("127.0.0.1",),
        )
        shutil.copyfile(crt, webhook_dir / "tls.crt")
        shutil.copyfile(key, webhook_dir / "tls.key")
        pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            client=True,
        )
        users = {
            "admin": ("kubernetes-admin", ("system:masters",), self.kubeconfig),
            "controller-manager": (
                "system:kube-controller-manager",
                (),
                self.state_dir / "controller-manager.kubeconfig",
            ),
            "scheduler": ("system:kube-scheduler", (), self.state_dir / "scheduler.kubeconfig"),
            "kwok": ("ddpjob:kwok", (), self.state_dir / "kwok.kubeconfig"),
            "training-operator": (
                "ddpjob:training-operator",
                (),
                self.state_dir / "training-operator.kubeconfig",
            ),
        }
        for name, (cn, orgs, path) in users.items():
            crt, key = pki.issue(name, cn, organizations=orgs, client=True)
            pki.kubeconfig(path, state["server"], cn, crt, key)
        return pki

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster (admin credentials)."""
        argv = [str(tools.bin_path("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"tests.cluster: kubectl {' '.join(args)} failed (got exit {proc.returncode}): "
                f"{proc.stderr.strip()}"
            )
        return proc

    def _apply_bootstrap(self, state: dict, manifests: Path) -> None:
        """Install CRDs, RBAC, the webhook configuration and the fake nodes."""
        ports = state["ports"]
        hook_docs = (manifests / "training-operator-webhooks.yaml").read_text()
        webhooks = next(w for w in yaml.safe_load_all(hook_docs) if w)
        pytorch_hooks = [w for w in webhooks["webhooks"] if "pytorchjob" in w["name"]]
        ca_bundle = base64.b64encode((Path(state["pki"]) / "ca.crt").read_bytes()).decode()
        for hook in pytorch_hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{ports['operator-webhook']}{path}",
                "caBundle": ca_bundle,
            }
        webhooks["metadata"] = {"name": "validator.training-operator.kubeflow.org"}
        webhooks["webhooks"] = pytorch_hooks
        role = yaml.safe_load((manifests / "training-operator-role.yaml").read_text())
        role["metadata"] = {"name": "training-operator"}
        objects = [
            role,
            _binding("training-operator", "training-operator", "ddpjob:training-operator"),
            _binding("kwok", "cluster-admin", "ddpjob:kwok"),
            webhooks,
        ]
        for node in NODE_NAMES:
            objects.append(_node(node))
        crds = [manifests / "pytorchjobs-crd.yaml", manifests / "kwok-logs-crd.yaml"]
        docs = "\n---\n".join(p.read_text() for p in crds)
        docs += "\n---\n" + "\n---\n".join(yaml.safe_dump(o) for o in objects)
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "ddpjob-cluster",
            "-f",
            "-",
            input_text=docs,
            timeout=120,
        )

        def established() -> bool:
            out = self.kubectl(
                "get", "crd", "pytorchjobs.kubeflow.org", "logs.kwok.x-k8s.io", "-o", "json"
            ).stdout
            return all(
                any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (item.get("status") or {}).get("conditions") or []
                )
                for item in json.loads(out)["items"]
            )

        self._wait("CRDs established", established, 60, ("kube-apiserver",))

    def _wait_ready(self, state: dict) -> None:
        ports = state["ports"]
        names = tuple(PROCESS_ORDER)

        def nodes_ready() -> bool:
            out = self.kubectl("get", "nodes", "-o", "json").stdout
            items = json.loads(out)["items"]
            ready = [
                n
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            ]
            return len(ready) >= len(NODE_NAMES)

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._wait(
            "kube-controller-manager /healthz",
            lambda: (
                self._get(f"https://127.0.0.1:{ports['controller-manager']}/healthz", insecure)
                == "ok"
            ),
            60,
            names,
        )
        self._wait(
            "kube-scheduler /healthz",
            lambda: self._get(f"https://127.0.0.1:{ports['scheduler']}/healthz", insecure) == "ok",
            60,
            names,
        )
        self._wait(
            "training-operator /readyz",
            lambda: self._get(f"http://127.0.0.1:{ports['operator-probe']}/readyz") == "ok",
            60,
            names,
        )
        self._wait("kwok nodes Ready", nodes_ready, 60, names)
        self._wait(
            "default service account",
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            60,
            names,
        )
        self._wait("pod agent", lambda: (self.state_dir / "agent.ready").exists(), 60, names)

    # ------------------------------------------------------------------ down

    def down(self) -> None:
        """Stop exactly the processes recorded in state.json and remove the state folder."""
        with state_lock(self.repo):
            self._down_locked()

    def _down_locked(self) -> None:
        state = self.read_state()
        if state:
            self._stop(state)
        elif self.state_dir.exists():
            self.say("no state.json; removing the state folder only")
        keep = os.environ.get("DDPJOB_CLUSTER_KEEP_LOGS") == "1"
        if keep and (self.state_dir / "logs").exists():
            cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            dest = cache / "ddpjob" / "cluster-logs" / time.strftime("%Y%m%d-%H%M%S")
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self.state_dir / "logs", dest)
            self.say(f"logs kept in {dest}")
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _stop(self, state: dict) -> None:
        procs = state.get("processes", {})
        # Pod processes the agent started (in case the agent died before it could stop them).
        pods_file = self.state_dir / "agent-pids.json"
        pod_procs = {}
        with contextlib.suppress(OSError, ValueError):
            pod_procs = json.loads(pods_file.read_text())
        for name in reversed(PROCESS_ORDER):
            info = procs.get(name)
            if info:
                self._terminate(name, info["pid"], info["start"], timeout=5)
        for key, info in pod_procs.items():
            if _proc_start_time(info["pid"]) == info["start"]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(info["pid"], signal.SIGKILL)
                self.say(f"killed leftover pod process {key} (pid {info['pid']})")
        self.say("stopped")

    def _terminate(self, name: str, pid: int, start: str, timeout: float) -> None:
        if _proc_start_time(pid) != start:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _proc_start_time(pid) != start:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        self.say(f"{name} (pid {pid}) ignored SIGTERM for {timeout:.0f}s; sending SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ figures

    def pss_mib(self) -> dict[str, float]:
        """Return the proportional set size (MiB) of each recorded process: the components
        share one binary, so RSS counts its text pages once per process and PSS does not."""
        out: dict[str, float] = {}
        state = self.read_state() or {}
        for name, info in state.get("processes", {}).items():
            try:
                rollup = Path(f"/proc/{info['pid']}/smaps_rollup").read_text()
            except OSError:
                continue
            for line in rollup.splitlines():
                if line.startswith("Pss:"):
                    out[name] = int(line.split()[1]) / 1024
        return out

    def rss_mib(self) -> dict[str, float]:
        """Return the resident memory (MiB) of each recorded process."""
        out: dict[str, float] = {}
        state = self.read_state() or {}
        for name, info in state.get("processes", {}).items():
            try:
                status = Path(f"/proc/{info['pid']}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = int(line.split()[1]) / 1024
        return out


def _harness_hash() -> str:
    """Hash of the harness code that runs inside the cluster (agent, control plane)."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("agent.py", "control_plane.py", "pki.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:10]


def _binding(name: str, role: str, user: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"ddpjob:{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def _node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
            },
        },
        "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
    }


#: kwok keeps its default node stages; the only pod stage never matches, so kwok leaves pods to
#: the pod agent (which runs them and reports real status) instead of faking Running/Succeeded.
KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options: {}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-left-to-ddpjob-agent
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchLabels:
      ddpjob.local/kwok-never-matches: "true"
  next: {}
"""
