"""Helpers for the end-to-end tests: specs, the CLI as a subprocess, rank 0's progress, and
restarting the API server. Pods, their processes and their log files (the ground truth a followed
log is compared with) are the local cluster's: ``localkube.handle.Cluster``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

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


def latest_step(cluster, name: str, namespace: str) -> int:
    """The last step rank 0 reported (its `train` events), 0 if none yet."""
    try:
        text = cluster.core_api().read_namespaced_pod_log(
            f"{name}-master-0", namespace, container="pytorch", tail_lines=50
        )
    except Exception:  # not created or not started yet
        return 0
    step = 0
    for line in text.splitlines():
        if line.startswith('{"event": "train"'):
            step = json.loads(line)["step"]
    return step


def restart_apiserver(cluster, down_s: float = 2.0) -> float:
    """Stop kube-apiserver, keep it down ``down_s`` seconds, start it again (the local cluster
    records the new pid, so `make cluster-down` still stops it). Returns the seconds it was
    unavailable."""
    return cluster.control_plane.restart_component("kube-apiserver", down_s=down_s)
