"""The chart and k8s/ on the real apiserver (localkube): dry runs, PodSecurity, RBAC, a job.

- `helm template` of every ci case and `kubectl apply -k k8s/` pass a server-side dry run with
  the PyTorchJob CRD and the operator's validating webhook in place.
- Pods rendered by the chart and by `controller render` are admitted under the `restricted`
  Pod Security profile by the real admission plugin; a pod that breaks it is refused.
- `helm install` of a job, run to Succeeded on the real node in a `restricted` namespace, is
  tests/e2e/test_real_node.py's.
- The shipped Role, bound to its ServiceAccount and used through a token kubeconfig, lets
  `python -m controller` submit, wait, read logs and delete, and refuses Secrets and pods.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.render.job import render_job
from controller.spec import validate_spec
from localkube.handle import wait_until

from .conftest import CHART, CI_VALUES, EXAMPLES, K8S, ROOT, tools

pytestmark = pytest.mark.cluster

K8S_NAMESPACE = "ddpjob"  # k8s/namespace.yaml
SERVICE_ACCOUNT = "ddpjob-controller"  # k8s/rbac.yaml
PSA_REFUSAL = 'violates PodSecurity "restricted:latest"'


def _wait(what: str, probe, timeout: float = 120, interval: float = 0.5):
    return wait_until(what, probe, timeout, interval)


def _ensure_namespace(cluster, name: str) -> str:
    """Create (or keep) a namespace enforcing Pod Security ``restricted``, like
    k8s/namespace.yaml."""
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "audit", "warn")}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    _apply(cluster, ns)
    _wait(
        f"service account default in {name}",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
    )
    return name


@pytest.fixture(scope="module")
def restricted(cluster) -> str:
    return _ensure_namespace(cluster, "pkg-restricted")


def _apply(cluster, *objects, dry_run: bool = False, check: bool = True):
    """``kubectl apply --server-side`` of dicts (as JSON) or ready YAML/JSON text."""
    docs = "\n---\n".join(o if isinstance(o, str) else json.dumps(o) for o in objects)
    return cluster.kubectl(
        "apply",
        "--server-side",
        *(["--dry-run=server"] if dry_run else []),
        "--field-manager",
        "ddpjob-tests",
        "-f",
        "-",
        input_text=docs,
        check=check,
    )


def _dry_run(cluster, docs: str) -> subprocess.CompletedProcess:
    return _apply(cluster, docs, dry_run=True, check=False)


# ------------------------------------------------------------------------------------------
# Server-side dry runs


@pytest.mark.parametrize("case", CI_VALUES, ids=lambda p: p.name)
def test_helm_template_of_each_ci_case_passes_server_side_dry_run(cluster, restricted, case):
    values = yaml.safe_load(case.read_text()) or {}
    namespace = _ensure_namespace(cluster, values.get("namespace") or restricted)
    out = cluster.helm("template", "ci", str(CHART), "-f", str(case), "--namespace", namespace)
    proc = _dry_run(cluster, out.stdout)
    assert proc.returncode == 0, proc.stderr
    kind = "trainjob.trainer.kubeflow" if values.get("api") == "trainjob" else "pytorchjob.kubeflow"
    assert f"{kind}.org/" in proc.stdout and "(server dry run)" in proc.stdout


def test_a_broken_manifest_fails_the_dry_run(cluster, restricted):
    """The dry run is a real check: the CRD's schema and the operator's webhook both bite."""
    out = cluster.helm("template", "ci", str(CHART), "--namespace", restricted)
    job = yaml.safe_load(out.stdout)
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2  # the webhook: must be 1
    proc = _dry_run(cluster, json.dumps(job))
    assert proc.returncode != 0
    assert "webhook" in proc.stderr, proc.stderr
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"  # the CRD schema
    proc = _dry_run(cluster, json.dumps(job))
    assert proc.returncode != 0 and "replicas" in proc.stderr, proc.stderr


def _kustomize(cluster) -> list[dict[str, Any]]:
    out = cluster.kubectl("kustomize", str(K8S))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kubectl_apply_k_k8s_passes_server_side_dry_run(cluster):
    objects = _kustomize(cluster)
    # A dry run creates nothing, so namespaced objects need their namespace to exist already.
    (ns,) = [o for o in objects if o["kind"] == "Namespace"]
    _apply(cluster, ns)
    proc = cluster.kubectl(
        "apply",
        "-k",
        str(K8S),
        "--server-side",
        "--dry-run=server",
        "--field-manager",
        "ddpjob-tests",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for kind in (
        "namespace",
        "serviceaccount",
        "role",
        "rolebinding",
        "persistentvolumeclaim",
        "pytorchjob",
    ):
        assert f"{kind}/" in proc.stdout.replace(".rbac.authorization.k8s.io", "").replace(
            ".kubeflow.org", ""
        ), (kind, proc.stdout)
    # The namespace really enforces `restricted`.
    got = json.loads(cluster.kubectl("get", "namespace", K8S_NAMESPACE, "-o", "json").stdout)
    assert got["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ------------------------------------------------------------------------------------------
# Pod Security admission


def _pods_of(job: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """The pods the operator would create from ``job`` (its templates), minus its additions."""
    if job["kind"] == "TrainJob":
        return [_trainjob_pod(job, namespace)]
    pods = []
    for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
        template = replica["template"]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{job['metadata']['name']}-{rtype.lower()}-0",
                    "namespace": namespace,
                    "labels": template["metadata"]["labels"],
                },
                "spec": template["spec"],
            }
        )
    return pods


def _trainjob_pod(job: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The pod JobSet would create for a TrainJob: the runtimePatches pod with the trainer's
    image, command, args, env and resources in container ``node`` (the runtime adds nothing a
    Pod Security check looks at)."""
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    template = rjob["template"]["spec"]["template"]
    spec = json.loads(json.dumps(template["spec"]))
    trainer = job["spec"]["trainer"]
    (container,) = spec["containers"]
    container.update(
        image=trainer["image"],
        command=trainer["command"],
        args=trainer.get("args", []),
        env=trainer["env"],
        resources=trainer["resourcesPerNode"],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job['metadata']['name']}-node-0-0",
            "namespace": namespace,
            "labels": template["metadata"]["labels"],
        },
        "spec": spec,
    }


def _create_dry(cluster, obj: dict[str, Any]) -> subprocess.CompletedProcess:
    return cluster.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "name",
        "-f",
        "-",
        input_text=json.dumps(obj),
        check=False,
    )


def _rendered_jobs() -> list[tuple[str, dict[str, Any]]]:
    """(where, PyTorchJob) for every example; quickstart.yaml (2 nodes) first; then the workdir
    example's jobs, both APIs, both roads (its init container or wrapped command, its volumes)."""
    from controller.workdir import folder_of, pack, shipped_for

    jobs = []
    for example in sorted(EXAMPLES, key=lambda p: p.name != "quickstart.yaml"):
        spec = validate_spec(yaml.safe_load(example.read_text()))
        jobs.append((f"render {example.name}", render_job(spec)))
    workdir = ROOT / "examples" / "workdir" / "workdir.yaml"
    for api in ("pytorchjob", "trainjob"):
        for store in (None, "s3://bucket/code"):
            data = yaml.safe_load(workdir.read_text()) | {"api": api, "workdir_store": store}
            spec = validate_spec(data)
            with pack(folder_of(spec.workdir, str(workdir))) as archive:
                shipped = shipped_for(spec.name, store, archive)
            jobs.append((f"render workdir.yaml {api} {store}", render_job(spec, shipped)))
    return jobs


def _ensure_priority_classes(cluster, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    """The Priority admission plugin refuses pods naming a PriorityClass that doesn't exist."""
    names = {
        r["template"]["spec"]["priorityClassName"]
        for _, job in jobs
        for r in job["spec"].get("pytorchReplicaSpecs", {}).values()
        if "priorityClassName" in r["template"]["spec"]
    }
    for name in sorted(names):
        pc = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": 1000,
        }
        _apply(cluster, pc)


def test_rendered_pods_are_admitted_under_restricted(cluster, restricted):
    jobs = _rendered_jobs()
    for case in CI_VALUES:
        out = cluster.helm("template", "ci", str(CHART), "-f", str(case), "-n", restricted)
        jobs.append((f"chart {case.name}", yaml.safe_load(out.stdout)))
    _ensure_priority_classes(cluster, jobs)
    checked = 0
    for where, job in jobs:
        for pod in _pods_of(job, restricted):
            proc = _create_dry(cluster, pod)
            assert proc.returncode == 0, (where, proc.stderr)
            # warn=restricted: a pod that only squeaks through would print a warning.
            assert "Warning" not in proc.stderr, (where, proc.stderr)
            checked += 1
    trainjobs = sum(job["kind"] == "TrainJob" for _, job in jobs)
    assert trainjobs >= 2  # examples/trainjob.yaml, rendered and through the chart
    # Master and Worker of (almost) every PyTorchJob, the node pod of every TrainJob.
    assert checked >= 2 * (len(jobs) - trainjobs) - 2 + trainjobs


def _allow_root(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"].pop("runAsNonRoot")
    pod["spec"]["containers"][0]["securityContext"].pop("runAsNonRoot")


def _allow_escalation(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def _keep_capabilities(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["securityContext"].pop("capabilities")


def _no_seccomp(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"].pop("seccompProfile")


def _host_path(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})


# One safeguard removed at a time, and the field the refusal must name.
BREAKAGES = {
    "root-allowed": (_allow_root, "runAsNonRoot"),
    "privilege-escalation": (_allow_escalation, "allowPrivilegeEscalation"),
    "capabilities-kept": (_keep_capabilities, "capabilities"),
    "no-seccomp": (_no_seccomp, "seccompProfile"),
    "host-path": (_host_path, "hostPath"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_pod_breaking_restricted_is_refused(cluster, restricted, breakage):
    """The admission check bites: the same pod, one safeguard removed, is refused."""
    (_, job), *_ = _rendered_jobs()
    pod = _pods_of(job, restricted)[0]
    assert _create_dry(cluster, pod).returncode == 0
    breaks, field = BREAKAGES[breakage]
    breaks(pod)
    proc = _create_dry(cluster, pod)
    assert proc.returncode != 0
    assert PSA_REFUSAL in proc.stderr and field in proc.stderr, proc.stderr


# The operator adds an init container to Worker pods (training-operator v1.9,
# pkg/controller.v1/pytorch/initcontainer.go): upstream's has no securityContext.
OPERATOR_INIT_TEMPLATE = K8S / "operator" / "init-container-restricted.yaml"


def _upstream_init_template() -> str | None:
    """The operator's built-in init container template, from the module the cluster runs."""
    proc = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
    version = tools.VERSIONS["training-operator"]
    source = (
        Path(proc.stdout.strip() or "/nonexistent")
        / f"github.com/kubeflow/training-operator@{version}"
        / "pkg/controller.v1/pytorch/initcontainer.go"
    )
    if not source.exists():
        return None
    text = source.read_text()
    start = text.index("initContainerTemplate = `") + len("initContainerTemplate = `")
    return text[start : text.index("`", start)]


def _init_containers(template: str, master: str) -> list[dict[str, Any]]:
    """The operator's Go template filled in as it does (image, tries, master address)."""
    for var, value in (
        ("{{.InitContainerImage}}", "alpine:3.10"),
        ("{{.MaxTries}}", "100"),
        ("{{.MasterAddr}}", master),
    ):
        template = template.replace(var, value)
    return yaml.safe_load(template)


def test_worker_pods_need_the_restricted_init_container_template(cluster, restricted):
    """Upstream's init container makes every Worker pod fail `restricted`; ours passes."""
    (_, job), *_ = _rendered_jobs()
    worker = next(p for p in _pods_of(job, restricted) if "-worker-" in p["metadata"]["name"])
    master = f"{job['metadata']['name']}-master-0"
    upstream = _upstream_init_template()
    if upstream is not None:
        refused = {
            **worker,
            "spec": {**worker["spec"], "initContainers": _init_containers(upstream, master)},
        }
        proc = _create_dry(cluster, refused)
        assert proc.returncode != 0 and PSA_REFUSAL in proc.stderr, proc.stderr
        assert "init-pytorch" in proc.stderr
    ours = _init_containers(OPERATOR_INIT_TEMPLATE.read_text(), master)
    assert [c["name"] for c in ours] == ["init-pytorch"]
    admitted = {**worker, "spec": {**worker["spec"], "initContainers": ours}}
    proc = _create_dry(cluster, admitted)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


def _job(cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("pytorchjob", name, "-n", namespace, missing_ok=True) or {}


# ------------------------------------------------------------------------------------------
# RBAC: the shipped Role, through a real token


def _sa_kubeconfig(cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a short-lived token."""
    token = cluster.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", K8S_NAMESPACE, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [
            {
                "name": "sa",
                "context": {
                    "cluster": "local",
                    "user": SERVICE_ACCOUNT,
                    "namespace": K8S_NAMESPACE,
                },
            }
        ],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(kubeconfig))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def sa_kubeconfig(cluster, tmp_path_factory) -> Path:
    """k8s/ applied for real (minus the example job), and a token kubeconfig for its SA."""
    objects = [o for o in _kustomize(cluster) if o["kind"] != "PyTorchJob"]
    _apply(cluster, *objects)
    return _sa_kubeconfig(cluster, tmp_path_factory.mktemp("sa") / "kubeconfig")


def _sa_kubectl(cluster, kubeconfig: Path, *args: str, input_text: str | None = None):
    return subprocess.run(
        [str(cluster.kubectl_path), "--kubeconfig", str(kubeconfig), *args],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("create", "pytorchjobs.kubeflow.org", True),
        ("get", "pytorchjobs.kubeflow.org", True),
        ("list", "pytorchjobs.kubeflow.org", True),
        ("watch", "pytorchjobs.kubeflow.org", True),
        ("delete", "pytorchjobs.kubeflow.org", True),
        ("list", "pods", True),
        ("watch", "pods", True),
        ("get", "pods/log", True),
        ("list", "events", True),
        ("patch", "pytorchjobs.kubeflow.org", False),
        ("update", "pytorchjobs.kubeflow.org", False),
        ("get", "secrets", False),
        ("list", "secrets", False),
        ("create", "pods", False),
        ("delete", "pods", False),
        ("create", "pods/exec", False),
        ("get", "configmaps", False),
        ("create", "roles.rbac.authorization.k8s.io", False),
        ("create", "rolebindings.rbac.authorization.k8s.io", False),
    ],
)
def test_auth_can_i_as_the_service_account(cluster, sa_kubeconfig, verb, resource, allowed):
    proc = cluster.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        "-n",
        K8S_NAMESPACE,
        f"--as=system:serviceaccount:{K8S_NAMESPACE}:{SERVICE_ACCOUNT}",
        check=False,
    )
    assert proc.stdout.strip() == ("yes" if allowed else "no"), (verb, resource, proc.stdout)


def test_nothing_outside_its_namespace(cluster, sa_kubeconfig):
    for args in (["list", "pytorchjobs.kubeflow.org", "-n", "default"], ["list", "nodes"]):
        proc = cluster.kubectl(
            "auth",
            "can-i",
            *args,
            f"--as=system:serviceaccount:{K8S_NAMESPACE}:{SERVICE_ACCOUNT}",
            check=False,
        )
        assert proc.stdout.strip() == "no", args


def test_the_service_account_is_refused_secrets_and_pods_for_real(cluster, sa_kubeconfig):
    """Real requests with the token, not just the authorizer's opinion."""
    proc = _sa_kubectl(cluster, sa_kubeconfig, "get", "secrets")
    assert proc.returncode != 0 and "Forbidden" in proc.stderr, proc.stderr
    assert 'cannot list resource "secrets"' in proc.stderr
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sneaky", "namespace": K8S_NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    proc = _sa_kubectl(cluster, sa_kubeconfig, "create", "-f", "-", input_text=json.dumps(pod))
    assert proc.returncode != 0 and "Forbidden" in proc.stderr, proc.stderr
    assert 'cannot create resource "pods"' in proc.stderr
    # ...while what it is granted works with the same token.
    ok = _sa_kubectl(cluster, sa_kubeconfig, "get", "pytorchjobs", "-n", K8S_NAMESPACE)
    assert ok.returncode == 0, ok.stderr


def _controller(kubeconfig: Path, *args: str, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "controller", *args, "--kubeconfig", str(kubeconfig)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _refusals(stderr: str) -> int:
    """The 403s `--debug` counted, including the ones a command works around."""
    m = re.search(r"^debug: .* (\d+) refused by RBAC$", stderr, re.MULTILINE)
    assert m, stderr[-2000:]
    return int(m[1])


def test_every_command_works_with_the_shipped_role_and_nothing_is_refused(
    cluster, sa_kubeconfig, tmp_path
):
    """Every command of the CLI, through a token of the shipped ServiceAccount: each exits 0,
    doctor's RBAC check passes, and no request is refused beyond doctor's two optional probes
    (--debug counts 403s, also those a command works around, such as `get pods` in logs -f).
    With a verb missing from the Role some command would fail or count a refusal."""
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "namespace": K8S_NAMESPACE,
                "image": "ghcr.io/ddpjob/trainer:0.1.0",
                "nodes": 1,
                "resources": {"cpu": "250m", "memory": "2Gi"},
                "shm_size": "256Mi",
                "env": {"OMP_NUM_THREADS": "1"},
                "trainer": {
                    "task": "vision",
                    "task_args": {"image_size": 16},
                    "device": "cpu",
                    "max_steps": 5,
                    "batch_size": 8,
                    "log_every": 1,
                    "eval_batches": 1,
                    "resume": "never",
                    "checkpoint": {"dir": str(tmp_path / "ckpt")},
                },
            }
        )
    )
    ns = ["-n", K8S_NAMESPACE, "--debug"]
    ran: dict[str, subprocess.CompletedProcess] = {}
    try:
        doctor = _controller(sa_kubeconfig, "doctor", str(spec), *ns)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "[  ok] RBAC (PyTorchJob): every verb the CLI uses is allowed" in doctor.stdout
        ran["doctor"] = doctor
        # submit --follow: preflight, create, then rank 0's log followed live to the end.
        follow = _controller(sa_kubeconfig, "submit", str(spec), "--follow", *ns)
        assert follow.returncode == 0, follow.stdout + follow.stderr
        assert '"event": "done"' in follow.stdout
        ran["submit --follow"] = follow
        commands = {
            "wait": ["wait", name],
            "status": ["status", name],
            "list": ["list"],
            "logs": ["logs", name],
            "logs -f": ["logs", name, "-f", "--timeout", "60"],
            "events": ["events", name],
            "plot": ["plot", name, "-o", str(tmp_path / "curves.png")],
        }
        for what, args in commands.items():
            ran[what] = _controller(sa_kubeconfig, *args, *ns)
            assert ran[what].returncode == 0, (what, ran[what].stdout + ran[what].stderr)
        assert "Succeeded" in ran["status"].stdout, ran["status"].stdout
        assert '"event": "done"' in ran["logs"].stdout, ran["logs"].stdout[-2000:]
        assert ran["logs -f"].stdout == ran["logs"].stdout
        assert "SuccessfulCreatePod" in ran["events"].stdout, ran["events"].stdout
    finally:
        ran["delete --wait"] = _controller(
            sa_kubeconfig, "delete", name, "--wait", *ns, timeout=180
        )
    assert ran["delete --wait"].returncode == 0, ran["delete --wait"].stderr
    assert _job(cluster, K8S_NAMESPACE, name) == {}
    # doctor and submit's preflight try two cluster-wide reads the Role leaves out on purpose
    # (the operator's pod in any namespace; the nodes, for the GPU fit check) and go on
    # without them. Nothing else is refused.
    refused = {what: _refusals(r.stderr) for what, r in ran.items()}
    assert refused == {**dict.fromkeys(ran, 0), "doctor": 2, "submit --follow": 2}, refused
    assert "[warn] job fits: not checked: cannot list nodes" in ran["doctor"].stdout


def test_a_token_for_the_service_account_is_what_the_tests_use(sa_kubeconfig):
    """Sanity: the kubeconfig carries a bound token of the shipped ServiceAccount."""
    user = yaml.safe_load(sa_kubeconfig.read_text())["users"][0]["user"]
    payload = user["token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{K8S_NAMESPACE}:{SERVICE_ACCOUNT}"
