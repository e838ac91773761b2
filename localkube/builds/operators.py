"""The operators of the local cluster that need k8s.io v0.36, built by one Go module.

``builds/go-operators`` (go 1.26, k8s.io v0.36, controller-runtime v0.24) builds four commands in
one ``go build``, so the packages they share (client-go, controller-runtime, the Kubeflow APIs
Kueue links) compile once:

- ``training-operator``: the Kubeflow training operator v1 (PyTorchJob), our reduced main
  (``go-operators/cmd/training-operator``; see its comment for what is left out);
- ``trainer-controller-manager``, ``jobset-controller-manager``: Kubeflow Trainer v2 and JobSet,
  upstream's commands unmodified;
- ``kueue``: Kueue's ``cmd/kueue``, unmodified.

Kueue's go.mod asks for older k8s.io, controller-runtime, Trainer, training-operator and JobSet
versions than the others; minimal version selection lifts it to what the others need, and it
compiles against them unchanged.

The manifests each component installs (CRDs, RBAC, webhook configurations, the torch runtime)
come out of the same modules at build time (:data:`MANIFESTS`), so running the cluster needs no
Go and no network. The add-ons (``addons/``) read them from the tools folder; this module
imports none of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from .. import versions
from ..procs import LocalkubeError
from .gocmd import module_download, run_go

GO_DIR = Path(__file__).resolve().parent / "go-operators"

TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"
KUEUE_MODULE = "sigs.k8s.io/kueue"

#: Modules go.mod must require at exactly these versions (``build`` checks; a test too).
PINS = {
    TRAINING_OPERATOR_MODULE: versions.TRAINING_OPERATOR,
    TRAINER_MODULE: versions.TRAINER,
    JOBSET_MODULE: versions.JOBSET,
    KUEUE_MODULE: versions.KUEUE,
}

#: Binaries in the tools ``bin/`` folder -> the main package each is built from.
BINARIES = {
    "training-operator": "ddpjob.local/operatortools/cmd/training-operator",
    "trainer-controller-manager": f"{TRAINER_MODULE}/cmd/trainer-controller-manager",
    "jobset-controller-manager": JOBSET_MODULE,
    "kueue": f"{KUEUE_MODULE}/cmd/kueue",
}

#: Manifest files in the tools ``manifests/`` folder -> (module, path in the module zip, how):
#: "copy" copies one file, "kustomize" renders a kustomization folder with the built kubectl,
#: "rbac+webhooks" keeps only the ClusterRoles and webhook configurations of a kustomization,
#: "kueue" splits Kueue's release kustomization (:func:`split_kueue_release`).
MANIFESTS = {
    "pytorchjobs-crd.yaml": (
        TRAINING_OPERATOR_MODULE,
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
        "copy",
    ),
    "training-operator-role.yaml": (
        TRAINING_OPERATOR_MODULE,
        "manifests/base/rbac/role.yaml",
        "copy",
    ),
    "training-operator-webhooks.yaml": (
        TRAINING_OPERATOR_MODULE,
        "manifests/base/webhook/manifests.yaml",
        "copy",
    ),
    "trainer-crds.yaml": (TRAINER_MODULE, "manifests/base/crds", "kustomize"),
    "trainer-rbac.yaml": (TRAINER_MODULE, "manifests/base/rbac", "kustomize"),
    "trainer-webhooks.yaml": (TRAINER_MODULE, "manifests/base/webhook", "kustomize"),
    "trainer-torch-distributed.yaml": (
        TRAINER_MODULE,
        "manifests/base/runtimes/torch_distributed.yaml",
        "copy",
    ),
    # Upstream's install (overlays/manager): its namespace and the ConfigMap the SDK reads.
    "trainer-overlay-manager.yaml": (
        TRAINER_MODULE,
        "manifests/overlays/manager/kustomization.yaml",
        "copy",
    ),
    "jobset-crd.yaml": (
        JOBSET_MODULE,
        "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        "copy",
    ),
    # From JobSet's release manifests (what Trainer's own install pulls in, third-party/jobset):
    # their names carry the release's "jobset-" prefix.
    "jobset-rbac-webhooks.yaml": (JOBSET_MODULE, "config/default", "rbac+webhooks"),
    # Kueue's release kustomization (config/default), split: the CRDs, and what else is installed.
    "kueue-crds.json": (KUEUE_MODULE, "config/default", "kueue"),
    "kueue-install.yaml": (KUEUE_MODULE, "config/default", "kueue"),
}
_KEPT_KINDS = ("ClusterRole", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
#: What of Kueue's release the cluster installs besides the CRDs (the rest: addons/kueue.py's
#: DIFFERENCES).
_KUEUE_INSTALLED_KINDS = (
    "Namespace",
    "ClusterRole",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)
#: The one namespaced Role of Kueue's release it needs: its cache watches Secrets in its
#: namespace (MultiKueue's kubeconfigs), whatever the configuration.
KUEUE_SECRETS_ROLE = "kueue-manager-secrets-role"


def source_digest() -> bytes:
    """A digest of the go-operators module (go.mod, go.sum, *.go) and the pins, for tools_dir."""
    digest = hashlib.sha256()
    for path in [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.rglob("*.go"))]:
        digest.update(str(path.relative_to(GO_DIR)).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(versions.OPERATORS, sort_keys=True).encode())
    digest.update(json.dumps(sorted(MANIFESTS.items())).encode())
    return digest.digest()


def is_built(root: Path) -> bool:
    """True when every binary and every manifest file is in the tools folder ``root``."""
    return all((root / "bin" / n).exists() for n in BINARIES) and all(
        (root / "manifests" / n).exists() for n in MANIFESTS
    )


def required_versions(go_mod: str) -> dict[str, str]:
    """The versions go.mod requires of the pinned modules (``require`` lines only)."""
    found = {}
    for line in go_mod.splitlines():
        parts = line.strip().removeprefix("require").split()
        if len(parts) >= 2 and parts[0] in PINS:
            found[parts[0]] = parts[1]
    return found


def _check_pins() -> None:
    got = required_versions((GO_DIR / "go.mod").read_text())
    if got != PINS:
        raise LocalkubeError(
            f"localkube: {GO_DIR / 'go.mod'} does not pin the versions in "
            f"localkube/versions.py (got {got}, want {PINS}). Edit one "
            f"to match the other, then run `go mod tidy` in {GO_DIR}."
        )


def _module(module: str) -> dict:
    """``go mod download -json`` of a module go-operators requires: its Dir and Origin."""
    return module_download(module, GO_DIR)


def _ldflags() -> str:
    """Strip symbols; stamp JobSet's and Kueue's version packages as their own builds do (the
    commit from the proxy's .info file)."""
    flags = ["-s -w"]
    for module, version in ((JOBSET_MODULE, versions.JOBSET), (KUEUE_MODULE, versions.KUEUE)):
        flags += _stamp(module, f"{module}/pkg/version", "GitVersion", "GitCommit", version)
    return " ".join(flags)


def _stamp(module: str, pkg: str, version_var: str, commit_var: str, version: str) -> list[str]:
    info = json.loads(Path(_module(module)["Info"]).read_text())
    commit = (info.get("Origin") or {}).get("Hash")
    out = [f"-X {pkg}.{version_var}={version}"]
    return out + ([f"-X {pkg}.{commit_var}={commit}"] if commit else [])


def build(root: Path, log) -> dict[str, float]:
    """Build the missing binaries (one ``go build`` for all) and write the missing manifests
    into the tools folder ``root``; return build seconds. Needs ``root/bin/kubectl`` built."""
    times: dict[str, float] = {}
    bindir, mandir = root / "bin", root / "manifests"
    missing = {n: pkg for n, pkg in BINARIES.items() if not (bindir / n).exists()}
    if missing:
        _check_pins()
        tmp = bindir / f".operators.tmp{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        args = ["build", "-trimpath", "-ldflags", _ldflags(), "-o", f"{tmp}/", *missing.values()]
        times["operators"] = run_go(args, log, cwd=GO_DIR)
        for name, pkg in missing.items():
            (tmp / pkg.rsplit("/", 1)[-1]).rename(bindir / name)
        shutil.rmtree(tmp)
    render_manifests(mandir, bindir / "kubectl")
    return times


def render_manifests(dest: Path, kubectl: Path) -> None:
    """Write the files of :data:`MANIFESTS` missing in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, str] = {}
    for name, (module, rel, how) in MANIFESTS.items():
        if (dest / name).exists():
            continue
        if module not in dirs:
            dirs[module] = _module(module)["Dir"]
        src = Path(dirs[module]) / rel
        tmp = dest / f".{name}.tmp{os.getpid()}"
        if how == "copy":
            shutil.copyfile(src, tmp)
        else:
            text = _kustomize(kubectl, src)
            if how == "rbac+webhooks":
                text = yaml.safe_dump_all([d for d in _load_all(text) if d["kind"] in _KEPT_KINDS])
            elif how == "kueue":
                text = split_kueue_release(_load_all(text), name)
            tmp.write_text(text)
        tmp.rename(dest / name)


def _load_all(text: str) -> list[dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(text, Loader=loader) if d]


def _kustomize(kubectl: Path, src: Path) -> str:
    out = subprocess.run(
        [str(kubectl), "kustomize", str(src)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise LocalkubeError(
            f"localkube: kubectl kustomize {src} failed (got exit {out.returncode}): "
            f"{out.stderr[-2000:]}"
        )
    return out.stdout


def split_kueue_release(docs: list[dict], name: str) -> str:
    """One of Kueue's files in :data:`MANIFESTS` from its release's documents: the CRDs as JSON
    (the workloads CRD alone is 1.6 MB of YAML, which PyYAML reads in seconds), or the namespace,
    ClusterRoles, webhook configurations and the secrets Role as YAML."""
    if name == "kueue-crds.json":
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        return json.dumps(crds, separators=(",", ":"))
    return yaml.safe_dump_all(
        [
            d
            for d in docs
            if d["kind"] in _KUEUE_INSTALLED_KINDS
            or (d["kind"] == "Role" and d["metadata"]["name"] == KUEUE_SECRETS_ROLE)
        ]
    )
