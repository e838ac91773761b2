"""render_pytorchjob: the PyTorchJob shape the Kubeflow operator expects, for any valid spec.

Golden files (tests/controller/golden/) pin each example's manifest byte for byte: ``make
generate`` writes them, tests/test_generated.py fails while one is stale, and their diff is
reviewed like code. The tests here pin the shape, case by case.
"""

from __future__ import annotations

import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.errors import UserError
from controller.render.args import encode_value, trainer_args
from controller.render.output import to_yaml
from controller.render.pytorchjob import render_pytorchjob
from controller.spec import JobSpec, validate_spec
from tests.controller.conftest import EXAMPLES, REPO, minimal
from trainer.config import build_config

GOLDEN = REPO / "tests" / "controller" / "golden"


def render(**fields):
    return render_pytorchjob(validate_spec(minimal(**fields)))


def templates(job):
    return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]


# ---------------------------------------------------------------------------------------------
# Golden files (written by `make generate`; tests/test_generated.py holds them current)


def test_every_golden_file_has_an_example():
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == sorted(p.stem for p in EXAMPLES)


# ---------------------------------------------------------------------------------------------
# Shape, case by case


def test_master_and_workers():
    job = render(nodes=3)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master", "Worker"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert all(r["restartPolicy"] == "ExitCode" for r in replicas.values())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"


def test_one_node_has_no_worker():
    assert list(render(nodes=1)["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_container_contract():
    job = render(nodes=2, nproc_per_node=4, resources={"gpus": 4, "memory": "8Gi"})
    for t in templates(job):
        (c,) = t["spec"]["containers"]
        assert c["name"] == "pytorch"
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        assert c["command"] == ["python", "-m", "trainer"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "cpu": "1", "memory": "8Gi"}
        assert c["resources"]["requests"] == {"cpu": "1", "memory": "8Gi"}
    assert job["spec"]["nprocPerNode"] == "4"


def test_cpu_job_asks_for_no_gpu():
    (c,) = templates(render())[0]["spec"]["containers"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


def test_restricted_security_context_with_writable_emptydirs():
    pod = templates(render(shm_size="512Mi"))[0]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (c,) = pod["containers"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    assert pod["volumes"][:2] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "512Mi"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    assert c["volumeMounts"][:2] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def test_labels_queue_on_job_only():
    job = render(queue="team-a", labels={"team": "a"})
    labels = job["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "ddpjob",
        "app.kubernetes.io/instance": "job",
        "app.kubernetes.io/component": "trainer",
        "app.kubernetes.io/part-of": "ddpjob",
        "app.kubernetes.io/managed-by": "ddpjob",
        "kueue.x-k8s.io/queue-name": "team-a",
        "team": "a",
    }
    pod_labels = templates(job)[0]["metadata"]["labels"]
    assert "kueue.x-k8s.io/queue-name" not in pod_labels and pod_labels["team"] == "a"


def test_secret_env_is_a_reference_never_a_value(monkeypatch):
    monkeypatch.setenv("TOKEN", "s3cr3t-value")
    job = render(env={"A": "1"}, secret_env={"TOKEN": {"secret": "creds", "key": "token"}})
    (c,) = templates(job)[0]["spec"]["containers"]
    assert c["env"] == [
        *OWN,
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    assert "s3cr3t-value" not in to_yaml(job)


#: The pod's node, from the downward API, which the trainer's stuck and straggler events name.
NODE_NAME = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
#: What the trainer reads of its job (the metrics' labels, the MLflow run's name and tags).
JOB = [
    {"name": "DDPJOB_JOB_NAME", "value": "job"},
    {"name": "DDPJOB_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "DDPJOB_JOB_API", "value": "pytorchjob"},
    {"name": "DDPJOB_IMAGE", "value": "repo/trainer:1"},
]
OWN = [NODE_NAME, *JOB]


def test_every_pod_learns_its_node_and_job_unless_the_user_sets_them():
    for role in templates(render(nodes=2)):
        assert role["spec"]["containers"][0]["env"] == OWN
    env = {"NODE_NAME": "mine", "A": "1", "DDPJOB_JOB_NAME": "other"}
    (c,) = templates(render(env=env))[0]["spec"]["containers"]
    assert c["env"] == [*JOB[1:], *({"name": k, "value": v} for k, v in env.items())]


def test_pods_are_annotated_for_a_scrape_where_the_trainer_serves_metrics():
    (meta,) = {json.dumps(t["metadata"]) for t in templates(render(nodes=2))}
    assert json.loads(meta)["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics",
    }
    mine = render(annotations={"prometheus.io/port": "1234"}, trainer={"prometheus": {"port": 99}})
    assert templates(mine)[0]["metadata"]["annotations"]["prometheus.io/port"] == "1234"
    off = render(trainer={"prometheus": {"serve": False}})
    assert "annotations" not in templates(off)[0]["metadata"]


def test_run_policy_and_gang():
    job = render(
        nodes=4,
        gang={"scheduler_name": "volcano"},
        priority_class="high",
        backoff_limit=5,
        active_deadline_s=60,
        ttl_after_finished_s=30,
        suspend=True,
        clean_pod_policy="All",
    )
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "All",
        "backoffLimit": 5,
        "activeDeadlineSeconds": 60,
        "ttlSecondsAfterFinished": 30,
        "suspend": True,
        "schedulingPolicy": {"minAvailable": 4, "priorityClass": "high"},
    }
    pod = templates(job)[0]["spec"]
    assert pod["schedulerName"] == "volcano" and pod["priorityClassName"] == "high"
    assert "kueue.x-k8s.io/priority-class" not in job["metadata"]["labels"]


def test_a_queue_suspends_the_job_and_makes_priority_class_kueues():
    """With a queue, priority_class is the WorkloadPriorityClass label on the job, not the
    pods' PriorityClass (nor the gang's), and the job is created suspended for Kueue."""
    job = render(nodes=2, queue="q", priority_class="high", gang={})
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "q"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2, "queue": "q"}
    for template in templates(job):
        assert "priorityClassName" not in template["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in template["metadata"]["labels"])
    assert render(queue="q")["spec"]["runPolicy"]["suspend"] is True
    assert "kueue.x-k8s.io/priority-class" not in render(queue="q")["metadata"]["labels"]
    assert render()["spec"]["runPolicy"]["suspend"] is False


def test_no_gang_no_scheduling_policy_and_no_nulls():
    job = render()
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    assert "null" not in to_yaml(job)


def test_elastic_is_workers_only_with_c10d():
    job = render(nodes=3, elastic={"min_nodes": 2, "max_nodes": 5, "max_restarts": 7}, gang={})
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2, "maxReplicas": 5, "rdzvBackend": "c10d", "maxRestarts": 7,
    }  # fmt: skip
    assert "nProcPerNode" not in job["spec"]["elasticPolicy"]  # the webhook forbids it here
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Worker"] and replicas["Worker"]["replicas"] == 3
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 2


def test_an_elastic_job_keeps_its_pods_unless_told_otherwise():
    """The operator ends an elastic job as soon as any worker succeeds; the default Running
    would then delete the workers still finishing (rank 0's log among them): None instead."""
    elastic = {"min_nodes": 2, "max_nodes": 2}
    assert render(nodes=2)["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert render(nodes=2, elastic=elastic)["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert (
        render(nodes=2, elastic=elastic, clean_pod_policy="All")["spec"]["runPolicy"][
            "cleanPodPolicy"
        ]
        == "All"
    )
    assert render(nodes=2, clean_pod_policy="None")["spec"]["runPolicy"]["cleanPodPolicy"] == (
        "None"
    )


def test_volumes_tolerations_selectors_pull_secrets():
    job = render(
        volumes=[
            {"name": "ckpt", "claim": "pvc", "mount_path": "/ckpt", "sub_path": "a"},
            {"name": "data", "claim": "ds", "mount_path": "/data", "read_only": True},
        ],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"pool": "gpu"},
        image_pull_secrets=["regcred"],
        service_account="trainer",
    )
    pod = templates(job)[0]["spec"]
    assert pod["volumes"][2:] == [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "pvc"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "ds"}},
    ]
    assert pod["containers"][0]["volumeMounts"][2:] == [
        {"name": "ckpt", "mountPath": "/ckpt", "subPath": "a"},
        {"name": "data", "mountPath": "/data", "readOnly": True},
    ]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "trainer"


def test_a_rank0_only_volume_is_on_the_master_alone():
    """A ReadWriteOnce claim for checkpoints: rank 0 (the Master) reads and writes them, so
    only its pod mounts it; a volume without rank0_only stays on every pod."""
    job = render(
        nodes=3,
        volumes=[
            {"name": "ckpt", "claim": "rwo", "mount_path": "/ckpt", "rank0_only": True},
            {"name": "data", "claim": "ds", "mount_path": "/data", "read_only": True},
        ],
    )
    replicas = job["spec"]["pytorchReplicaSpecs"]
    master, worker = (replicas[r]["template"]["spec"] for r in ("Master", "Worker"))
    assert [v["name"] for v in master["volumes"]] == ["dshm", "tmp", "ckpt", "data"]
    assert [m["name"] for m in master["containers"][0]["volumeMounts"]] == [
        "dshm", "tmp", "ckpt", "data"
    ]  # fmt: skip
    assert [v["name"] for v in worker["volumes"]] == ["dshm", "tmp", "data"]
    assert [m["name"] for m in worker["containers"][0]["volumeMounts"]] == ["dshm", "tmp", "data"]
    assert replicas["Worker"]["replicas"] == 2


def test_a_rank0_only_volume_needs_a_master():
    volume = {"name": "ckpt", "claim": "rwo", "mount_path": "/ckpt", "rank0_only": True}
    elastic = {"min_nodes": 1, "max_nodes": 3}
    for fields, got in (({"api": "trainjob"}, "api trainjob"), ({"elastic": elastic}, "elastic")):
        with pytest.raises(UserError) as e:
            validate_spec(minimal(nodes=2, volumes=[volume], **fields))
        (line,) = e.value.problems
        assert line.startswith("volumes.0.rank0_only: "), line
        assert f"(got {got}, volume ckpt). Use checkpoint.dir: s3://..." in line


def test_grace_period_is_the_pods_and_the_trainers():
    job = render(nodes=2, grace_period_s=600, env={"A": "1"})
    for template in templates(job):
        pod = template["spec"]
        assert pod["terminationGracePeriodSeconds"] == 600
        assert pod["containers"][0]["env"][len(OWN) :] == [
            {"name": "A", "value": "1"},
            {"name": "DDPJOB_GRACE_PERIOD_S", "value": "600"},
        ]  # after the pod's and the job's
    # Unset: Kubernetes' default, which the trainer assumes in a pod; nothing rendered.
    pod = templates(render())[0]["spec"]
    assert "terminationGracePeriodSeconds" not in pod
    assert pod["containers"][0]["env"] == OWN


def test_the_grace_periods_variable_is_the_specs_to_set():
    for field in ("env", "secret_env"):
        value = "5" if field == "env" else {"secret": "s", "key": "k"}
        with pytest.raises(UserError) as e:
            validate_spec(minimal(**{field: {"DDPJOB_GRACE_PERIOD_S": value}}))
        assert e.value.problems == [
            f"{field}: DDPJOB_GRACE_PERIOD_S is set from grace_period_s; set that instead"
        ]
    with pytest.raises(UserError, match="grace_period_s: Input should be greater than or equal"):
        validate_spec(minimal(grace_period_s=0))


def test_custom_command_and_args_pass_through():
    (c,) = templates(render(command=["bash", "-c"], args=["echo hi"]))[0]["spec"]["containers"]
    assert (c["command"], c["args"]) == (["bash", "-c"], ["echo hi"])


def test_default_trainer_passes_no_args():
    (c,) = templates(render())[0]["spec"]["containers"]
    assert "args" not in c


def test_args_are_sorted_dotted_and_only_what_was_set():
    spec = validate_spec(minimal(trainer={
        "max_steps": 20, "lr": 1e-5, "checkpoint": {"dir": "/ckpt"}, "betas": [0.9, 0.95],
        "task_args": {"width": 16, "odd key": "a, b"}, "resume": "true",
    }))  # fmt: skip
    assert trainer_args(spec.trainer) == [
        "betas=[0.9, 0.95]",
        "checkpoint.dir=/ckpt",
        "lr=1.0e-05",
        "max_steps=20",
        'resume="true"',
        'task_args={"width": 16, "odd key": "a, b"}',
    ]


def test_render_is_deterministic_and_has_no_yaml_anchors():
    spec = validate_spec(yaml.safe_load((REPO / "examples" / "gpu.yaml").read_text()))
    first, second = to_yaml(render_pytorchjob(spec)), to_yaml(render_pytorchjob(spec))
    assert first == second
    assert "&id" not in first and "*id" not in first


# ---------------------------------------------------------------------------------------------
# Properties over generated specs

names = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
words = st.text(string.ascii_lowercase, min_size=1, max_size=8)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64), st.text(max_size=12),
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(words, inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def specs(draw):
    nodes = draw(st.integers(1, 8))
    nproc = draw(st.integers(1, 8))
    gpus = draw(st.sampled_from([0, nproc, 8]))
    data = minimal(name=draw(names), nodes=nodes, nproc_per_node=nproc,
                   resources={"gpus": gpus, "memory": "4Gi"})  # fmt: skip
    if draw(st.booleans()):
        low = draw(st.integers(1, nodes))
        data["elastic"] = {"min_nodes": low, "max_nodes": draw(st.integers(nodes, 16))}
    if draw(st.booleans()):
        data["gang"] = {"min_available": draw(st.integers(1, nodes))}
    if draw(st.booleans()):
        data["queue"] = draw(words)
    data["env"] = draw(
        st.dictionaries(
            st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True).filter(
                lambda k: k not in ("RANK",)
            ),
            words,
            max_size=3,
        )
    )
    data["volumes"] = [
        {"name": f"v{i}", "claim": draw(words), "mount_path": f"/mnt/{i}"}
        for i in range(draw(st.integers(0, 2)))
    ]
    max_steps = draw(st.integers(1, 10**6))
    trainer = {"max_steps": max_steps}
    if draw(st.booleans()):
        trainer["lr"] = draw(st.floats(1e-9, 10.0))
    if draw(st.booleans()):
        trainer["task_args"] = draw(st.dictionaries(words, json_values, max_size=3))
    if draw(st.booleans()):
        trainer["checkpoint"] = {
            "dir": draw(st.text(min_size=1, max_size=20).filter(_a_local_directory))
        }
    data["trainer"] = trainer
    return validate_spec(data)


def _a_local_directory(text: str) -> bool:
    # The spec refuses a blank dir and any scheme but s3:// (trainer.config's _dir_form).
    return bool(text.strip()) and "://" not in text and not _looks_like_exponent(text)


def _looks_like_exponent(text: str) -> bool:
    # trainer.config.parse_overrides turns a top-level `1e5` string into a float, even quoted.
    import re

    return re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", text) is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_any_valid_spec_renders_a_sound_pytorchjob(spec: JobSpec):
    job = render_pytorchjob(spec)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == spec.nodes
    if spec.elastic:
        assert list(replicas) == ["Worker"]
    else:
        assert replicas["Master"]["replicas"] == 1
        assert ("Worker" in replicas) == (spec.nodes > 1)
    for r in replicas.values():
        containers = r["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["pytorch"]
        assert containers[0]["ports"][0]["name"] == "pytorchjob-port"
        assert len(f"{spec.name}-worker-{max(r['replicas'], 1) - 1}") <= 63
    assert job["spec"]["nprocPerNode"] == str(spec.nproc_per_node)
    # What `kubectl apply` would read is what we built: no anchors, no lost types.
    assert yaml.safe_load(to_yaml(job)) == job
    # The trainer parses its args back into exactly the validated settings.
    args = replicas[next(iter(replicas))]["template"]["spec"]["containers"][0].get("args", [])
    assert build_config(None, args) == spec.trainer


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_task_arg_value_reads_back_through_yaml(value):
    assert yaml.safe_load(encode_value(value)) == value


def test_custom_task_example_names_a_factory_that_exists():
    import ast

    spec = validate_spec(yaml.safe_load((REPO / "examples" / "custom-task.yaml").read_text()))
    module, _, factory = spec.trainer.task.partition(":")
    source = REPO / (module.replace(".", "/") + ".py")
    tree = ast.parse(source.read_text())
    assert factory in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    args = templates(render_pytorchjob(spec))[0]["spec"]["containers"][0]["args"]
    assert f"task={spec.trainer.task}" in args
