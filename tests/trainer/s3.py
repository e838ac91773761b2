"""An S3 API on this machine for the checkpoint tests: moto's server, a real HTTP endpoint that
the real boto3 talks to, started as a process of its own and stopped again.

    with MotoServer() as s3:
        s3.create_bucket("ckpt")
        run(cmd, env=base_env(**s3.env))     # the trainer finds it the way it finds AWS
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

#: moto accepts any key unless it checks them (``auth``); these say so in a request log.
ACCESS_KEY, SECRET_KEY = "AKIATESTTESTTESTTEST", "test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on a free port. With ``auth`` it checks every request's
    credentials against its IAM, which knows no key: any key is then wrong credentials."""

    def __init__(self, auth: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth = auth
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a trainer pod gets: the endpoint, a region and a key, and nothing of this
        machine's own AWS configuration."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def __enter__(self) -> MotoServer:
        env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if self.auth else {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", **env},
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"moto's server did not start on port {self.port}") from None
                time.sleep(0.1)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def open_uploads(self, bucket: str) -> list[str]:
        uploads = self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return [u["Key"] for u in uploads]
