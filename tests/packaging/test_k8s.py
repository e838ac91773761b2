"""The raw manifests in k8s/, statically: what `kubectl apply -k k8s/` would create.

The same manifests go through the real apiserver (server-side dry run, PodSecurity admission,
RBAC) in test_cluster_packaging.py.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from controller.jobs.doctor import PERMISSIONS
from controller.render.pytorchjob import render_pytorchjob
from controller.spec import validate_spec

from .conftest import EXAMPLES, K8S, ROOT, tools

NAMESPACE = "ddpjob"


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    """The pinned kubectl the tools folder holds (built now if missing)."""
    built = tools.bin_path("kubectl")
    if not built.exists():
        tools.build()
    return str(built)


@pytest.fixture(scope="module")
def objects(kubectl_bin) -> list[dict[str, Any]]:
    """`kubectl kustomize k8s/`, parsed."""
    out = subprocess.run(
        [kubectl_bin, "kustomize", str(K8S)], capture_output=True, text=True, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


#: The CLI's identity and the trainer's pods' (k8s/rbac.yaml), each a ServiceAccount, a Role and
#: a RoleBinding of that name.
CONTROLLER, TRAINER = "ddpjob-controller", "ddpjob-trainer"


def by_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def test_kustomization_lists_every_manifest():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


def test_everything_lands_in_the_restricted_namespace(objects):
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        ["Namespace", "PersistentVolumeClaim", "PyTorchJob"]
        + ["ServiceAccount", "Role", "RoleBinding"] * 2
    )
    ns = by_kind(objects, "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    labels = ns["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", mode
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]


def _granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames games
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((verb, resource, group))
    return out


def test_role_grants_exactly_what_the_controller_calls(objects):
    """doctor.PERMISSIONS lists every API call the CLI makes; the Role is that list, plus `get
    pods` for `kubectl logs <pod>` with the same identity. Nothing else."""
    granted = _granted(by_kind(objects, "Role", CONTROLLER))
    needed = {
        (verb, f"{res}/{sub}" if sub else res, group) for verb, res, group, sub, _ in PERMISSIONS
    }
    assert needed <= granted, needed - granted
    assert granted - needed == {("get", "pods", "")}
    # What must never be there; of ConfigMaps only create (a workdir's, owned by its job):
    # nothing of the CLI reads one back, so no one else's ConfigMap is readable with this Role.
    resources = {r for _, r, _ in granted}
    assert not resources & {"secrets", "pods/exec", "pods/attach", "roles"}
    assert {v for v, r, _ in granted if r == "configmaps"} == {"create"}
    assert not {v for v, r, _ in granted if r == "pods"} - {"get", "list", "watch"}


@pytest.mark.parametrize("name", [CONTROLLER, TRAINER])
def test_rolebinding_binds_the_role_to_the_service_account(objects, name):
    binding = by_kind(objects, "RoleBinding", name)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": name,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


def test_only_the_trainers_account_mounts_a_token(objects):
    """The CLI's account is for people and CI outside the cluster; the trainer's pods read and
    patch their own job with theirs (trainer/health/nodes.py)."""
    assert (
        by_kind(objects, "ServiceAccount", CONTROLLER).get("automountServiceAccountToken") is False
    )
    assert (
        by_kind(objects, "ServiceAccount", TRAINER).get("automountServiceAccountToken") is not False
    )


def test_the_trainers_role_reads_and_patches_its_job_and_nothing_else(objects):
    """trainer/health/nodes.py's JobApi: GET and a merge PATCH of the job, one resource per API."""
    from trainer.health.nodes import RESOURCES

    groups = {api: path.split("/")[2] for api, path in RESOURCES.items()}
    plurals = {api: path.rsplit("/", 2)[-2] for api, path in RESOURCES.items()}
    assert _granted(by_kind(objects, "Role", TRAINER)) == {
        (verb, plurals[api], groups[api]) for api in RESOURCES for verb in ("get", "patch")
    }


def test_pvc_is_shared_by_all_nodes(objects):
    pvc = by_kind(objects, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # The name examples/gpu.yaml mounts.
    gpu = yaml.safe_load((ROOT / "examples" / "gpu.yaml").read_text())
    assert pvc["metadata"]["name"] in {v["claim"] for v in gpu["volumes"]}


def test_example_job_is_what_controller_render_gives(objects):
    job = by_kind(objects, "PyTorchJob")
    (quickstart,) = [p for p in EXAMPLES if p.name == "quickstart.yaml"]
    data = yaml.safe_load(quickstart.read_text())
    expected = render_pytorchjob(validate_spec({**data, "namespace": NAMESPACE}))
    assert job == expected, "k8s/pytorchjob.yaml is stale: run `make generate`"


def test_operator_init_container_template_is_restricted():
    """k8s/operator/: the operator's Go template, filled in, is one compliant container."""
    text = (K8S / "operator" / "init-container-restricted.yaml").read_text()
    for var in ("{{.InitContainerImage}}", "{{.MaxTries}}", "{{.MasterAddr}}"):
        assert var in text, var
        text = text.replace(var, "x")
    (container,) = yaml.safe_load(text)
    assert container["name"] == "init-pytorch"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
