"""The local cluster's S3 server (localkube/addons/s3.py) as its users meet it: up with the
cluster, answering S3 at its endpoint from the host and, by its Service's name, from a pod on
the real node; the Secret and the bucket there; wrong credentials refused with S3's own codes.
What ``down`` leaves of it: test_node.py's ``test_cluster_down_restores_the_machine``."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from localkube.addons import s3
from localkube.handle import temporary_namespace, wait_until
from localkube.node import host
from tests.localkube.s3_probe import ask

pytestmark = pytest.mark.cluster


def _secret(cluster, namespace: str = s3.SECRET_NAMESPACE) -> dict[str, str]:
    out = cluster.kubectl("get", "secret", s3.SECRET, "-n", namespace, "-o", "json").stdout
    return {k: base64.b64decode(v).decode() for k, v in json.loads(out)["data"].items()}


def test_the_server_answers_s3_at_its_host_endpoint(cluster):
    state = cluster.control_plane.read_state()
    assert "s3" in state["processes"]
    url = f"{s3.HOST_ENDPOINT}/{s3.BUCKET}"
    assert ask(s3.HOST_ENDPOINT + s3.HEALTH_PATH) == [200, "OK"]
    assert ask(url) == [403, "AccessDenied"]  # anonymous
    assert ask(url, "nobody") == [403, "InvalidAccessKeyId"]
    assert ask(url, s3.ACCESS_KEY) == [403, "SignatureDoesNotMatch"]


def test_the_secret_holds_the_servers_credentials_and_the_bucket_exists(cluster):
    creds = s3.credentials(cluster.control_plane.state_dir)
    assert _secret(cluster) == creds
    assert set(creds) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert (s3.data_dir(cluster.control_plane.state_dir) / "root" / s3.BUCKET).is_dir()
    # The gateway's own view: the right access key with a wrong signature is a signature
    # mismatch, not an unknown key, so the Secret names the account it runs with.
    url = f"{s3.HOST_ENDPOINT}/{s3.BUCKET}"
    assert ask(url, creds["AWS_ACCESS_KEY_ID"]) == [403, "SignatureDoesNotMatch"]


PROBE = Path(__file__).with_name("s3_probe.py")


def _pod(name: str, image: str, script: str) -> dict:
    """A restricted pod of the trainer image on the real node: the Secret's keys and the
    endpoint in its environment, as a spec's ``secret_env`` and ``env`` put them."""
    secret_env = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": s3.SECRET, "key": k}}}
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script],
                    "env": [
                        {"name": "AWS_ENDPOINT_URL", "value": s3.ENDPOINT},
                        {"name": "AWS_REGION", "value": s3.REGION},
                        {"name": "BUCKET", "value": s3.BUCKET},
                        {"name": "HEALTH_PATH", "value": s3.HEALTH_PATH},
                        *secret_env,
                    ],
                    "resources": {"limits": {"cpu": "250m", "memory": "512Mi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }


def _copy_secret(cluster, namespace: str) -> None:
    """The Secret from ``default`` into ``namespace`` (a spec's ``secret_env`` reads its job's)."""
    creds = _secret(cluster)
    literals = [f"--from-literal={k}={v}" for k, v in creds.items()]
    cluster.kubectl("create", "secret", "generic", s3.SECRET, "-n", namespace, *literals)


def _run_pod(cluster, namespace: str, name: str, script: str) -> dict:
    """Run ``script`` in a pod of the trainer image; its last line of output, as JSON."""
    pod = _pod(name, cluster.trainer_image(), script)
    cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=json.dumps(pod))

    def finished():
        out = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
        phase = json.loads(out)["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_until(f"pod {name} finished", finished, 180, 0.5)
    log = cluster.kubectl("logs", name, "-n", namespace).stdout
    assert phase == "Succeeded", log[-3000:]
    return json.loads(log.strip().splitlines()[-1])


def test_a_pod_reaches_the_server_by_its_service_name(cluster):
    with temporary_namespace(cluster, "s3", level="restricted") as namespace:
        _copy_secret(cluster, namespace)
        got = _run_pod(cluster, namespace, "s3-client", PROBE.read_text())
    assert got["address"] == host.GATEWAY  # CoreDNS, through the Service's EndpointSlice
    assert got["health"] == [200, "OK"]
    assert got["anonymous"] == [403, "AccessDenied"]
    assert got["unknown_key"] == [403, "InvalidAccessKeyId"]
    assert got["wrong_secret"] == [403, "SignatureDoesNotMatch"]
