"""An MLflow tracking server on this machine for the tracker's tests: the ``mlflow`` package's
own server (the command the local cluster runs, ``localkube.addons.mlflow``) with a SQLite store
in a temporary folder, on a free port of 127.0.0.1, started as a process of its own and stopped
again.

    with MlflowServer(tmp) as server:
        run(cmd, env=base_env(MLFLOW_TRACKING_URI=server.url))
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from controller.local.processes import free_port
from localkube.addons.mlflow import server_argv, server_env

#: Its imports take tens of seconds on a loaded 2-core machine.
START_TIMEOUT_S = 240


class MlflowApi:
    """What a tracking server at ``url`` holds, read through its REST API."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        url = f"{self.url}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def run(self, run_id: str) -> dict[str, Any]:
        return self.get("runs/get", run_id=run_id)["run"]

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        """Every run of the experiment named ``experiment``."""
        exp = self.get("experiments/get-by-name", experiment_name=experiment)["experiment"]
        body = {"experiment_ids": [exp["experiment_id"]], "max_results": 1000}
        return self.post("runs/search", body).get("runs", [])

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of every point of metric ``key``, in the order of the steps."""
        got = self.get("metrics/get-history", run_id=run_id, metric_key=key, max_results=25000)
        return sorted((int(p["step"]), p["value"]) for p in got.get("metrics", []))


class MlflowServer(MlflowApi):
    """The ``mlflow`` package's server on a free port of 127.0.0.1 (a context manager)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Any port of 127.0.0.1: a test may reach it through a forwarder of its own.
        argv = server_argv(self.folder, "127.0.0.1", self.port, ("127.0.0.1:*",))
        self.log = open(self.folder / "server.log", "wb")
        self.proc = subprocess.Popen(
            argv,
            env=server_env(dict(os.environ)),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.read().strip() == b"OK":
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                log = (self.folder / "server.log").read_text()[-2000:]
                raise RuntimeError(f"mlflow server did not start on {self.url}:\n{log}")
            time.sleep(0.25)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            # The CLI waits on its uvicorn child: the whole session goes.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
            self.log.close()
