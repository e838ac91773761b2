"""A job that cannot start, on the local cluster's real node: `wait`, `submit --wait` and
`--follow` say why (the kubelet's and the scheduler's own words) before their `--timeout` ends,
each reason once, and the timeout's error names it. Three ways a first job gets stuck, over
both APIs and the three commands:

- an image no registry serves (a TrainJob, `submit --wait`): the image and the registry's
  answer, not just ImagePullBackOff; `localhost:1` refuses at once, so no registry's day
  matters;
- a Secret the spec's `secret_env` names that does not exist (a PyTorchJob, `wait`);
- a job too big for any node (a PyTorchJob submitted with --force, `submit --follow`): the
  scheduler's message.

The reasons themselves, shape by shape: tests/controller/test_why_unit.py."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import ddpjob, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: Each command gives up after this: a reason must come before (the issue: within 30 s).
TIMEOUT_S = "25"
BAD_IMAGE = "localhost:1/ddpjob/no-such-image:0.1"


def _said(stderr: str, what: str) -> list[str]:
    """The lines before the final error that say ``what``."""
    before = stderr.split("\nerror: ")[0]
    return [line for line in before.splitlines() if what in line]


def test_an_image_that_cannot_be_pulled_is_named_with_the_registrys_answer(
    real_node, namespace, tmp_path
):
    spec = write_spec(
        real_node, tmp_path, "bad-image", namespace, api="trainjob", nodes=1, image=BAD_IMAGE
    )
    r = ddpjob(real_node, "submit", str(spec), "--wait", "--timeout", TIMEOUT_S, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    (said,) = _said(r.stderr, "cannot be pulled")  # once, though the kubelet retries
    assert said.startswith("job bad-image: pod bad-image-node-0-0-"), said
    assert f'image "{BAD_IMAGE}" cannot be pulled: ' in said
    assert "connection refused" in said  # what the registry (here: nobody) answered
    error = r.stderr.split("\nerror: ")[1]
    assert error.startswith(f"submit: job {namespace}/bad-image has not ended after 25 s (got ")
    assert "cannot be pulled" in error.splitlines()[0] and "Traceback" not in r.stderr


def test_a_missing_secret_is_named_by_wait(real_node, namespace, tmp_path):
    spec = write_spec(
        real_node,
        tmp_path,
        "no-secret",
        namespace,
        nodes=1,
        secret_env={"API_TOKEN": {"secret": "not-created", "key": "token"}},
    )
    r = ddpjob(real_node, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    w = ddpjob(real_node, "wait", "no-secret", "-n", namespace, "--timeout", TIMEOUT_S, timeout=120)
    assert w.returncode == 1, w.stdout + w.stderr
    said = _said(w.stderr, "CreateContainerConfigError")
    assert len(said) == 1, w.stderr  # once (ci26: twice, its lines not kept)
    (said,) = said
    assert said == (
        "job no-secret: pod no-secret-master-0 is not running: CreateContainerConfigError: "
        'secret "not-created" not found'
    )
    assert 'secret "not-created" not found' in w.stderr.split("\nerror: ")[1].splitlines()[0]
    st = ddpjob(real_node, "status", "no-secret", "-n", namespace)
    assert (
        'pending: no-secret-master-0: CreateContainerConfigError: secret "not-created"' in st.stdout
    )


def test_a_job_too_big_for_any_node_is_explained_by_follow(real_node, namespace, tmp_path):
    spec = write_spec(
        real_node, tmp_path, "too-big", namespace, nodes=1, resources={"cpu": "64", "memory": "1Gi"}
    )
    r = ddpjob(
        real_node, "submit", str(spec), "--force", "--follow", "--timeout", TIMEOUT_S, timeout=120
    )
    assert r.returncode == 1, r.stdout + r.stderr
    # Once per change of the scheduler's message, not once per second: ci7 (cold) saw it
    # twice, as the scheduler's words for the other nodes changed during the 25 s.
    said = _said(r.stderr, "Unschedulable")
    assert 1 <= len(said) <= 3 and len(set(said)) == len(said), r.stderr
    for line in said:
        assert line.startswith("logs: pod too-big-master-0 is not running: Unschedulable: 0/")
        assert "Insufficient cpu" in line, r.stderr
    first = r.stderr.split("\nerror: ")[1].splitlines()[0]
    assert first.startswith(f"submit: job {namespace}/too-big has not ended after 25 s")
    assert "Insufficient cpu" in first
