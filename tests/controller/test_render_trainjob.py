"""render_trainjob: the TrainJob (Trainer v2.3) a spec with ``api: trainjob`` becomes, and the
spec rules that keep a TrainJob from silently dropping what it cannot carry.

The golden file (tests/controller/golden/trainjob.yaml) pins examples/trainjob.yaml; these tests
pin each part of the mapping.
"""

from __future__ import annotations

import pytest
import yaml

from controller.errors import UserError
from controller.render.job import render_job
from controller.render.pytorchjob import render_pytorchjob
from controller.render.trainjob import render_trainjob
from controller.spec import PYTORCHJOB_ONLY, load_spec, validate_spec
from tests.controller.conftest import REPO, minimal

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def render(**fields):
    return render_trainjob(validate_spec(minimal(api="trainjob", **fields)))


def patched_pod(job):
    """The pod template of the one runtimePatches entry (replicated job `node`)."""
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == "ddpjob/spec"
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    return rjob["template"]["spec"]["template"]


def test_api_and_runtime_ref():
    job = render()
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert render(runtime="my-torch")["spec"]["runtimeRef"]["name"] == "my-torch"


def test_trainer_carries_image_command_args_nodes_and_resources():
    job = render(
        nodes=3,
        nproc_per_node=4,
        resources={"gpus": 4, "cpu": "8", "memory": "32Gi"},
        trainer={"max_steps": 10, "lr": 1e-3},
    )
    t = job["spec"]["trainer"]
    assert t["image"] == "repo/trainer:1"
    assert t["command"] == ["python", "-m", "trainer"]
    assert t["args"] == ["lr=0.001", "max_steps=10"]
    assert (t["numNodes"], t["numProcPerNode"]) == (3, 4)  # ints: "auto" would count CPUs
    assert t["resourcesPerNode"] == {
        "limits": {"nvidia.com/gpu": 4, "cpu": "8", "memory": "32Gi"},
        "requests": {"cpu": "8", "memory": "32Gi"},
    }
    assert render(command=["bash", "-c", "x"], args=["a"])["spec"]["trainer"]["command"] == [
        "bash",
        "-c",
        "x",
    ]


def test_env_unbuffered_first_then_users_then_secret_refs():
    env = render(env={"B": "2", "A": "1"}, secret_env={"TOKEN": {"secret": "creds", "key": "t"}})[
        "spec"
    ]["trainer"]["env"]
    assert env == [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DDPJOB_JOB_NAME", "value": "job"},
        {
            "name": "DDPJOB_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "DDPJOB_JOB_API", "value": "trainjob"},
        {"name": "DDPJOB_IMAGE", "value": "repo/trainer:1"},
        {"name": "B", "value": "2"},
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "t"}}},
    ]


def test_pod_settings_go_through_one_runtime_patch():
    job = render(
        service_account="trainer",
        node_selector={"pool": "gpu"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        image_pull_secrets=["regcred"],
        volumes=[{"name": "ckpt", "claim": "ckpts", "mount_path": "/ckpt", "read_only": True}],
        shm_size="512Mi",
        labels={"team": "ml"},
        annotations={"example.com/note": "hi"},
    )
    template = patched_pod(job)
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "job"
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",  # the trainer serves its metrics
        "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics",
        "example.com/note": "hi",
    }
    pod = template["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["name"] == "node"
    # runtimePatches refuse env for container `node` and have no image/resources: only these.
    assert set(c) == {"name", "securityContext", "volumeMounts"}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "ckpt", "mountPath": "/ckpt", "readOnly": True},
    ]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpts"}},
    ]


def test_grace_period_goes_through_the_patch_and_the_trainers_env():
    job = render(grace_period_s=120)
    assert patched_pod(job)["spec"]["terminationGracePeriodSeconds"] == 120
    assert job["spec"]["trainer"]["env"][-1] == {"name": "DDPJOB_GRACE_PERIOD_S", "value": "120"}
    assert "terminationGracePeriodSeconds" not in patched_pod(render())["spec"]


def test_the_pod_is_the_pytorchjobs_pod():
    """The pieces a TrainJob patches in are exactly the PyTorchJob's pod, for the same spec."""
    fields = {
        "service_account": "sa",
        "node_selector": {"a": "b"},
        "tolerations": [{"operator": "Exists"}],
        "image_pull_secrets": ["r"],
        "volumes": [{"name": "d", "claim": "c", "mount_path": "/d", "sub_path": "x"}],
        "labels": {"l": "v"},
        "annotations": {"k": "v"},
        "env": {"E": "1"},
    }
    tj = render(**fields)
    pj = render_pytorchjob(validate_spec(minimal(**fields)))
    master = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    patched = patched_pod(tj)
    assert patched["metadata"] == master["metadata"]
    (mc,) = master["spec"]["containers"]
    (pc,) = patched["spec"]["containers"]
    for key in ("securityContext", "volumeMounts"):
        assert pc[key] == mc[key], key
    for key in ("serviceAccountName", "nodeSelector", "tolerations", "imagePullSecrets"):
        assert patched["spec"][key] == master["spec"][key], key
    assert patched["spec"]["volumes"] == master["spec"]["volumes"]
    # The same env but for the API it names.
    api = {"name": "DDPJOB_JOB_API", "value": "pytorchjob"}
    tj_env = [api if e["name"] == "DDPJOB_JOB_API" else e for e in tj["spec"]["trainer"]["env"]]
    assert tj_env[1:] == mc["env"]
    assert tj["spec"]["trainer"]["resourcesPerNode"] == mc["resources"]
    assert tj["metadata"] == pj["metadata"]


def test_queue_label_on_the_trainjob_only_suspend_and_deadline():
    job = render(queue="team-a", suspend=True, active_deadline_s=600)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in patched_pod(job)["metadata"]["labels"]
    assert job["spec"]["suspend"] is True
    assert job["spec"]["activeDeadlineSeconds"] == 600
    assert "activeDeadlineSeconds" not in render()["spec"]


def test_no_key_carries_null():
    def walk(x, path="$"):
        if isinstance(x, dict):
            for k, v in x.items():
                assert v is not None, f"{path}.{k}"
                walk(v, f"{path}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")

    walk(render())
    walk(render(args=[], command=["x"], volumes=[], tolerations=[]))


# ---------------------------------------------------------------------------------------------
# The spec: api, runtime, and what a TrainJob cannot carry


def test_api_defaults_to_pytorchjob_and_set_switches_every_plain_spec(tmp_path):
    assert validate_spec(minimal()).api == "pytorchjob"
    spec = load_spec(str(QUICKSTART), ["api=trainjob"])
    job = render_job(spec)
    assert job["kind"] == "TrainJob"
    assert job["spec"]["trainer"]["numNodes"] == 2
    assert render_job(load_spec(str(QUICKSTART)))["kind"] == "PyTorchJob"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("elastic", {"min_nodes": 1, "max_nodes": 2}),
        ("gang", {"scheduler_name": "volcano"}),
        ("priority_class", "high"),
        ("restart_policy", "ExitCode"),  # the default, but said: still an error
        ("restart_policy", "OnFailure"),
        ("backoff_limit", 3),
        ("ttl_after_finished_s", 60),
        ("clean_pod_policy", "All"),
    ],
)
def test_a_pytorchjob_only_field_set_for_a_trainjob_is_named_with_why(field, value):
    with pytest.raises(UserError) as e:
        validate_spec(minimal(api="trainjob", **{field: value}))
    (line,) = e.value.problems
    assert line.startswith(f"{field}: a TrainJob cannot carry it: ")
    assert PYTORCHJOB_ONLY[field] in line
    assert "(got " in line and line.endswith("Remove it, or use api: pytorchjob")


def test_with_a_queue_a_trainjob_carries_priority_class_as_kueues_label():
    """A TrainJob's pods cannot get a priorityClassName (runtimePatches), but Kueue's
    WorkloadPriorityClass is a label on the TrainJob: with a queue, priority_class is that."""
    job = render_job(validate_spec(minimal(api="trainjob", queue="q", priority_class="high")))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert job["spec"]["suspend"] is True
    assert "priorityClassName" not in str(job)
    (patch,) = job["spec"]["runtimePatches"]
    pod_meta = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    labels = pod_meta["spec"]["template"]["metadata"]["labels"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in labels)


def test_every_pytorchjob_only_field_is_a_spec_field():
    from controller.spec import JobSpec

    assert set(PYTORCHJOB_ONLY) <= set(JobSpec.model_fields)


def test_runtime_with_a_pytorchjob_is_an_error_and_must_be_a_name():
    with pytest.raises(UserError, match=r"^runtime: only a TrainJob runs on a runtime"):
        validate_spec(minimal(runtime="torch-distributed"))
    with pytest.raises(UserError, match=r"runtime: .*lowercase DNS subdomain"):
        validate_spec(minimal(api="trainjob", runtime="Torch_Distributed"))
    with pytest.raises(UserError, match=r"^api: Input should be 'pytorchjob' or 'trainjob'"):
        validate_spec(minimal(api="tfjob"))


def test_trainjob_name_must_leave_room_for_jobsets_pod_names():
    # JobSet's webhook: "<name>-node-0-<nodes-1>-abcde" must be a DNS-1035 label (<= 63).
    fits = "a" * (63 - len("-node-0-9-abcde"))
    validate_spec(minimal(api="trainjob", name=fits, nodes=10))
    with pytest.raises(UserError, match=r"is 64 characters.*Shorten name to at most 48 "):
        validate_spec(minimal(api="trainjob", name=fits + "a", nodes=10))
    # The PyTorchJob's rule is its own: "<name>-worker-8" fits.
    validate_spec(minimal(name=fits + "a", nodes=10))


def test_labels_of_jobset_and_trainer_are_reserved():
    keys = ("jobset.sigs.k8s.io/jobset-name", "trainer.kubeflow.org/x", "batch.kubernetes.io/y")
    for key in keys:
        with pytest.raises(UserError, match="is set by ddpjob or the operator"):
            validate_spec(minimal(api="trainjob", labels={key: "v"}))


def test_reserved_torch_env_is_refused_before_the_webhook_would():
    for name in ("PET_MASTER_ADDR", "PET_NODE_RANK", "MASTER_ADDR", "PYTHONUNBUFFERED"):
        with pytest.raises(UserError, match=f"{name} is set by the training operator"):
            validate_spec(minimal(api="trainjob", env={name: "x"}))


def test_the_example_is_the_quickstart_as_a_trainjob():
    example = yaml.safe_load((REPO / "examples" / "trainjob.yaml").read_text())
    quick = yaml.safe_load(QUICKSTART.read_text())
    assert example.pop("api") == "trainjob"
    assert example.pop("name") == "trainjob"
    quick.pop("name")
    example["trainer"]["checkpoint"].pop("dir"), quick["trainer"]["checkpoint"].pop("dir")
    assert example == quick
