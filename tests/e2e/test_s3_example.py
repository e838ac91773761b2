"""examples/s3-checkpoints.yaml runs as written on the local cluster: its endpoint, bucket and
Secret are the cluster's S3 server's (localkube/addons/s3.py), its pods mount no volume, and
what it checkpoints is in the bucket, complete (a manifest beside the state it describes). The
run is shortened, as the other examples' are (test_examples.py); the Secret is copied into the
test's namespace, since a spec's ``secret_env`` reads the job's own."""

from __future__ import annotations

import json

import boto3
import pytest
import yaml

from localkube.addons import s3
from localkube.builds import images
from tests.e2e.helpers import REPO, ddpjob, events
from tests.e2e.test_examples import SHORT

EXAMPLE = REPO / "examples" / "s3-checkpoints.yaml"


def _client(cluster):
    creds = s3.credentials(cluster.control_plane.state_dir)
    return boto3.client(
        "s3",
        endpoint_url=s3.HOST_ENDPOINT,
        region_name=s3.REGION,
        aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
    )


def _copy_secret(cluster, namespace: str) -> None:
    creds = s3.credentials(cluster.control_plane.state_dir)
    literals = [f"--from-literal={k}={v}" for k, v in creds.items()]
    cluster.kubectl("create", "secret", "generic", s3.SECRET, "-n", namespace, *literals)


def _keys(client, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=s3.BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_the_example_names_the_local_clusters_server_bucket_and_secret():
    spec = yaml.safe_load(EXAMPLE.read_text())
    assert spec["image"] == images.published_ref()
    assert spec["env"]["AWS_ENDPOINT_URL"] == s3.ENDPOINT
    assert spec["env"]["AWS_REGION"] == s3.REGION
    refs = {k: (v["secret"], v["key"]) for k, v in spec["secret_env"].items()}
    assert refs == {k: (s3.SECRET, k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    assert spec["trainer"]["checkpoint"]["dir"].startswith(f"s3://{s3.BUCKET}/")
    assert "volumes" not in spec


@pytest.mark.slow
@pytest.mark.whole_node
def test_the_s3_example_as_written_checkpoints_into_the_clusters_bucket(cluster, namespace):
    spec = yaml.safe_load(EXAMPLE.read_text())
    prefix = spec["trainer"]["checkpoint"]["dir"].removeprefix(f"s3://{s3.BUCKET}/") + "/"
    client = _client(cluster)
    # The example resumes (resume: auto): start from an empty prefix, whatever ran before.
    for key in _keys(client, prefix):
        client.delete_object(Bucket=s3.BUCKET, Key=key)
    _copy_secret(cluster, namespace)

    r = ddpjob(cluster, "submit", str(EXAMPLE), "-n", namespace, "--wait", *SHORT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"job {namespace}/s3-checkpoints Succeeded" in r.stdout
    name = spec["name"]
    log = cluster.kubectl("logs", f"{name}-master-0", "-n", namespace).stdout
    (done,) = events(log, "done")
    assert (done["reason"], done["step"]) == ("completed", 20)
    # The run's end is a save (every_steps is 200): one checkpoint, at step 20, in the bucket.
    (saved,) = events(log, "checkpoint")
    step = f"{prefix}step_00000020"
    assert (saved["step"], saved["path"]) == (20, f"s3://{s3.BUCKET}/{step}")
    # (Beside the checkpoints, the trainer's goodput ledger: trainer/health/ledger.py.)
    saved_keys = [k for k in _keys(client, prefix) if k.startswith(f"{prefix}step_")]
    assert saved_keys == [f"{step}/manifest.json", f"{step}/state.pt"]
    manifest = json.loads(
        client.get_object(Bucket=s3.BUCKET, Key=f"{step}/manifest.json")["Body"].read()
    )
    state = client.head_object(Bucket=s3.BUCKET, Key=f"{step}/state.pt")
    assert manifest["step"] == 20
    assert manifest["objects"]["state.pt"]["bytes"] == state["ContentLength"] == saved["bytes"]
    # No volume: the pods' only one is their /dev/shm.
    pods = cluster.get_json("pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}")
    assert pods["items"]
    for pod in pods["items"]:
        assert all("persistentVolumeClaim" not in v for v in pod["spec"].get("volumes", [])), pod
