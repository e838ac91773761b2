"""The local cluster's S3 server: the Versity S3 Gateway (``versitygw``, Apache-2.0, built
unmodified by ``builds/s3server.py``) as a host process with its posix backend, its files under
the state folder (``.cluster/s3/``, which ``down`` removes).

- Address: the node's bridge gateway at the fixed port :data:`PORT`, which the pods and the host
  both reach (``gateway.py``): the URL a spec's ``AWS_ENDPOINT_URL`` names carries the server's
  own port. Pods use :data:`ENDPOINT`, the host :data:`HOST_ENDPOINT`.
- Bucket :data:`BUCKET`: a folder of the posix root (versitygw serves each top-level folder as a
  bucket). Object metadata lives in a sidecar folder beside the root, so any filesystem serves
  (no extended attributes needed).
- Credentials: access key :data:`ACCESS_KEY` and a secret drawn at each ``up``. The Secret
  :data:`SECRET` in namespace ``default`` holds them as ``AWS_ACCESS_KEY_ID`` and
  ``AWS_SECRET_ACCESS_KEY`` (what a spec's ``secret_env`` names), and so does
  ``.cluster/s3/credentials.json`` for the host (:func:`credentials`).
- The gateway's internal IAM (``--iam-dir``), holding only that root account: in its
  single-account mode the gateway answers an unknown access key with 404 XAdminUserNotFound,
  with the IAM as S3 does (403 InvalidAccessKeyId).

The server needs the node's bridge: it runs with the real node only (:data:`ENABLED`).
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..controlplane.context import Component, http_get
from ..node import host
from . import gateway

if TYPE_CHECKING:
    from ..controlplane.context import Context

ENABLED = host.ENABLED
#: Fixed, outside the pool the other components' ports come from (``procs.free_ports``).
PORT = 7070
NAMESPACE = "ddpjob-system"
SERVICE = "s3"
DNS = f"{SERVICE}.{NAMESPACE}.svc"
ENDPOINT = f"http://{DNS}:{PORT}"
HOST_ENDPOINT = f"http://{host.GATEWAY}:{PORT}"
REGION = "us-east-1"
BUCKET = "ddpjob"
SECRET = "s3-credentials"
SECRET_NAMESPACE = "default"
ACCESS_KEY = "ddpjob"
#: Answers GET without credentials; an underscore never starts a bucket name, so it hides none.
HEALTH_PATH = "/_health"


def data_dir(state_dir: Path) -> Path:
    """Everything the server keeps: ``root/`` (a folder per bucket), ``meta/``, ``iam/``."""
    return state_dir / "s3"


def credentials(state_dir: Path) -> dict[str, str]:
    """The root account of the running cluster's server, by the AWS tools' variable names."""
    return json.loads((data_dir(state_dir) / "credentials.json").read_text())


def _write_credentials(state_dir: Path) -> dict[str, str]:
    path = data_dir(state_dir) / "credentials.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        creds = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secrets.token_hex(20)}
        path.touch(mode=0o600)
        path.write_text(json.dumps(creds))
    return credentials(state_dir)


def preflight(repo: Path) -> None:
    """One line when something else on this machine holds :data:`PORT` on every address."""
    if ENABLED:
        gateway.check_port(PORT, "S3 server")


def objects(creds: dict[str, str]) -> list[dict]:
    """The Service pods name the server by, its EndpointSlice to the gateway, and the Secret."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *gateway.service(SERVICE, NAMESPACE, "s3", PORT),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": SECRET_NAMESPACE},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()},
        },
    ]


def apply_objects(ctx: Context) -> None:
    """Draw the credentials and apply :func:`objects`."""
    creds = _write_credentials(ctx.state_dir)
    ctx.apply("\n---\n".join(yaml.safe_dump(o) for o in objects(creds)))


def prepare(ctx: Context) -> None:
    """The posix root with the bucket's folder, the metadata and IAM folders."""
    data = data_dir(ctx.state_dir)
    for path in (data / "root" / BUCKET, data / "meta", data / "iam"):
        path.mkdir(parents=True, exist_ok=True)


def argv(ctx: Context) -> list[str]:
    data = data_dir(ctx.state_dir)
    return [
        str(ctx.bindir / "versitygw"),
        *("--port", f"{host.GATEWAY}:{PORT}"),
        *("--iam-dir", str(data / "iam")),
        *("--health", HEALTH_PATH),
        "posix",
        *("--sidecar", str(data / "meta")),
        str(data / "root"),
    ]


def env(ctx: Context) -> dict[str, str]:
    """The root account by environment, so the secret is not on the command line."""
    creds = credentials(ctx.state_dir)
    return {
        "ROOT_ACCESS_KEY_ID": creds["AWS_ACCESS_KEY_ID"],
        "ROOT_SECRET_ACCESS_KEY": creds["AWS_SECRET_ACCESS_KEY"],
        "VGW_REGION": REGION,
    }


def ready(ctx: Context) -> bool:
    return http_get(HOST_ENDPOINT + HEALTH_PATH).strip() == "OK"


S3 = Component("s3", argv, ready, env=env, prepare=prepare)
