"""Build the Go components of the local control plane, pinned and cached outside the repo.

The Kubernetes components come from one wrapper module (``builds/go``) so that
kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok, kubectl and the kubelet
share one dependency graph and one link (a busybox-style multi-call binary ``kube``). helm is
built from the same module graph, so the packages it shares with Kubernetes come from the Go
build cache. CoreDNS is a small module of its own (``go/coredns``): its kubernetes plugin needs
the client-go it was released with.

The operators need k8s.io v0.36: a second module (``builds/go-operators``, see
``operators.py``) builds the training operator v1, Kubeflow Trainer v2, JobSet and Kueue into
the same folder, with the manifests each installs. The S3 server (the Versity S3 Gateway) and
Prometheus are modules of their own (``builds/go-s3``, ``builds/go-prometheus``: ``gocommand.py``,
``s3server.py``, ``prometheus.py``), built beside the others at a lower priority, one after the
other. The versions: ``localkube/versions.py``.

The tools folder is versioned by the pinned versions plus a hash of the modules' sources, so a
second ``build()`` builds nothing and a change to any builds into a fresh folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..versions import VERSIONS
from . import operators, prometheus, s3server
from .gocmd import GO_DIR, run_go

#: Components linked into the multi-call binary ``kube``; each gets a symlink in ``bin/``.
KUBE_COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
    "kubelet",
    "cri-reset",
)

#: Binaries of their own: name -> (module folder in go/, main package).
OWN_BINARIES = {"helm": (".", "helm.sh/helm/v3/cmd/helm"), "coredns": ("coredns", ".")}


def _source_hash() -> str:
    """Return a short hash of the wrapper module's sources (go.mod, go.sum, *.go)."""
    digest = hashlib.sha256()
    modules = [GO_DIR, GO_DIR / "coredns"]
    files = [m / name for m in modules for name in ("go.mod", "go.sum")]
    files += sorted(GO_DIR.rglob("*.go"))
    for path in files:
        digest.update(str(path.relative_to(GO_DIR)).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(VERSIONS, sort_keys=True).encode())
    digest.update(operators.source_digest())
    digest.update(s3server.source_digest())
    digest.update(prometheus.COMMAND.source_digest())
    return digest.hexdigest()[:10]


def tools_dir() -> Path:
    """Return the versioned tools folder (``$DDPJOB_TOOLS_DIR`` or the user's cache dir)."""
    root = os.environ.get("DDPJOB_TOOLS_DIR")
    if root:
        base = Path(root)
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        base = cache / "ddpjob" / "tools"
    return base / f"k8s-{VERSIONS['kubernetes']}-{_source_hash()}"


def bin_path(name: str) -> Path:
    """Return the path of a built tool (``kube-apiserver``, ``helm``, ``kubectl``, ...)."""
    return tools_dir() / "bin" / name


def is_built() -> bool:
    """Return True when every binary and copied module file is present."""
    root = tools_dir()
    names = [*KUBE_COMPONENTS, "kube", *OWN_BINARIES]
    if not all((root / "bin" / n).exists() for n in names):
        return False
    own = s3server.is_built(root) and prometheus.COMMAND.is_built(root)
    return operators.is_built(root) and own


def _ldflags() -> str:
    """Return -ldflags: strip symbols and stamp the Kubernetes version into component-base."""
    version = VERSIONS["kubernetes"]
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    helm_pkg = "helm.sh/helm/v3/internal/version"
    return " ".join(
        [
            "-s -w",
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {helm_pkg}.version={VERSIONS['helm']}",
        ]
    )


def build(log=sys.stderr) -> dict[str, float]:
    """Build whatever is missing into :func:`tools_dir`; return build seconds per artefact.

    A second call with everything present builds nothing and returns an empty dict. Concurrent
    callers (two test sessions on a cold machine) serialise on a lock; the second finds the
    tools built.
    """
    if is_built():
        return {}
    root = tools_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _build_locked(root, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_locked(root: Path, log) -> dict[str, float]:
    if is_built():
        return {}
    # The S3 server's and Prometheus' builds share no module with the others: they run beside
    # them, niced, one after the other.
    with ThreadPoolExecutor(max_workers=1) as pool:
        own = [pool.submit(s3server.build, root, log)]
        own.append(pool.submit(prometheus.COMMAND.build, root, log))
        times = _build_kubernetes_and_operators(root, log)
        for done in own:
            times.update(done.result())
    record = root / "build-times.json"
    old = json.loads(record.read_text()) if record.exists() else {}
    old.update({k: round(v, 1) for k, v in times.items()})
    record.write_text(json.dumps({"versions": VERSIONS, **old}, indent=2) + "\n")
    print(f"[cluster] tools ready in {root}", file=log, flush=True)
    return times


def _build_kubernetes_and_operators(root: Path, log) -> dict[str, float]:
    times: dict[str, float] = {}
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    ldflags = _ldflags()
    common = ["build", "-trimpath", "-ldflags", ldflags]
    kube = bindir / "kube"
    if not kube.exists():
        tmp = bindir / f".kube.tmp{os.getpid()}"
        times["kube"] = run_go([*common, "-o", str(tmp), "./cmd/kube"], log)
        tmp.rename(kube)
    for name in KUBE_COMPONENTS:
        link = bindir / name
        if not link.exists():
            link.symlink_to("kube")
    for name, (module, package) in OWN_BINARIES.items():
        dest = bindir / name
        if not dest.exists():
            tmp = bindir / f".{name}.tmp{os.getpid()}"
            times[name] = run_go([*common, "-o", str(tmp), package], log, GO_DIR / module)
            tmp.rename(dest)
    times.update(operators.build(root, log))  # after kubectl: it renders their manifests
    return times
