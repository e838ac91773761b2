"""The pod agent: a tiny kubelet that runs pods bound to kwok nodes as local processes.

For every pod scheduled on one of the kwok nodes it runs the ``pytorch`` container (command +
args, with the pod's env) as a local process in its own process group, with cwd = the repo root
and the repo's venv first on PATH. Host names of the job's replicas (``<job>-master-0``, service
DNS names) become 127.0.0.1 and ``MASTER_PORT`` becomes a free port chosen once per job, so two
jobs never collide. Output goes, in the CRI log format, to a file that a kwok ``Logs`` object maps
to the container, so ``kubectl logs`` (and ``--previous``, ``-f``) go the real way: apiserver ->
kubelet API (kwok) -> file. Pod status carries the real exit code (128 + signal when killed).
Restart policies Always/OnFailure restart in place (``restartCount``); Never ends the pod.
On deletion: SIGTERM to the process group, SIGKILL after the grace period, then the final delete.

Run: ``python -m localkube.agent --kubeconfig K --state-dir D --nodes a,b``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import faulthandler
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from controller.kubeflow import CONTAINER, LABEL_JOB_NAME

REPO_ROOT = Path(__file__).resolve().parents[1]
# How long a pod status update is retried while the API server is away.
STATUS_RETRY_S = 300
LOGS_GROUP, LOGS_VERSION, LOGS_PLURAL = "kwok.x-k8s.io", "v1alpha1", "logs"
#: A whole value that is a replica host name (``<job>-master-0``, optionally with a DNS suffix),
#: optionally with a port: the job's rendezvous, so the port becomes the job's own port.
_REPLICA_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-(master|worker|launcher)-\d+(\.[-a-z0-9]+)*(?P<port>:\d+)?$"
)
#: A whole value that is a Service DNS name (``name.ns.svc[.cluster.local]``), port kept.
_SERVICE_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[-a-z0-9]+)*\.svc(\.cluster\.local)?(?P<port>:\d+)?$"
)
_PASS_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "TERM", "TZ")


def now_iso() -> str:
    """Return the current UTC time as an RFC 3339 string with second precision."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    """Map a Popen return code to a container exit code (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Expand ``$(VAR)`` like the kubelet: defined names are replaced, ``$$`` is a literal
    ``$``, undefined references stay as written."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_RE.sub(sub, value)


def rewrite_env(env: dict[str, str], port: int) -> dict[str, str]:
    """Point replica host names at 127.0.0.1 and the rendezvous port at this job's port.
    HOSTNAME stays: it is the pod's own name (a container's hostname), not an address."""
    out = dict(env)
    for key, value in env.items():
        if key == "HOSTNAME":
            continue
        replica = _REPLICA_RE.match(value or "")
        service = _SERVICE_RE.match(value or "")
        if replica:
            out[key] = "127.0.0.1" + (f":{port}" if replica.group("port") else "")
        elif service:
            out[key] = "127.0.0.1" + (service.group("port") or "")
    if "MASTER_ADDR" in out:
        out["MASTER_ADDR"] = "127.0.0.1"
    if "MASTER_PORT" in out:
        out["MASTER_PORT"] = str(port)
    for key in ("PET_MASTER_PORT",):
        if key in out:
            out[key] = str(port)
    if "PET_MASTER_ADDR" in out:
        out["PET_MASTER_ADDR"] = "127.0.0.1"
    return out


class CriLogWriter:
    """Append lines to a file in the CRI log format kwok's kubelet API reads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        self.lock = threading.Lock()

    def write(self, stream: str, data: bytes) -> None:
        """Write one chunk; a chunk ending in a newline is a full ("F") line."""
        full = data.endswith(b"\n")
        body = data[:-1] if full else data
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        line = f"{stamp} {stream} {'F' if full else 'P'} ".encode() + body + b"\n"
        with self.lock:
            self.handle.write(line)

    def pump(self, pipe, stream: str) -> None:
        """Copy a pipe to the log until EOF."""
        for chunk in iter(lambda: pipe.readline(16384), b""):
            self.write(stream, chunk)
        pipe.close()

    def close(self) -> None:
        with self.lock:
            self.handle.close()


@dataclass
class PodRun:
    """One pod's local process and what the agent knows about it."""

    namespace: str
    name: str
    uid: str
    pod: object
    restart_count: int = 0
    proc: subprocess.Popen | None = None
    started_at: str = ""
    deleting: bool = False
    finished: bool = False
    log_files: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Agent:
    """Watch pods on the given nodes and run them."""

    def __init__(self, kubeconfig: str, state_dir: Path, nodes: list[str]) -> None:
        config.load_kube_config(config_file=kubeconfig)
        self.core = client.CoreV1Api()
        self.custom = client.CustomObjectsApi()
        self.state_dir = state_dir
        self.nodes = set(nodes)
        self.runs: dict[str, PodRun] = {}
        self.job_ports: dict[str, int] = {}
        self.previous_log: dict[tuple[str, str], Path] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        venv = REPO_ROOT / ".venv" / "bin"
        self.venv_bin = venv if venv.exists() else Path(sys.executable).parent

    def say(self, message: str) -> None:
        print(f"{now_iso()} agent: {message}", flush=True)

    # ------------------------------------------------------------------ watch loop

    def run(self) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or errors."""
        ready_file = self.state_dir / "agent.ready"
        while not self.stopping.is_set():
            try:
                pods = self.core.list_pod_for_all_namespaces()
                seen = set()
                for pod in pods.items:
                    seen.add(pod.metadata.uid)
                    self.reconcile(pod)
                self.forget_missing(seen)
                ready_file.touch()
                rv = pods.metadata.resource_version
                while not self.stopping.is_set():
                    stream = watch.Watch().stream(
                        self.core.list_pod_for_all_namespaces,
                        resource_version=rv,
                        timeout_seconds=240,
                        allow_watch_bookmarks=True,
                    )
                    for event in stream:
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            code = obj.get("code", 500) if isinstance(obj, dict) else 500
                            raise ApiException(status=code, reason=str(obj))
                        if event["type"] == "BOOKMARK":
                            raw = event.get("raw_object") or obj
                            rv = raw["metadata"]["resourceVersion"]
                            continue
                        rv = obj.metadata.resource_version
                        if event["type"] == "DELETED":
                            self.on_deleted(obj)
                        else:
                            self.reconcile(obj)
            except ApiException as exc:
                if exc.status == 410:
                    self.say("watch expired (410); relisting")
                    continue
                self.say(f"API error {exc.status}; relisting in 1s")
                time.sleep(1)
            except Exception as exc:
                if self.stopping.is_set():
                    break
                self.say(f"watch error {exc!r}; relisting in 1s")
                time.sleep(1)

    def forget_missing(self, seen: set[str]) -> None:
        """Stop processes of pods that vanished while the watch was down."""
        with self.lock:
            gone = [run for uid, run in self.runs.items() if uid not in seen]
        for run in gone:
            self.kill(run, grace=0)
            with self.lock:
                self.runs.pop(run.uid, None)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self, pod) -> None:
        """Bring the local process in line with the pod."""
        if pod.spec.node_name not in self.nodes:
            return
        uid = pod.metadata.uid
        with self.lock:
            run = self.runs.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            if run is None or run.finished or run.proc is None:
                if run is not None:
                    with run.lock:
                        run.deleting = True  # a supervisor about to start it must not
                self.final_delete(pod.metadata.namespace, pod.metadata.name, uid)
                with self.lock:
                    self.runs.pop(uid, None)
            elif not run.deleting:
                grace = pod.metadata.deletion_grace_period_seconds
                if grace is None:
                    grace = pod.spec.termination_grace_period_seconds or 30
                self.kill(run, grace=grace)
            return
        phase = pod.status.phase if pod.status else None
        if run is not None or phase in ("Succeeded", "Failed"):
            return
        if phase == "Running":
            # Running but unknown: the agent restarted and lost the process.
            self.patch_terminated(pod, 137, "Error", "the ddpjob pod agent restarted", now_iso())
            return
        run = PodRun(pod.metadata.namespace, pod.metadata.name, uid, pod)
        with self.lock:
            self.runs[uid] = run
        threading.Thread(target=self.supervise, args=(run,), daemon=True).start()

    def on_deleted(self, pod) -> None:
        if pod.spec.node_name not in self.nodes:
            return
        with self.lock:
            run = self.runs.pop(pod.metadata.uid, None)
        if run is not None and not run.finished:
            self.kill(run, grace=0)
        self.delete_logs_object(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)

    # ------------------------------------------------------------------ process life

    def job_port(self, pod) -> int:
        labels = pod.metadata.labels or {}
        owner = next(iter(pod.metadata.owner_references or []), None)
        key = labels.get(LABEL_JOB_NAME) or (owner.uid if owner else pod.metadata.name)
        key = f"{pod.metadata.namespace}/{key}"
        with self.lock:
            if key not in self.job_ports:
                self.job_ports[key] = free_port()
            return self.job_ports[key]

    def build_env(self, pod, container) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env["PATH"] = f"{self.venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        if (self.venv_bin.parent / "pyvenv.cfg").exists():
            env["VIRTUAL_ENV"] = str(self.venv_bin.parent)
        env["HOSTNAME"] = pod.metadata.name
        for source in container.env_from or []:
            data = {}
            if source.config_map_ref is not None:
                cm = self.core.read_namespaced_config_map(
                    source.config_map_ref.name, pod.metadata.namespace
                )
                data = cm.data or {}
            elif source.secret_ref is not None:
                import base64

                secret = self.core.read_namespaced_secret(
                    source.secret_ref.name, pod.metadata.namespace
                )
                data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
            env.update({f"{source.prefix or ''}{k}": v for k, v in data.items()})
        for var in container.env or []:
            env[var.name] = expand(self.env_value(pod, var), env)
        return rewrite_env(env, self.job_port(pod))

    def env_value(self, pod, var) -> str:
        if var.value_from is None:
            return var.value or ""
        ref = var.value_from
        if ref.field_ref is not None:
            path = ref.field_ref.field_path
            simple = {
                "metadata.name": pod.metadata.name,
                "metadata.namespace": pod.metadata.namespace,
                "metadata.uid": pod.metadata.uid,
                "spec.nodeName": pod.spec.node_name,
                "spec.serviceAccountName": pod.spec.service_account_name,
                "status.podIP": "127.0.0.1",
                "status.hostIP": "127.0.0.1",
            }
            if path in simple:
                return simple[path] or ""
            match = re.match(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                return (getattr(pod.metadata, match.group(1)) or {}).get(match.group(2), "")
            return ""
        if ref.config_map_key_ref is not None:
            cm = self.core.read_namespaced_config_map(
                ref.config_map_key_ref.name, pod.metadata.namespace
            )
            return (cm.data or {}).get(ref.config_map_key_ref.key, "")
        if ref.secret_key_ref is not None:
            import base64

            secret = self.core.read_namespaced_secret(
                ref.secret_key_ref.name, pod.metadata.namespace
            )
            raw = (secret.data or {}).get(ref.secret_key_ref.key, "")
            return base64.b64decode(raw).decode() if raw else ""
        return ""

    def container_of(self, pod):
        for container in pod.spec.containers:
            if container.name == CONTAINER:
                return container
        return pod.spec.containers[0]

    def supervise(self, run: PodRun) -> None:
        """Start the container, restart it per restartPolicy, report status; one thread/pod."""
        pod = run.pod
        try:
            container = self.container_of(pod)
            env = self.build_env(pod, container)
            argv = [expand(a, env) for a in [*(container.command or []), *(container.args or [])]]
        except Exception as exc:
            self.say(f"{run.namespace}/{run.name}: cannot prepare: {exc!r}")
            self.patch_terminated(pod, 128, "ContainerCannotRun", str(exc), now_iso())
            run.finished = True
            return
        if not argv:
            self.patch_terminated(
                pod,
                128,
                "ContainerCannotRun",
                "the ddpjob pod agent needs an explicit command or args (no image entrypoint)",
                now_iso(),
            )
            run.finished = True
            return
        policy = pod.spec.restart_policy or "Always"
        backoff = 1.0
        while True:
            code, finished_at = self.run_once(run, container, argv, env)
            if code is None:
                return  # could not start; already reported
            if run.deleting:
                run.finished = True
                self.final_delete(run.namespace, run.name, run.uid)
                return
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
            if not restart:
                reason = "Completed" if code == 0 else "Error"
                run.finished = True
                self.patch_terminated(pod, code, reason, "", finished_at, run)
                return
            self.patch_waiting(pod, run, code, finished_at)
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
            if run.deleting:
                run.finished = True
                self.final_delete(run.namespace, run.name, run.uid)
                return
            run.restart_count += 1

    def run_once(self, run: PodRun, container, argv, env) -> tuple[int | None, str]:
        """Start the process once, wait for it; return (exit code, finishedAt)."""
        logdir = self.state_dir / "pods" / f"{run.namespace}_{run.name}_{run.uid}"
        log_path = logdir / container.name / f"{run.restart_count}.log"
        writer = CriLogWriter(log_path)
        key = (run.namespace, run.name)
        previous = run.log_files[-1] if run.log_files else self.previous_log.get(key)
        run.log_files.append(log_path)
        self.previous_log[key] = log_path
        self.put_logs_object(run, container.name, log_path, previous)
        try:
            with run.lock:
                if run.deleting:
                    writer.close()
                    return 137, now_iso()
                run.proc = subprocess.Popen(
                    argv,
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError as exc:
            writer.write("stderr", f"ddpjob pod agent: cannot start {argv!r}: {exc}\n".encode())
            writer.close()
            run.finished = True
            self.patch_terminated(run.pod, 128, "StartError", str(exc), now_iso(), run)
            return None, ""
        run.started_at = now_iso()
        self.record_pid(run)
        self.say(f"{run.namespace}/{run.name}: started pid {run.proc.pid}: {argv!r}")
        pumps = [
            threading.Thread(target=writer.pump, args=(run.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=writer.pump, args=(run.proc.stderr, "stderr"), daemon=True),
        ]
        for t in pumps:
            t.start()
        if not run.deleting:
            self.patch_running(run)
        returncode = run.proc.wait()
        # The group may still hold children; they go with the pod.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        for t in pumps:
            t.join(timeout=5)
        writer.close()
        # Read-only marks "container exited": kwok's (patched) log reader ends `logs -f` then.
        with contextlib.suppress(OSError):
            log_path.chmod(0o444)
        self.record_pid(run, remove=True)
        code = exit_code(returncode)
        self.say(f"{run.namespace}/{run.name}: pid {run.proc.pid} exited {code}")
        return code, now_iso()

    def kill(self, run: PodRun, grace: float) -> None:
        """SIGTERM the process group now, SIGKILL it after ``grace`` seconds."""
        with run.lock:
            run.deleting = True
            proc = run.proc
        if proc is None or proc.poll() is not None:
            return
        self.say(f"{run.namespace}/{run.name}: SIGTERM pid {proc.pid} (grace {grace}s)")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)

        def later() -> None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.say(f"{run.namespace}/{run.name}: SIGKILL pid {proc.pid}")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)

        if grace > 0:
            threading.Thread(target=later, daemon=True).start()

    def record_pid(self, run: PodRun, remove: bool = False) -> None:
        """Keep .cluster/agent-pids.json current so cluster-down can reap orphans."""
        path = self.state_dir / "agent-pids.json"
        with self.lock:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            key = f"{run.namespace}/{run.name}/{run.uid}"
            if remove:
                data.pop(key, None)
            else:
                stat = Path(f"/proc/{run.proc.pid}/stat").read_text()
                data[key] = {"pid": run.proc.pid, "start": stat.rsplit(")", 1)[1].split()[19]}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)

    def stop_all(self) -> None:
        """Stop every pod process (agent shutdown): SIGTERM, then SIGKILL after 5 s."""
        self.stopping.set()
        with self.lock:
            runs = list(self.runs.values())
        procs = [r.proc for r in runs if r.proc is not None and r.proc.poll() is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ API writes

    def put_logs_object(self, run: PodRun, container: str, path: Path, prev: Path | None) -> None:
        """Create or replace the kwok Logs object that maps the container to its log file."""
        spec_log = {"containers": [container], "logsFile": str(path), "follow": True}
        if prev is not None:
            spec_log["previousLogsFile"] = str(prev)
        body = {
            "apiVersion": f"{LOGS_GROUP}/{LOGS_VERSION}",
            "kind": "Logs",
            "metadata": {
                "name": run.name,
                "namespace": run.namespace,
                "labels": {"ddpjob.local/pod-uid": run.uid},
            },
            "spec": {"logs": [spec_log]},
        }
        try:
            self.custom.create_namespaced_custom_object(
                LOGS_GROUP, LOGS_VERSION, run.namespace, LOGS_PLURAL, body
            )
        except ApiException as exc:
            if exc.status != 409:
                self.say(f"{run.namespace}/{run.name}: Logs create failed: {exc.status}")
                return
            self.custom.patch_namespaced_custom_object(
                LOGS_GROUP,
                LOGS_VERSION,
                run.namespace,
                LOGS_PLURAL,
                run.name,
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
            )

    def delete_logs_object(self, namespace: str, name: str, uid: str) -> None:
        """Delete the Logs object if it still belongs to pod ``uid``."""
        try:
            obj = self.custom.get_namespaced_custom_object(
                LOGS_GROUP, LOGS_VERSION, namespace, LOGS_PLURAL, name
            )
            if obj["metadata"].get("labels", {}).get("ddpjob.local/pod-uid") == uid:
                self.custom.delete_namespaced_custom_object(
                    LOGS_GROUP, LOGS_VERSION, namespace, LOGS_PLURAL, name
                )
        except ApiException:
            pass

    def final_delete(self, namespace: str, name: str, uid: str) -> None:
        """Finish a graceful deletion (what the kubelet does once containers stopped)."""
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                ),
            )
            self.say(f"{namespace}/{name}: deleted")
        except ApiException as exc:
            if exc.status not in (404, 409):
                self.say(f"{namespace}/{name}: final delete failed: {exc.status}")

    def _statuses(
        self, pod, state: dict, ready: bool, run: PodRun | None, last: dict | None = None
    ) -> list[dict]:
        out = []
        for c in pod.spec.containers:
            st = {
                "name": c.name,
                "image": c.image,
                "imageID": f"ddpjob-agent://{c.image}",
                "containerID": f"ddpjob://{run.proc.pid}" if run and run.proc else "",
                "ready": ready,
                "started": "running" in state,
                "restartCount": run.restart_count if run else 0,
                "state": state,
            }
            if last:
                st["lastState"] = last
            if c.name != self.container_of(pod).name:
                st.update(
                    ready=False,
                    started=False,
                    state={
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "message": "not run by the ddpjob pod agent",
                        }
                    },
                )
            out.append(st)
        return out

    def _init_statuses(self, pod) -> list[dict]:
        return [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "message": "init containers are skipped by the ddpjob pod agent",
                    }
                },
            }
            for c in pod.spec.init_containers or []
        ]

    def _conditions(self, ready: bool, reason: str | None = None) -> list[dict]:
        t = now_iso()
        conds = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
        ]
        for kind in ("ContainersReady", "Ready"):
            cond = {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": t}
            if reason:
                cond["reason"] = reason
            conds.append(cond)
        return conds

    def _patch(self, pod, status: dict) -> None:
        # The process listens on 127.0.0.1, but EndpointSlices reject loopback pod IPs, so the
        # pod reports a stable fake address from 10.244.0.0/16 (env status.podIP stays loopback).
        digest = int(pod.metadata.uid.replace("-", "")[:8], 16)
        pod_ip = f"10.244.{digest >> 8 & 255}.{digest & 253 or 1}"
        base = {
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": (
                pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ")
                if pod.status and pod.status.start_time
                else now_iso()
            ),
        }
        base.update(status)
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        # A status the API server never got would leave the pod Running forever (a kubelet
        # retries too): while the server is away (connection refused, 5xx), retry with backoff.
        deadline = time.monotonic() + STATUS_RETRY_S
        delay = 0.5
        while True:
            try:
                self.core.patch_namespaced_pod_status(
                    pod.metadata.name, pod.metadata.namespace, {"status": base}
                )
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status and exc.status < 500:
                    self.say(f"{where}: status patch failed: {exc.status} {exc.body}")
                    return
                problem = f"{exc.status} {exc.reason}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                problem = str(exc)
            if time.monotonic() > deadline:
                self.say(f"{where}: status patch gave up after {STATUS_RETRY_S} s: {problem}")
                return
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def patch_running(self, run: PodRun) -> None:
        pod = run.pod
        state = {"running": {"startedAt": run.started_at}}
        last = getattr(run, "last_state", None)
        self._patch(
            pod,
            {
                "phase": "Running",
                "conditions": self._conditions(True),
                "initContainerStatuses": self._init_statuses(pod),
                "containerStatuses": self._statuses(pod, state, True, run, last),
            },
        )

    def patch_waiting(self, pod, run: PodRun, code: int, finished_at: str) -> None:
        """Report a container that exited and will be restarted in place."""
        run.last_state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": run.started_at,
                "finishedAt": finished_at,
            }
        }
        state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off restarting (last exit {code})",
            }
        }
        self._patch(
            pod,
            {
                "phase": "Running",
                "conditions": self._conditions(False, "ContainersNotReady"),
                "containerStatuses": self._statuses(pod, state, False, run, run.last_state),
            },
        )

    def patch_terminated(
        self, pod, code: int, reason: str, message: str, finished_at: str, run: PodRun | None = None
    ) -> None:
        """Report the final state: Succeeded (exit 0) or Failed, with the real exit code."""
        term = {
            "exitCode": code,
            "reason": reason,
            "finishedAt": finished_at,
            "startedAt": (run.started_at if run and run.started_at else finished_at),
        }
        if message:
            term["message"] = message
        if run and run.proc:
            term["containerID"] = f"ddpjob://{run.proc.pid}"
        self._patch(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": self._conditions(False, "PodCompleted"),
                "initContainerStatuses": self._init_statuses(pod),
                "containerStatuses": self._statuses(
                    pod, {"terminated": term}, False, run, getattr(run, "last_state", None)
                ),
            },
        )
        self.say(f"{pod.metadata.namespace}/{pod.metadata.name}: {reason} exit {code}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the agent until SIGTERM/SIGINT, then stop all pod processes."""
    parser = argparse.ArgumentParser(prog="python -m localkube.agent", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--nodes", required=True, help="comma-separated node names")
    args = parser.parse_args(argv)
    agent = Agent(args.kubeconfig, args.state_dir, args.nodes.split(","))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1` dumps stacks

    def on_signal(signum, _frame) -> None:
        agent.say(f"signal {signum}; stopping pod processes")
        agent.stop_all()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.say(f"watching pods on {sorted(agent.nodes)}")
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
