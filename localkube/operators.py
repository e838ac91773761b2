"""The operators of the local cluster that need k8s.io v0.36, built by one Go module.

``localkube/go-operators`` (go 1.26, k8s.io v0.36, controller-runtime v0.24) builds four
commands in one ``go build``, so the packages they share (client-go, controller-runtime, the
Kubeflow APIs Kueue links) compile once:

- ``training-operator``: the Kubeflow training operator v1 (PyTorchJob), our reduced main
  (``go-operators/cmd/training-operator``; see its comment for what is left out);
- ``trainer-controller-manager``, ``jobset-controller-manager``: Kubeflow Trainer v2 and JobSet,
  upstream's commands unmodified (``trainer_v2.py`` runs them);
- ``kueue``: Kueue's ``cmd/kueue``, unmodified (``kueue.py`` runs it).

Kueue v0.17.0 asks for k8s.io v0.35.3, controller-runtime v0.23.3, Trainer v2.2.0, the training
operator v1.9.3 and JobSet v0.11.1; minimal version selection lifts it to what the others need
(v0.36, v0.24.1, v2.3.0, v1.9.4, v0.12.0) and it compiles against them unchanged.

The manifests each component installs (CRDs, RBAC, webhook configurations, the torch runtime)
come out of the same modules at build time (:data:`MANIFESTS`), so running the cluster needs no
Go and no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from controller import kubeflow

from . import kueue, trainer_v2

GO_DIR = Path(__file__).resolve().parent / "go-operators"

TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"

#: Modules go.mod must require at exactly these versions (``build`` checks; a test too).
PINS = {
    TRAINING_OPERATOR_MODULE: kubeflow.OPERATOR_VERSION,
    trainer_v2.TRAINER_MODULE: kubeflow.TRAINER_VERSION,
    trainer_v2.JOBSET_MODULE: kubeflow.JOBSET_VERSION,
    kueue.MODULE: kueue.VERSION,
}
VERSIONS = {
    "training-operator": kubeflow.OPERATOR_VERSION,
    **trainer_v2.VERSIONS,
    "kueue": kueue.VERSION,
}

#: Binaries in the tools ``bin/`` folder -> the main package each is built from.
BINARIES = {
    "training-operator": "ddpjob.local/operatortools/cmd/training-operator",
    **trainer_v2.BINARIES,
    **kueue.BINARIES,
}

#: Manifest files in the tools ``manifests/`` folder -> (module, path in the module zip, how):
#: "copy" copies one file, "kustomize" renders a kustomization folder with the built kubectl,
#: "rbac+webhooks" keeps only the ClusterRoles and webhook configurations of a kustomization,
#: "kueue" splits Kueue's release kustomization (``kueue.split_release``).
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
    **trainer_v2.MANIFESTS,
    **kueue.MANIFESTS,
}
_KEPT_KINDS = ("ClusterRole", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def source_digest() -> bytes:
    """A digest of the go-operators module (go.mod, go.sum, *.go) and the pins, for tools_dir."""
    digest = hashlib.sha256()
    for path in [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.rglob("*.go"))]:
        digest.update(str(path.relative_to(GO_DIR)).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(VERSIONS, sort_keys=True).encode())
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
        raise RuntimeError(
            f"localkube.operators: {GO_DIR / 'go.mod'} does not pin the versions in "
            f"controller/kubeflow.py and localkube/kueue.py (got {got}, want {PINS}). Edit one "
            f"to match the other, then run `go mod tidy` in {GO_DIR}."
        )


def _module(module: str) -> dict:
    """``go mod download -json`` of a module go-operators requires: its Dir and Origin."""
    from .gocmd import module_download

    return module_download(module, GO_DIR)


def _ldflags() -> str:
    """Strip symbols; stamp JobSet's and Kueue's version packages as their own builds do (the
    commit from the proxy's .info file)."""
    flags = ["-s -w"]
    for module, version in ((trainer_v2.JOBSET_MODULE, kubeflow.JOBSET_VERSION),):
        flags += _stamp(module, f"{module}/pkg/version", "GitVersion", "GitCommit", version)
    flags += _stamp(kueue.MODULE, kueue.VERSION_PKG, "GitVersion", "GitCommit", kueue.VERSION)
    return " ".join(flags)


def _stamp(module: str, pkg: str, version_var: str, commit_var: str, version: str) -> list[str]:
    info = json.loads(Path(_module(module)["Info"]).read_text())
    commit = (info.get("Origin") or {}).get("Hash")
    out = [f"-X {pkg}.{version_var}={version}"]
    return out + ([f"-X {pkg}.{commit_var}={commit}"] if commit else [])


def build(root: Path, log) -> dict[str, float]:
    """Build the missing binaries (one ``go build`` for all) and write the missing manifests
    into the tools folder ``root``; return build seconds. Needs ``root/bin/kubectl`` built."""
    from .gocmd import _run_go

    times: dict[str, float] = {}
    bindir, mandir = root / "bin", root / "manifests"
    missing = {n: pkg for n, pkg in BINARIES.items() if not (bindir / n).exists()}
    if missing:
        _check_pins()
        tmp = bindir / f".operators.tmp{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        args = ["build", "-trimpath", "-ldflags", _ldflags(), "-o", f"{tmp}/", *missing.values()]
        times["operators"] = _run_go(args, log, cwd=GO_DIR)
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
                text = kueue.split_release(_load_all(text), name)
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
        raise RuntimeError(
            f"localkube.operators: kubectl kustomize {src} failed (got exit {out.returncode}): "
            f"{out.stderr[-2000:]}"
        )
    return out.stdout
