"""examples/fsdp.yaml runs as written on the local cluster (only shorter), as a 2-pod PyTorchJob:
the lm task sharded over both pods (strategy fsdp), every rank writing its own shard of each
checkpoint into the cluster's S3 server. A worker pod deleted mid-run: its SIGTERM stops both
ranks at one step, whose checkpoint every rank writes before exiting 143; the pods that follow
resume at exactly that step and the job Succeeds.

The example as a TrainJob (``--set api=trainjob``) renders and validates offline
(test_the_fsdp_example_renders_as_a_trainjob_too); a TrainJob's pods recovering from a deleted
pod through a checkpoint on S3 is test_trainjob.py's ``test_a_trainjob_recovers[preempt]``. The
strategy is the trainer's, the same under either API.

The Secret is copied into the test's namespace (a spec's ``secret_env`` reads the job's own), and
the example's prefix emptied first (it resumes: ``resume: auto``)."""

from __future__ import annotations

import json

import pytest
import yaml

from controller.kubeflow import LABEL_JOB_NAME
from controller.render.trainjob import render_trainjob
from controller.spec import load_spec
from localkube.addons import s3
from localkube.builds import images
from localkube.handle import wait_until
from tests.e2e.helpers import REPO, Background, ExitCodes, ddpjob, events, last_step
from tests.e2e.test_s3_example import _client, _copy_secret, _keys
from trainer.sizing import parameter_count

EXAMPLE = REPO / "examples" / "fsdp.yaml"
SPEC = yaml.safe_load(EXAMPLE.read_text())
PREFIX = SPEC["trainer"]["checkpoint"]["dir"].removeprefix(f"s3://{s3.BUCKET}/")
#: The run is shortened (as test_examples.py's are), from the example's 150 steps: the worker is
#: deleted past step 30, and 50 steps more leave it time to stop the job before it ends.
MAX_STEPS = 80


def test_the_fsdp_example_is_the_lm_task_sharded_into_the_clusters_bucket():
    assert SPEC["image"] == images.published_ref()
    assert (SPEC["nodes"], SPEC["nproc_per_node"]) == (2, 1)
    t = SPEC["trainer"]
    assert (t["task"], t["strategy"]) == ("lm", "fsdp")
    assert t["checkpoint"]["dir"].startswith(f"s3://{s3.BUCKET}/") and "volumes" not in SPEC
    assert SPEC["env"]["AWS_ENDPOINT_URL"] == s3.ENDPOINT
    assert parameter_count("lm", t["task_args"]) > 500_000  # a model, not a stub
    assert t["max_steps"] >= MAX_STEPS > t["checkpoint"]["every_steps"]


def test_the_fsdp_example_renders_as_a_trainjob_too():
    """The example's ``--set api=trainjob`` line: the same trainer settings (strategy fsdp,
    checkpoints on S3) and environment (the endpoint, the keys from the Secret) reach the
    TrainJob's two nodes."""
    spec = load_spec(str(EXAMPLE), ["api=trainjob"])
    job = render_trainjob(spec)["spec"]["trainer"]
    assert (job["numNodes"], job["numProcPerNode"]) == (2, 1)
    args = dict(a.split("=", 1) for a in job["args"])
    assert (args["task"], args["strategy"]) == ("lm", "fsdp")
    assert args["checkpoint.dir"] == SPEC["trainer"]["checkpoint"]["dir"]
    env = {e["name"]: e for e in job["env"]}
    assert env["AWS_ENDPOINT_URL"]["value"] == s3.ENDPOINT
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("s3-credentials", key)


@pytest.mark.slow
@pytest.mark.whole_node
def test_the_fsdp_example_survives_a_deleted_worker_and_resumes_at_its_step(
    cluster, namespace, tmp_path
):
    name = SPEC["name"]
    client = _client(cluster)
    for key in _keys(client, f"{PREFIX}/"):
        client.delete_object(Bucket=s3.BUCKET, Key=key)
    _copy_secret(cluster, namespace)
    shorter = ("--set", f"trainer.max_steps={MAX_STEPS}")
    r = ddpjob(cluster, "submit", str(EXAMPLE), "-n", namespace, *shorter)
    assert r.returncode == 0, r.stdout + r.stderr
    exits = ExitCodes(cluster, namespace, f"{LABEL_JOB_NAME}={name}")
    follow = Background(cluster, tmp_path, "logs", "logs", name, "-n", namespace, "-f")
    try:
        wait_until(
            "training past step 30", lambda: last_step(follow.out_path.read_text()) >= 30, 300, 0.5
        )
        cluster.kubectl("delete", "pod", f"{name}-worker-0", "-n", namespace, "--wait=false")
        w = ddpjob(cluster, "wait", name, "-n", namespace, "--timeout", "420", timeout=450)
        assert w.returncode == 0, w.stdout + w.stderr
        code, out, err = follow.result(120)
    finally:
        follow.stop()
        runs = exits.stop()
    assert code == 0, err[-3000:]

    # The deleted pod's SIGTERM stopped both ranks at one step, every rank wrote its shard of
    # it, and both exited 143; their next runs 0.
    assert sorted(c for _, _, c in runs) == [0, 0, 143, 143], runs
    first_run, second_run = out.split('{"event": "resume"', 1)
    (stopped,) = events(first_run, "done")
    assert stopped["reason"] == "preempted" and stopped["step"] >= 30
    saved = events(first_run, "checkpoint")[-1]
    assert (saved["step"], saved["shards"]) == (stopped["step"], 2)
    (resumed,) = events(out, "resume")
    step_dir = f"{PREFIX}/step_{stopped['step']:08d}"
    assert (resumed["step"], resumed["path"]) == (stopped["step"], f"s3://{s3.BUCKET}/{step_dir}")
    assert all(e["step"] > stopped["step"] for e in events(second_run, "train"))
    assert [d["reason"] for d in events(out, "done")][-1] == "completed"
    assert last_step(out) == MAX_STEPS

    # The last checkpoint in the bucket: one shard per rank, DCP's index, rank 0's state and
    # the manifest that lists them all.
    final = f"{PREFIX}/step_{MAX_STEPS:08d}"
    objects = [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json", "state.pt"]
    assert [k for k in _keys(client, f"{final}/")] == [f"{final}/{o}" for o in objects]
    body = client.get_object(Bucket=s3.BUCKET, Key=f"{final}/manifest.json")["Body"].read()
    manifest = json.loads(body)
    assert (manifest["strategy"], manifest["world_size"]) == ("fsdp", 2)
    assert set(manifest["objects"]) == set(objects) - {"manifest.json"}
