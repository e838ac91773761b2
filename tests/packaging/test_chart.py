"""The Helm chart: lint, the strict values schema, and one truth with `controller render`.

`controller render SPEC --values` fed to `helm template` must give exactly the job (PyTorchJob or
TrainJob) `controller render SPEC` gives, for every example spec and for specs that reach every
branch of the templates. Only Helm's own labels differ (helm.sh/chart; managed-by says Helm).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.render.job import render_job, render_objects
from controller.render.pytorchjob import render_pytorchjob
from controller.render.values import render_values
from controller.spec import JobSpec, validate_spec

from .conftest import (
    CHART,
    CI_VALUES,
    EXAMPLES,
    HELM_CHART_LABEL,
    MANAGED_BY_LABEL,
    ROOT,
    helm_template,
    spec_values,
    without_helm_labels,
)

# Specs beyond the examples, so that every branch of the templates is compared with render.
SPECS: dict[str, dict[str, Any]] = {
    "single-node": {"name": "solo", "image": "repo/trainer:1"},
    # Without a queue, priority_class is the pods' PriorityClass (and the gang's); with one
    # (elastic-gang, trainjob-every-field), Kueue's WorkloadPriorityClass label on the job.
    "pod-priority": {
        "name": "urgent",
        "image": "repo/trainer:1",
        "nodes": 2,
        "priority_class": "high",
        "gang": {},
    },
    "elastic-gang": {
        "name": "stretch",
        "image": "repo/trainer:1",
        "nodes": 3,
        "elastic": {"min_nodes": 2, "max_nodes": 4, "max_restarts": 5},
        "gang": {"scheduler_name": "volcano"},
        "queue": "team-b",
        "priority_class": "high",
        "trainer": {"max_steps": 10},
    },
    "every-field": {
        "name": "every-field",
        "namespace": "team-x",
        "image": "registry.example:5000/team/trainer@sha256:" + "ab" * 32,
        "command": ["python", "-m", "mypkg.train"],
        "args": ["--config", "x: y", "1e-05", "true", "", "#hash", "unicode-é"],
        "nodes": 2,
        "nproc_per_node": 2,
        "resources": {"gpus": 2, "cpu": "500m", "memory": "8Gi"},
        "shm_size": "2Gi",
        # Not in sorted order on purpose: the manifest keeps the spec's order.
        # NODE_NAME: the user's own, in place of the pod's node that ddpjob sets otherwise.
        "env": {
            "ZED": "1",
            "ALPHA": "true",
            "MULTI": "line\nbreak",
            "EMPTY": "",
            "N": "010",
            "NODE_NAME": "mine",
        },
        "secret_env": {"TOKEN": {"secret": "creds", "key": "token"}},
        "volumes": [
            {
                "name": "data",
                "claim": "datasets",
                "mount_path": "/data",
                "read_only": True,
                "sub_path": "imagenet/train",
            },
            {"name": "ckpt", "claim": "ckpts", "mount_path": "/ckpt", "rank0_only": True},
        ],
        "grace_period_s": 600,
        "node_selector": {"nvidia.com/gpu.product": "A100", "pool": "true"},
        "tolerations": [
            {
                "key": "nvidia.com/gpu",
                "operator": "Equal",
                "value": "yes",
                "effect": "NoExecute",
                "toleration_s": 30,
            },
            {"operator": "Exists"},
        ],
        "service_account": "trainer",
        "image_pull_secrets": ["regcred", "other"],
        "labels": {"team": "ml", "example.com/cost-center": "42", "flag": "true"},
        "annotations": {"example.com/note": "hello: world", "num": "1"},
        "queue": "q",
        "gang": {"min_available": 1},
        "restart_policy": "OnFailure",
        "backoff_limit": 0,
        "active_deadline_s": 100000000,  # large: a float64 in Helm must still print as an int
        "ttl_after_finished_s": 0,  # 0 is a value (delete at once), not "unset"
        "clean_pod_policy": "None",
        "suspend": True,
    },
    "trainjob-every-field": {
        "name": "tj-every-field",
        "namespace": "team-x",
        "api": "trainjob",
        "runtime": "my-torch",
        "image": "registry.example:5000/team/trainer:2",
        "command": ["python", "-m", "mypkg.train"],
        "args": ["--config", "x: y", "1e-05", "true", "", "#hash"],
        "nodes": 4,
        "nproc_per_node": 2,
        "resources": {"gpus": 2, "cpu": "500m", "memory": "8Gi"},
        "shm_size": "2Gi",
        "env": {"ZED": "1", "ALPHA": "true", "EMPTY": "", "N": "010"},
        "secret_env": {"TOKEN": {"secret": "creds", "key": "token"}},
        "volumes": [
            {
                "name": "data",
                "claim": "datasets",
                "mount_path": "/data",
                "read_only": True,
                "sub_path": "imagenet",
            },
            {"name": "ckpt", "claim": "ckpts", "mount_path": "/ckpt"},
        ],
        "grace_period_s": 120,
        "node_selector": {"pool": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account": "trainer",
        "image_pull_secrets": ["regcred"],
        "labels": {"team": "ml", "flag": "true"},
        "annotations": {"example.com/note": "hello: world"},
        "queue": "q",
        "priority_class": "high",
        "active_deadline_s": 100000000,
        "suspend": True,
    },
    "trainjob-bare": {"name": "tj", "image": "repo/trainer:1", "api": "trainjob", "nodes": 1},
    # The PodMonitor and the dashboard's ConfigMap beside the job, the metrics on another port.
    "monitoring": {
        "name": "watched",
        "namespace": "team-y",
        "image": "repo/trainer:1",
        "nodes": 2,
        "annotations": {"prometheus.io/path": "/mine"},  # the user's wins over ddpjob's
        "trainer": {"prometheus": {"port": 9100}},
        "monitoring": {
            "pod_monitor": True,
            "pod_monitor_labels": {"release": "kps"},
            "grafana_dashboard": True,
        },
    },
    "trainjob-monitoring": {
        "name": "tj-watched",
        "image": "repo/trainer:1",
        "api": "trainjob",
        "monitoring": {"pod_monitor": True},
    },
    # No metrics: no annotations; the env the trainer reads of its job set by the user.
    "no-metrics": {
        "name": "quiet",
        "image": "repo/trainer:1",
        "env": {"DDPJOB_JOB_NAME": "other-name"},
        "trainer": {"prometheus": {"serve": False}},
        "monitoring": {"grafana_dashboard": True},
    },
    "trainer-values": {
        "name": "quoting",
        "image": "repo/trainer:1",
        "trainer": {
            "lr": 1e-5,
            "betas": [0.9, 0.95],
            "task_args": {"a": 1, "b": "two words", "c": [1, 2]},
            "resume": "never",
            "tensorboard_dir": "/tmp/tb dir",
            "checkpoint": {"dir": "/ckpt/run:1", "keep": 2},
            "ema_decay": 0.999,
        },
    },
}


def _render_pair(helm, spec: JobSpec, values: dict[str, Any], tmp_path: Path):
    """The chart's documents and render's objects, paired by kind (the job first)."""
    docs = helm_template(helm, values, tmp_path, release="rel", namespace="ignored-ns")
    rendered = render_objects(spec)
    order = [o["kind"] for o in rendered]
    assert sorted(d["kind"] for d in docs) == sorted(order)
    return sorted(docs, key=lambda d: order.index(d["kind"])), rendered


def _assert_all_one_truth(chart_docs: list[dict], rendered: list[dict]) -> None:
    for chart_doc, obj in zip(chart_docs, rendered, strict=True):
        if obj["kind"] in ("PodMonitor", "ConfigMap"):
            assert without_helm_labels(chart_doc) == without_helm_labels(obj)
        else:
            _assert_one_truth(chart_doc, obj)


def _pod_labels(doc: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """(where, labels) of every pod template in a rendered job, either API."""
    if doc["kind"] == "TrainJob":
        (patch,) = doc["spec"]["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        return [("node", rjob["template"]["spec"]["template"]["metadata"]["labels"])]
    return [
        (rtype, r["template"]["metadata"]["labels"])
        for rtype, r in doc["spec"]["pytorchReplicaSpecs"].items()
    ]


def _assert_one_truth(chart_doc: dict[str, Any], rendered: dict[str, Any]) -> None:
    # The chart's two Helm labels, exactly where render has its managed-by label.
    assert chart_doc["kind"] == rendered["kind"]
    for where, labels in (("job", chart_doc["metadata"]["labels"]), *_pod_labels(chart_doc)):
        assert labels[MANAGED_BY_LABEL] == "Helm", where
        assert labels[HELM_CHART_LABEL] == "ddpjob-0.1.0", where
    assert rendered["metadata"]["labels"][MANAGED_BY_LABEL] == "ddpjob"
    assert without_helm_labels(chart_doc) == without_helm_labels(rendered)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_helm_template_equals_controller_render_for_every_example(helm, example, tmp_path):
    from controller.spec import load_spec

    values = spec_values(example)  # through the CLI, as users run it
    spec = load_spec(str(example), [])
    assert values == render_values(spec)
    _assert_all_one_truth(*_render_pair(helm, spec, values, tmp_path))


@pytest.mark.parametrize("case", SPECS, ids=str)
def test_helm_template_equals_controller_render_for_every_branch(helm, case, tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(SPECS[case], sort_keys=False))  # keep env order
    spec = validate_spec(SPECS[case])
    # JSON, so that every string arrives as a string (see the YAML test below).
    values = spec_values(spec_file, output="json")
    assert values == render_values(spec)
    _assert_all_one_truth(*_render_pair(helm, spec, values, tmp_path))


def test_render_values_yaml_reads_back_the_same_in_helm(helm, tmp_path):
    """Strings Go's YAML takes for bools or numbers (y, 1e-05, 0o17) are quoted by to_yaml."""
    spec = {
        "name": "strings",
        "image": "repo/trainer:1",
        "args": ["1e-05", "0o17", "y"],
        "env": {"N": "n", "Y": "on"},
        "labels": {"flag": "y"},
    }
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [sys.executable, "-m", "controller", "render", str(spec_file), "--values"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    values_file = tmp_path / "values.yaml"
    values_file.write_text(out.stdout)
    (doc,) = helm_template(helm, values_file, tmp_path)
    _assert_one_truth(doc, render_pytorchjob(validate_spec(spec)))


def test_the_branch_specs_reach_every_branch():
    """The SPECS table is only worth its name if it covers each optional part of the render."""
    specs = [validate_spec(s) for s in SPECS.values()]
    rendered = [render_pytorchjob(s) for s in specs if s.api == "pytorchjob"]
    trainjobs = [render_job(s) for s in specs if s.api == "trainjob"]
    text = json.dumps(rendered)
    for needle in (
        '"elasticPolicy"',
        '"schedulingPolicy"',
        '"schedulerName"',
        '"priorityClassName"',
        '"serviceAccountName"',
        '"imagePullSecrets"',
        '"tolerationSeconds"',
        '"subPath"',
        '"readOnly"',
        '"secretKeyRef"',
        '"annotations"',
        '"kueue.x-k8s.io/queue-name"',
        '"kueue.x-k8s.io/priority-class"',
        '"activeDeadlineSeconds"',
        '"ttlSecondsAfterFinished"',
        '"nvidia.com/gpu"',
        '"nodeSelector"',
        '"terminationGracePeriodSeconds"',
        '"DDPJOB_GRACE_PERIOD_S"',
        '"prometheus.io/port": "9100"',
    ):
        assert needle in text, needle
    # Every pod annotated for a scrape but where the trainer serves no metrics.
    annotated = ['"prometheus.io/scrape"' in json.dumps(r) for r in rendered]
    assert any(annotated) and not all(annotated)
    beside = [o["kind"] for s in specs for o in render_objects(s)[1:]]
    assert {"PodMonitor", "ConfigMap"} <= set(beside)
    # A rank0_only volume: on a Master, not on its Workers.
    assert any(
        len(r["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"])
        > len(r["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"])
        for r in rendered
        if {"Master", "Worker"} <= set(r["spec"]["pytorchReplicaSpecs"])
    )
    replica_sets = [set(r["spec"]["pytorchReplicaSpecs"]) for r in rendered]
    assert {"Master"} in replica_sets and {"Worker"} in replica_sets
    assert {"Master", "Worker"} in replica_sets
    text = json.dumps(trainjobs)
    for needle in (
        '"activeDeadlineSeconds"',
        '"serviceAccountName"',
        '"imagePullSecrets"',
        '"tolerations"',
        '"subPath"',
        '"readOnly"',
        '"secretKeyRef"',
        '"annotations"',
        '"kueue.x-k8s.io/queue-name"',
        '"kueue.x-k8s.io/priority-class"',
        '"nvidia.com/gpu"',
        '"nodeSelector"',
        '"args"',
        '"terminationGracePeriodSeconds"',
        '"DDPJOB_GRACE_PERIOD_S"',
    ):
        assert needle in text, needle
    assert any("args" not in j["spec"]["trainer"] for j in trainjobs)


def test_job_name_defaults_to_the_release_and_namespace_to_the_releases(helm, tmp_path):
    values = {"args": ["max_steps=5"]}
    (doc,) = helm_template(helm, values, tmp_path, release="nightly", namespace="ml")
    assert doc["metadata"]["name"] == "nightly-ddpjob"
    assert doc["metadata"]["namespace"] == "ml"
    labels = doc["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "nightly-ddpjob"
    assert doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "args"
    ] == ["max_steps=5"]


@pytest.mark.parametrize(
    "values",
    [
        {"elastic": {"min_nodes": 1, "max_nodes": 2, "max_restarts": 3}},
        {"gang": {"scheduler_name": "volcano"}},
        {"priority_class": "high"},
        {"restart_policy": "OnFailure"},
        {"backoff_limit": 6},
        {"ttl_after_finished_s": 60},
        {"clean_pod_policy": "All"},
        {"clean_pod_policy": "Running"},
    ],
    ids=lambda v: next(iter(v)),
)
def test_a_trainjob_with_a_pytorchjob_only_value_fails_like_the_spec(helm, values, tmp_path):
    path = tmp_path / "tj.yaml"
    path.write_text(yaml.safe_dump({"api": "trainjob", **values}))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0, f"accepted {values}"
    (field,) = values
    assert f"{field}: a TrainJob cannot carry it" in proc.stderr, proc.stderr
    with pytest.raises(Exception, match=f"{field}: a TrainJob cannot carry it"):
        validate_spec({"name": "x", "image": "i", "api": "trainjob", **values})


def test_an_elastic_job_keeps_its_pods_and_refuses_running_like_the_spec(helm, tmp_path):
    elastic = {"nodes": 2, "elastic": {"min_nodes": 2, "max_nodes": 2, "max_restarts": 3}}
    (doc,) = helm_template(helm, elastic, tmp_path)
    assert doc["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    (doc,) = helm_template(helm, {"nodes": 2}, tmp_path)
    assert doc["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    path = tmp_path / "running.yaml"
    path.write_text(yaml.safe_dump({**elastic, "clean_pod_policy": "Running"}))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0 and "(got Running with elastic)" in proc.stderr, proc.stderr
    with pytest.raises(Exception, match=r"\(got Running with elastic\)"):
        validate_spec({"name": "x", "image": "i", **elastic, "clean_pod_policy": "Running"})


@pytest.mark.parametrize(
    "values",
    [{"api": "trainjob"}, {"elastic": {"min_nodes": 1, "max_nodes": 2, "max_restarts": 3}}],
    ids=["trainjob", "elastic"],
)
def test_a_rank0_only_volume_without_a_master_fails_like_the_spec(helm, values, tmp_path):
    volume = {"name": "ckpt", "claim": "rwo", "mount_path": "/ckpt", "rank0_only": True}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"nodes": 2, "volumes": [volume], **values}))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0, f"accepted {values}"
    assert "volumes.0.rank0_only: " in proc.stderr, proc.stderr
    with pytest.raises(Exception, match=r"volumes\.0\.rank0_only: "):
        validate_spec({"name": "x", "image": "i", "nodes": 2, "volumes": [volume], **values})


def test_a_trainjob_name_too_long_for_jobset_pods_fails_like_the_spec(helm, tmp_path):
    name = "a" * 48  # "<name>-node-0-9-abcde" = 63 fits; "-node-0-10-abcde" does not
    (doc,) = helm_template(helm, {"name": name, "nodes": 10, "api": "trainjob"}, tmp_path)
    assert doc["kind"] == "TrainJob" and doc["metadata"]["name"] == name
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"name": name, "nodes": 11, "api": "trainjob"}))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0 and "pod and service names hold 63" in proc.stderr
    with pytest.raises(Exception, match="Shorten name"):
        validate_spec({"name": name, "image": "i", "nodes": 11, "api": "trainjob"})


def test_a_name_too_long_for_worker_pods_fails_like_the_spec(helm, tmp_path):
    name = "a" * 54  # "<name>-worker-9" = 63 fits; with 11 workers "-worker-10" does not
    (doc,) = helm_template(helm, {"name": name, "nodes": 10}, tmp_path)
    assert doc["metadata"]["name"] == name
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"name": name, "nodes": 12}))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0
    assert "pod and service names hold 63" in proc.stderr
    with pytest.raises(Exception, match="Shorten name"):
        validate_spec({"name": name, "image": "i", "nodes": 12})


# ------------------------------------------------------------------------------------------
# lint and the values file


def test_helm_lint_strict_is_clean(helm):
    proc = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_ci_cases_exist_and_lint_clean(helm, tmp_path):
    names = {p.name for p in CI_VALUES}
    wanted = {"default-values.yaml", "elastic-values.yaml", "trainjob-values.yaml"}
    wanted |= {f"{p.stem}-values.yaml" for p in EXAMPLES}
    assert wanted <= names, wanted - names
    for path in CI_VALUES:
        proc = helm("lint", "--strict", str(CHART), "-f", str(path))
        assert "0 chart(s) failed" in proc.stdout, (path.name, proc.stdout)
        assert "[WARNING]" not in proc.stdout, (path.name, proc.stdout)
        (doc,) = helm_template(helm, path, tmp_path)
        api = yaml.safe_load(path.read_text()).get("api", "pytorchjob")
        assert doc["kind"] == {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}[api], path.name


def test_values_yaml_points_editors_at_the_schema_and_comments_every_key():
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    assert lines[0] == "# yaml-language-server: $schema=values.schema.json"
    key_line = re.compile(r"^(\s*)([A-Za-z_][\w]*):")
    for i, line in enumerate(lines):
        m = key_line.match(line)
        if not m:
            continue
        above = lines[i - 1].strip()
        assert above.startswith("#"), f"values.yaml:{i + 1}: `{m[2]}` has no comment above it"


def test_values_defaults_are_the_spec_defaults():
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    spec = JobSpec(name="x", image=defaults["image"])
    expected = render_values(spec)
    # name/namespace default to the release's; everything else is the spec's own default.
    assert defaults["name"] == "" and defaults["namespace"] == ""
    for key in ("name", "namespace"):
        expected.pop(key), defaults.pop(key)
    assert defaults == expected


# ------------------------------------------------------------------------------------------
# the strict schema


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def _objects(schema: Any, path: str = "$"):
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema:
            yield path, schema
        for k, v in schema.items():
            yield from _objects(v, f"{path}.{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            yield from _objects(v, f"{path}[{i}]")


def test_schema_is_strict_on_every_object():
    objects = list(_objects(_schema()))
    assert len(objects) >= 8
    for path, obj in objects:
        assert obj.get("additionalProperties") is False, path


def _enum(prop: dict[str, Any]) -> list[Any]:
    """The enum of a property, or of its one branch that has one (``X | null``, ``"" | X``)."""
    (found,) = [p["enum"] for p in [prop, *prop.get("anyOf", [])] if "enum" in p]
    return found


def test_schema_keys_are_the_values_keys_and_the_spec_enums():
    schema = _schema()
    keys = set(schema["properties"]) - {"global"}
    assert keys == set(render_values(JobSpec(name="x", image="i")))
    spec_schema = JobSpec.model_json_schema()
    for key in ("api", "restart_policy", "clean_pod_policy"):
        assert _enum(schema["properties"][key]) == _enum(spec_schema["properties"][key]), key
    # Every spec field has its values key, except `trainer`, which arrives as `args`, and
    # `workdir_store`, which arrives as `workdir.url`.
    assert set(spec_schema["properties"]) - {"trainer", "workdir_store"} <= keys


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"nodez": 2}, "nodez"),
        ({"resources": {"gpu": 1, "gpus": 0, "cpu": "1", "memory": "1Gi"}}, "gpu"),
        ({"nodes": 0}, "nodes"),
        ({"restart_policy": "Sometimes"}, "restart_policy"),
        ({"labels": {"app.kubernetes.io/name": "x"}}, "app.kubernetes.io/name"),
        ({"env": {"A": "1"}}, "env"),
        ({"env": [{"name": "A", "value": 1}]}, "value"),
        ({"volumes": [{"name": "tmp", "claim": "c", "mount_path": "/x"}]}, "volumes"),
        ({"volumes": [{"name": "v", "claim": "c", "mountPath": "/x"}]}, "mountPath"),
        ({"resources": {"gpus": 0, "cpu": "lots", "memory": "1Gi"}}, "cpu"),
        ({"name": "Bad_Name"}, "name"),
        ({"elastic": {"min_nodes": 1}}, "elastic"),
        ({"gang": {"min_available": 0}}, "gang"),
        ({"tolerations": [{"operator": "Maybe"}]}, "operator"),
        # Rules the values schema inherits from the spec's (controller/render/values_schema.py).
        ({"name": "a" * 64}, "name"),
        ({"namespace": "Team"}, "namespace"),
        ({"image": "repo/trainer 1"}, "image"),
        ({"command": []}, "command"),
        ({"env": [{"name": "RANK", "value": "0"}]}, "env"),
        ({"env": [{"name": "PET_NNODES", "value": "2"}]}, "env"),
        ({"secret_env": [{"name": "T", "secret": "Bad Secret", "key": "k"}]}, "secret"),
        ({"volumes": [{"name": "v", "claim": "c", "mount_path": "/tmp/"}]}, "mount_path"),
        (
            {"volumes": [{"name": "v", "claim": "c", "mount_path": "/x", "sub_path": "../up"}]},
            "sub_path",
        ),
        ({"resources": {"gpus": 0, "cpu": "1", "memory": "-1Gi"}}, "memory"),
        ({"shm_size": "1GB"}, "shm_size"),
        ({"node_selector": {"pool": "a b"}}, "node_selector"),
        ({"annotations": {"bad key": "x"}}, "bad key"),
        ({"image_pull_secrets": ["Reg Cred"]}, "image_pull_secrets"),
        ({"queue": "Team A"}, "queue"),
        # The chart has no default to merge into elastic, nor to restore a value nulled away.
        ({"elastic": {"min_nodes": 1, "max_nodes": 2}}, "max_restarts"),
        ({"resources": {"cpu": None}}, "cpu"),
        ({"api": "tfjob"}, "api"),
        ({"api": "trainjob", "runtime": "Torch_X"}, "runtime"),
    ],
    ids=lambda v: json.dumps(v)[:40] if isinstance(v, dict) else v,
)
def test_schema_rejects_bad_values(helm, values, complaint, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = helm("template", "x", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0, f"accepted {values}"
    assert "schema" in proc.stderr, proc.stderr
    assert complaint in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------
# a shipped workdir: render --values carries what the chart needs


def _project(root: Path) -> Path:
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "train.py").write_text("import mypkg\n")
    return root


WORKDIR_CASES = {
    "pytorchjob": {"nodes": 2, "env": {"PYTHONPATH": "/extra", "A": "1"}, "grace_period_s": 40},
    "trainjob": {"api": "trainjob", "nodes": 2, "secret_env": {"S": {"secret": "s", "key": "k"}}},
    "pytorchjob-s3": {"nodes": 2, "workdir_store": "s3://bucket/code"},
    "trainjob-s3": {"api": "trainjob", "workdir_store": "s3://bucket/code/"},
}


@pytest.mark.parametrize("case", WORKDIR_CASES, ids=str)
def test_helm_template_of_a_workdir_is_the_submitted_job_and_its_configmap(helm, case, tmp_path):
    from controller.workdir import configmap_manifest, pack, shipped_for

    project = _project(tmp_path / "project")
    spec_data = {"name": "wd", "image": "repo/trainer:1", "workdir": "project"}
    spec_data |= WORKDIR_CASES[case]
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data, sort_keys=False))
    spec = validate_spec(spec_data)
    with pack(project) as archive:
        shipped = shipped_for(spec.name, spec.workdir_store, archive)
        store = spec.workdir_store is not None
        if store:  # render --values uploads to a store; here the values are built directly
            values = render_values(spec, shipped)
        else:
            values = spec_values(spec_file, output="json")
            assert values == render_values(spec, shipped, archive.read_bytes())
        docs = helm_template(helm, values, tmp_path, release="rel", namespace="ignored-ns")
        want_map = None if store else configmap_manifest(shipped, "default", archive, {})
    jobs = [d for d in docs if d["kind"] != "ConfigMap"]
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    (chart_job,) = jobs
    _assert_one_truth(chart_job, render_job(spec, shipped))
    if store:
        assert maps == []
        return
    (chart_map,) = maps
    # The chart's ConfigMap is the release's (labels), the submitted one the job's (owner).
    assert chart_map["metadata"].pop("labels")["app.kubernetes.io/instance"] == "wd"
    want_map["metadata"].pop("labels")
    assert chart_map == want_map


def test_render_values_of_a_workdir_too_big_for_a_release_names_the_fix(tmp_path):
    import os

    project = _project(tmp_path / "project")
    (project / "blob.bin").write_bytes(os.urandom(400_000))
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "wd", "image": "i:1", "workdir": "project"}))
    out = subprocess.run(
        [sys.executable, "-m", "controller", "render", str(spec_file), "--values"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert "a Helm release holds" in out.stderr and "blob.bin" in out.stderr
