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


class Outage:
    """An HTTP proxy in front of an S3 server that can refuse writes for a while: every PUT,
    POST and DELETE is answered ``503 SlowDown`` (S3's answer when it sheds load) while
    ``refusing`` is set, and everything else passes through. Point the trainer at :attr:`url`
    (its :attr:`env`) and set or clear :attr:`refusing` from the test."""

    WRITES = ("PUT", "POST", "DELETE")

    def __init__(self, upstream: MotoServer):
        import threading

        self.upstream = upstream
        self.refusing = threading.Event()
        self.refused = 0  # writes answered 503
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def env(self) -> dict[str, str]:
        return {**self.upstream.env, "AWS_ENDPOINT_URL": self.url}

    def __enter__(self) -> Outage:
        import http.server
        import threading

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        import http.client
        import http.server

        outage = self
        upstream_port = int(self.upstream.url.rsplit(":", 1)[1])

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _any(self) -> None:
                body = self._body()
                if self.command in Outage.WRITES and outage.refusing.is_set():
                    outage.refused += 1
                    text = (
                        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                        b"<Message>Please reduce your request rate.</Message></Error>"
                    )
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("transfer-encoding", "content-length", "connection")
                }
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status, answer.reason)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        return Handler
