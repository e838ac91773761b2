"""Helpers for the end-to-end tests: specs, the CLI as a subprocess, pod processes, the agent's
log files (the ground truth a followed log is compared with), and restarting the API server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.fixture import wait_until

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
PY = sys.executable


def write_spec(
    tmp_path: Path,
    name: str,
    namespace: str,
    *,
    max_steps: int = 40,
    every_steps: int = 10,
    log_every: int = 5,
    **fields: Any,
) -> Path:
    """The quickstart spec, small: few steps, frequent checkpoints in a directory every attempt
    shares (pods run as local processes), resume=auto so a retried pod continues."""
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec["name"], spec["namespace"] = name, namespace
    trainer = spec["trainer"]
    trainer.update(
        max_steps=max_steps, log_every=log_every, eval_every=0, resume="auto", warmup_steps=0
    )
    trainer["task_args"] = {"image_size": 16, "noise": 2.0}
    trainer["checkpoint"] = {"dir": str(tmp_path / f"ckpt-{name}"), "every_steps": every_steps}
    for key, value in fields.items():
        if key == "trainer":
            trainer.update(value)
        else:
            spec[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def ddpjob(cluster, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m controller ARGS`` against the cluster; never raises on exit code."""
    return subprocess.run(
        [PY, "-m", "controller", *args],
        env=cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Background:
    """``python -m controller ARGS`` running in the background, output to files."""

    def __init__(self, cluster, tmp_path: Path, tag: str, *args: str):
        self.out_path = tmp_path / f"{tag}.out"
        self.err_path = tmp_path / f"{tag}.err"
        self._out = open(self.out_path, "w")  # noqa: SIM115 - closed in result()
        self._err = open(self.err_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PY, "-m", "controller", *args],
            env=cluster.env,
            cwd=REPO,
            stdout=self._out,
            stderr=self._err,
            text=True,
        )

    def result(self, timeout: float = 180) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"{self.proc.args} did not finish in {timeout}s; stderr: "
                f"{self.err_path.read_text()[-2000:]}"
            ) from None
        finally:
            self._out.close()
            self._err.close()
        return code, self.out_path.read_text(), self.err_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._err.close()


def get_json(cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def _core(cluster):
    from kubernetes import client

    return client.CoreV1Api(cluster.api_client())


def job_pods(cluster, name: str, namespace: str) -> list[dict[str, Any]]:
    """The job's pods as API dicts (through the API, not kubectl)."""
    resp = _core(cluster).list_namespaced_pod(
        namespace,
        label_selector=f"training.kubeflow.org/job-name={name}",
        _preload_content=False,
    )
    return json.loads(resp.data)["items"]


def running_pod(cluster, name: str, namespace: str, replica: str) -> dict[str, Any] | None:
    """The pod ``<name>-<replica>`` once its trainer runs (agent reported Running)."""
    for pod in job_pods(cluster, name, namespace):
        if pod["metadata"]["name"] != f"{name}-{replica}":
            continue
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if (
            pod["status"].get("phase") == "Running"
            and statuses
            and statuses[0].get("state", {}).get("running")
        ):
            return pod
    return None


def pod_pid(cluster, namespace: str, pod: dict[str, Any]) -> int | None:
    """The local pid the agent started for ``pod`` (from .cluster/agent-pids.json)."""
    path = cluster.control_plane.state_dir / "agent-pids.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    meta = pod["metadata"]
    info = data.get(f"{namespace}/{meta['name']}/{meta['uid']}")
    return info["pid"] if info else None


def latest_step(cluster, name: str, namespace: str) -> int:
    """The last step rank 0 reported (its `train` events), 0 if none yet."""
    try:
        text = _core(cluster).read_namespaced_pod_log(
            f"{name}-master-0", namespace, container="pytorch", tail_lines=50
        )
    except Exception:  # not created or not started yet
        return 0
    step = 0
    for line in text.splitlines():
        if line.startswith('{"event": "train"'):
            step = json.loads(line)["step"]
    return step


def agent_log_lines(cluster, namespace: str, pod_name: str) -> list[str]:
    """Everything every run of the pod named ``pod_name`` printed, in order: the ground truth
    for a followed log (the agent writes each run's output to its own CRI-format file)."""
    root = cluster.control_plane.state_dir / "pods"
    files = []
    for d in root.glob(f"{namespace}_{pod_name}_*"):
        files.extend((d / "pytorch").glob("*.log"))
    entries = []
    for f in files:
        partial = ""
        for raw in f.read_text(errors="replace").splitlines():
            stamp, _stream, tag, body = [*raw.split(" ", 3), ""][:4]
            if tag == "P":
                partial += body
                continue
            entries.append((stamp, str(f), len(entries), partial + body))
            partial = ""
    # Runs do not overlap in time: order by each file's first stamp, then line order.
    first = {}
    for stamp, f, _, _ in entries:
        first.setdefault(f, stamp)
    entries.sort(key=lambda e: (first[e[1]], e[2]))
    return [e[3] for e in entries]


def restart_apiserver(cluster, down_s: float = 2.0) -> float:
    """Stop kube-apiserver (SIGTERM) and start it again with the argv the harness recorded in
    .cluster/state.json, updating its pid there so `make cluster-down` still stops it. Returns
    the seconds it was unavailable."""
    from tests.cluster import control_plane as cp

    plane = cluster.control_plane
    state = plane.read_state()
    info = state["processes"]["kube-apiserver"]
    t0 = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.kill(info["pid"], signal.SIGTERM)

    def gone() -> bool:
        return cp._proc_start_time(info["pid"]) != info["start"]

    try:
        wait_until("kube-apiserver to exit", gone, 3, 0.05)
    except AssertionError:
        # Its graceful shutdown can stall once it stopped listening (seen with v1.33 here): it
        # is already down for every client, so finish it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(info["pid"], signal.SIGKILL)
        wait_until("kube-apiserver to exit after SIGKILL", gone, 10, 0.05)
    time.sleep(down_s)
    log = plane.state_dir / "logs" / "kube-apiserver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env.setdefault("GOMAXPROCS", "2")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            info["argv"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=plane.repo,
            env=env,
            start_new_session=True,
        )
    start = wait_until("kube-apiserver pid", lambda: cp._proc_start_time(proc.pid), 5, 0.01)
    with cp.state_lock(plane.repo):
        state = plane.read_state()
        state["processes"]["kube-apiserver"] = {**info, "pid": proc.pid, "start": start}
        plane._write_state(state)
    ctx = plane._ssl_context(state)

    def ready() -> bool:
        try:
            return plane._get(f"{state['server']}/readyz", ctx) == "ok"
        except Exception:  # not up yet
            return False

    wait_until("kube-apiserver /readyz after restart", ready, 90, 0.2)
    return time.monotonic() - t0
