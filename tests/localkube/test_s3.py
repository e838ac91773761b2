"""The local cluster's S3 server (localkube/addons/s3.py) as its users meet it: up with the
cluster, answering S3 at its endpoint from the host and, by its Service's name, from a pod on
the real node, with boto3 as the trainer uses it; the Secret and the bucket there; wrong
credentials and a missing bucket answered with S3's own codes. What ``down`` leaves of it:
test_node.py's ``test_a_killed_node_is_cleaned_up_and_down_restores_the_machine``."""

from __future__ import annotations

import base64
import io
import json
import os
import uuid
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from localkube.addons import s3
from localkube.handle import temporary_namespace, wait_until
from localkube.node import host
from tests.localkube.s3_probe import ask

pytestmark = pytest.mark.cluster


def _secret(cluster, namespace: str = s3.SECRET_NAMESPACE) -> dict[str, str]:
    data = cluster.get_json("secret", s3.SECRET, "-n", namespace)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def test_the_server_answers_s3_at_its_host_endpoint(cluster):
    state = cluster.control_plane.read_state()
    assert "s3" in state["processes"]
    url = f"{s3.HOST_ENDPOINT}/{s3.BUCKET}"
    assert ask(s3.HOST_ENDPOINT + s3.HEALTH_PATH) == [200, "OK"]
    assert ask(url) == [403, "AccessDenied"]  # anonymous
    assert ask(url, "nobody") == [403, "InvalidAccessKeyId"]
    assert ask(url, s3.ACCESS_KEY) == [403, "SignatureDoesNotMatch"]


def _client(access_key: str, secret_key: str):
    return boto3.client(
        "s3",
        endpoint_url=s3.HOST_ENDPOINT,
        region_name=s3.REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(retries={"max_attempts": 1}),
    )


def _code(call) -> str:
    """The S3 error code ``call()`` is answered with."""
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


def test_boto3_on_the_host_does_what_the_trainer_does(cluster):
    """PutObject, a multipart upload, HeadObject, a ranged GetObject, ListObjectsV2 by prefix,
    DeleteObjects; a missing bucket and wrong credentials answered as S3 answers them."""
    creds = s3.credentials(cluster.control_plane.state_dir)
    client = _client(creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"])
    prefix = f"host-{uuid.uuid4().hex[:8]}/"
    client.head_bucket(Bucket=s3.BUCKET)
    client.put_object(Bucket=s3.BUCKET, Key=prefix + "small", Body=b"x" * 1000)
    data = os.urandom(1 << 20) * 24  # 24 MiB in 5 MiB parts: a multipart upload of 5 parts
    parts = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    client.upload_fileobj(io.BytesIO(data), s3.BUCKET, prefix + "big", Config=parts)
    head = client.head_object(Bucket=s3.BUCKET, Key=prefix + "big")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].endswith('-5"')  # assembled from 5 parts
    got = client.get_object(Bucket=s3.BUCKET, Key=prefix + "big", Range="bytes=7340032-7340131")
    assert got["Body"].read() == data[7340032:7340132]
    listed = client.list_objects_v2(Bucket=s3.BUCKET, Prefix=prefix)
    assert sorted(o["Key"] for o in listed["Contents"]) == [prefix + "big", prefix + "small"]
    # On disk under the state folder, one file per object.
    root = s3.data_dir(cluster.control_plane.state_dir) / "root" / s3.BUCKET
    assert (root / prefix / "big").read_bytes() == data
    gone = client.delete_objects(
        Bucket=s3.BUCKET, Delete={"Objects": [{"Key": prefix + "big"}, {"Key": prefix + "small"}]}
    )
    assert len(gone["Deleted"]) == 2
    assert client.list_objects_v2(Bucket=s3.BUCKET, Prefix=prefix)["KeyCount"] == 0

    missing = "no-such-bucket"
    assert _code(lambda: client.put_object(Bucket=missing, Key="k", Body=b"")) == "NoSuchBucket"
    assert _code(lambda: client.list_objects_v2(Bucket=missing)) == "NoSuchBucket"
    unknown = _client("nobody", creds["AWS_SECRET_ACCESS_KEY"])
    assert _code(lambda: unknown.list_objects_v2(Bucket=s3.BUCKET)) == "InvalidAccessKeyId"
    wrong = _client(creds["AWS_ACCESS_KEY_ID"], "wrong")
    assert _code(lambda: wrong.list_objects_v2(Bucket=s3.BUCKET)) == "SignatureDoesNotMatch"


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
                        {"name": "KEY", "value": f"pods/{name}/object"},
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
        phase = cluster.get_json("pod", name, "-n", namespace)["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_until(f"pod {name} finished", finished, 180, 0.5)
    log = cluster.kubectl("logs", name, "-n", namespace).stdout
    assert phase == "Succeeded", log[-3000:]
    return json.loads(log.strip().splitlines()[-1])


def test_a_pod_reaches_the_server_by_its_service_name(cluster):
    """A pod of the trainer image with the Secret's keys and the endpoint in its environment:
    the name resolves to the gateway, the server refuses what it should, and boto3 configured by
    the environment alone writes an object the host then reads."""
    name = f"s3-client-{uuid.uuid4().hex[:6]}"
    with temporary_namespace(cluster, "s3", level="restricted") as namespace:
        _copy_secret(cluster, namespace)
        got = _run_pod(cluster, namespace, name, PROBE.read_text())
    assert got["address"] == host.GATEWAY  # CoreDNS, through the Service's EndpointSlice
    assert got["health"] == [200, "OK"]
    assert got["anonymous"] == [403, "AccessDenied"]
    assert got["unknown_key"] == [403, "InvalidAccessKeyId"]
    assert got["wrong_secret"] == [403, "SignatureDoesNotMatch"]
    key = f"pods/{name}/object"
    assert got["listed"] == [key]
    assert got["read"] == "written in a pod"
    creds = s3.credentials(cluster.control_plane.state_dir)
    client = _client(creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"])
    assert client.get_object(Bucket=s3.BUCKET, Key=key)["Body"].read() == b"written in a pod"
    client.delete_object(Bucket=s3.BUCKET, Key=key)
