"""Container images for the local cluster, built on this machine: no registry, no Docker daemon.

    pause_image()    localhost/pause:<tag>      Kubernetes' pause.c, static, FROM scratch, uid 65535
    init_image()     localhost/busybox:<ver>    Debian's busybox-static, FROM scratch: the training
                                                operator's worker init container (sh, seq, nslookup)
    import_into_containerd(ref, address, namespace="k8s.io")

Each ``*_image()`` builds with podman when the image is missing or its inputs changed, and returns
the full reference (never ``:latest``, which would make the kubelet pull). The inputs are hashed
into the label ``io.ddpjob.inputs``, so a second call builds nothing. podman runs with
``localkube/containers.conf`` (runc, no default ulimits: see that file).

``import_into_containerd`` copies a podman image into a containerd and sends only what that
containerd lacks: the layers it already holds (the multi-GB torch layer of the trainer image)
become sparse placeholders in a temporary OCI layout, so skopeo skips them and ``ctr images
import`` gets an archive with the new layers only. Same image ID already there: nothing to do.

    python -m localkube.images pause|init
    python -m localkube.images import REF --address /run/.../containerd.sock [--namespace k8s.io]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import tools
from .procs import LocalkubeError, cache_dir

HERE = Path(__file__).resolve().parent
#: podman/buildah settings this machine needs (runc; no default ulimits).
CONTAINERS_CONF = HERE / "containers.conf"
#: Label holding the hash of everything an image was built from.
INPUTS_LABEL = "io.ddpjob.inputs"

PAUSE_CFLAGS = ("-Os", "-Wall", "-Werror", "-static")
# As build/pause/Dockerfile upstream (BASE=scratch for Linux), COPY for ADD.
PAUSE_CONTAINERFILE = """\
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
"""
# Every applet as a symlink in /bin, so `sh -c '... $(seq N) ... nslookup ...'` finds them, except
# sh and nslookup (see NSLOOKUP). uid 65534 (nobody): the pod's runAsUser wins; without one the
# container is still not root.
INIT_CONTAINERFILE = """\
FROM scratch
COPY rootfs/ /
ENV PATH=/bin
USER 65534:65534
"""
# busybox >= 1.31 sends the query under every `search` domain of resolv.conf and exits 1 when any
# of them is NXDOMAIN (https://bugs.busybox.net/show_bug.cgi?id=14671). In a pod (search
# <ns>.svc.cluster.local svc.cluster.local cluster.local) `nslookup <job>-master-0` then fails
# although the name resolves, and the operator's init container loops until MaxTries: that is why
# upstream's default is alpine:3.10 (busybox 1.30). This /bin/nslookup exits 0 when an answer came
# back. It needs a shell that looks commands up in PATH: busybox's ash runs its own nslookup applet
# first, so /bin/sh is Debian's static mksh.
NSLOOKUP = """\
#!/bin/sh
# busybox nslookup, but exit 0 when the name resolved under some search domain (busybox bug 14671).
out=$(/bin/busybox nslookup "$@")
rc=$?
printf '%s\\n' "$out"
case $rc:$out in
0:* | *"
Name:"*) exit 0 ;;
esac
exit "$rc"
"""


class ImageError(LocalkubeError):
    """An image could not be built, found or imported."""


# --- running podman, skopeo, ctr ----------------------------------------------------------------


def podman_env() -> dict[str, str]:
    """The environment for podman/buildah/skopeo: ours plus ``CONTAINERS_CONF``."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ImageError(f"localkube.images: {tool} is missing (got no `{tool}` on PATH). {hint}")
    return path


def _run(
    argv: Sequence[str],
    *,
    log=None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    hint: str = "",
) -> str:
    """Run ``argv``; return its stdout. With ``log``, stream stdout+stderr there as it comes.

    On failure raise :class:`ImageError` with the command, exit status and the output's tail.
    """
    env = env or podman_env()
    if log is None:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return proc.stdout
        tail = (proc.stderr or proc.stdout)[-3000:]
    else:
        tail_lines: deque[str] = deque(maxlen=40)
        with subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail_lines.append(line)
            log.flush()
        if proc.returncode == 0:
            return "".join(tail_lines)
        tail = "".join(tail_lines)
    raise ImageError(
        f"localkube.images: {Path(argv[0]).name} {' '.join(argv[1:3])} failed "
        f"(got exit {proc.returncode}):\n{tail.rstrip()}\n{hint}".rstrip()
    )


def _digest(*parts: bytes | str) -> str:
    """A short hash of ``parts`` (length-prefixed, so ("ab", "c") != ("a", "bc"))."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """Serialise builds of one image between processes (two test sessions, make and pytest)."""
    path = cache_dir() / "locks" / f"image-{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def inspect(ref: str) -> dict | None:
    """``podman image inspect ref`` as a dict, or None when podman has no such image."""
    proc = subprocess.run(
        ["podman", "image", "inspect", ref],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    (info,) = json.loads(proc.stdout)
    return info


def built_inputs(ref: str) -> str | None:
    """The ``io.ddpjob.inputs`` label of ``ref`` in podman's store (None: no image or label)."""
    info = inspect(ref)
    if info is None:
        return None
    return (info.get("Labels") or {}).get(INPUTS_LABEL)


def _podman_build(
    ref: str,
    context: Path,
    containerfile: Path,
    inputs: str,
    *,
    args: Sequence[str] = (),
    log,
) -> str:
    """``podman build`` ``context`` into ``ref`` labelled with ``inputs``; return the image ID.

    The image that held ``ref`` before is removed when nothing else uses it (no dangling
    7 GB bases after a rebuild); podman refuses, and we carry on, when it is still in use.
    """
    _require("podman", "Install podman and buildah: `make node-deps` (root, apt).")
    old = inspect(ref)
    with tempfile.TemporaryDirectory(prefix="ddpjob-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = [
            "podman",
            "build",
            "--file",
            str(containerfile),
            "--label",
            f"{INPUTS_LABEL}={inputs}",
            "--iidfile",
            str(iidfile),
            "--tag",
            ref,
            *args,
            str(context),
        ]
        _run(argv, log=log)
        image_id = iidfile.read_text().strip().removeprefix("sha256:")
    if old and old["Id"] != image_id:
        subprocess.run(
            ["podman", "rmi", old["Id"]], env=podman_env(), capture_output=True, check=False
        )
    return image_id


# --- pause ---------------------------------------------------------------------------------------


def _kubernetes_module_dir() -> Path:
    """The k8s.io/kubernetes module at the pinned version, from the Go module cache."""
    _require("go", "Install Go >= 1.24 (https://go.dev/dl/); the local cluster needs it too.")
    module = f"k8s.io/kubernetes@{tools.VERSIONS['kubernetes']}"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    out = _run(
        ["go", "mod", "download", "-json", module],
        cwd=tools.GO_DIR,
        env=env,
        hint="Hint: check network access to the Go module proxy.",
    )
    return Path(json.loads(out)["Dir"])


def pause_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the pause image from the pinned Kubernetes' own pause.c.

    Compiled as upstream does (``gcc -Os -Wall -Werror -static``), packed FROM scratch, user
    65535, tagged with the version in build/pause/Makefile. Returns ``localhost/pause:<tag>``.
    """
    src = _kubernetes_module_dir() / "build" / "pause"
    match = re.search(r"^TAG \?= (\S+)$", (src / "Makefile").read_text(), re.M)
    if not match:
        raise ImageError(
            f"localkube.images: no `TAG ?=` line in {src / 'Makefile'} (got none). "
            "Has the pause build moved in this Kubernetes version?"
        )
    tag = match.group(1)
    pause_c = src / "linux" / "pause.c"
    _require("gcc", "Install gcc and the static C library: apt-get install gcc libc6-dev.")
    gcc = _run(["gcc", "--version"]).splitlines()[0]
    cflags = [*PAUSE_CFLAGS, f"-DVERSION=v{tag}-{tools.VERSIONS['kubernetes']}"]
    inputs = _digest(pause_c.read_bytes(), " ".join(cflags), gcc, PAUSE_CONTAINERFILE)
    ref = f"localhost/pause:{tag}"
    if built_inputs(ref) == inputs:
        return ref
    with _lock("pause"):
        if built_inputs(ref) == inputs:
            return ref
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ddpjob-pause-") as tmp:
            ctx = Path(tmp)
            _run(["gcc", *cflags, "-o", str(ctx / "pause"), str(pause_c)])
            (ctx / "Containerfile").write_text(PAUSE_CONTAINERFILE)
            # --timestamp 0: the same binary gives the same image ID on every machine.
            _podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )
        print(f"[images] built {ref} in {time.monotonic() - start:.1f}s", file=log, flush=True)
    return ref


# --- init (busybox) ------------------------------------------------------------------------------


def _is_static_elf(path: Path) -> bool:
    """True for a 64-bit little-endian ELF without a PT_INTERP header (no dynamic loader)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return False
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    pt_interp = 3
    return all(
        int.from_bytes(table[i : i + 4], "little") != pt_interp
        for i in range(0, len(table), phentsize)
    )


def _static_binary(name: str, candidates: Sequence[str], hint: str) -> Path:
    """The first of ``candidates`` (or ``name`` on PATH) that is a static binary."""
    for path in (*candidates, shutil.which(name)):
        if path and Path(path).exists() and _is_static_elf(Path(path).resolve()):
            return Path(path).resolve()
    raise ImageError(
        f"localkube.images: no static {name} (got none among {[*candidates, name]}; a "
        f"dynamically linked one cannot run FROM scratch). {hint}"
    )


def init_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the worker init container image from Debian's busybox-static.

    The training operator's init container runs ``sh -c 'for i in $(seq N); do if nslookup
    MASTER; ...'`` (pkg/controller.v1/pytorch/initcontainer.go): busybox's applets in /bin,
    /bin/sh is static mksh and /bin/nslookup fixes busybox's exit status (see ``NSLOOKUP``).
    Returns ``localhost/busybox:<busybox version>``.
    """
    hint = "Install it: `make node-deps` (apt-get install busybox-static mksh)."
    busybox = _static_binary("busybox", ["/bin/busybox"], hint)
    mksh = _static_binary("mksh-static", ["/bin/mksh-static"], hint)
    proc = subprocess.run([busybox], capture_output=True, text=True, check=False)
    match = re.search(r"BusyBox v(\d+(?:\.\d+)+)", proc.stdout + proc.stderr)
    if not match:
        raise ImageError(
            f"localkube.images: cannot read the busybox version of {busybox} "
            f"(got {(proc.stdout + proc.stderr)[:80]!r}). {hint}"
        )
    applets = _run([str(busybox), "--list"]).split()
    inputs = _digest(
        busybox.read_bytes(), mksh.read_bytes(), " ".join(applets), NSLOOKUP, INIT_CONTAINERFILE
    )
    ref = f"localhost/busybox:{match.group(1)}"
    if built_inputs(ref) == inputs:
        return ref
    with _lock("busybox"):
        if built_inputs(ref) == inputs:
            return ref
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ddpjob-busybox-") as tmp:
            ctx = Path(tmp)
            bindir = ctx / "rootfs" / "bin"
            bindir.mkdir(parents=True)
            shutil.copy2(busybox, bindir / "busybox")
            shutil.copy2(mksh, bindir / "sh")
            (bindir / "nslookup").write_text(NSLOOKUP)
            (bindir / "nslookup").chmod(0o755)
            for applet in applets:
                if not (bindir / applet).exists():
                    (bindir / applet).symlink_to("busybox")
            (ctx / "Containerfile").write_text(INIT_CONTAINERFILE)
            _podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )
        print(f"[images] built {ref} in {time.monotonic() - start:.1f}s", file=log, flush=True)
    return ref


# --- into containerd -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_into_containerd` did."""

    ref: str
    image_id: str
    #: Layers (and their bytes) streamed into containerd; config and manifest not counted.
    layers_sent: int
    bytes_sent: int
    #: Layers containerd already held, left out of the archive.
    layers_reused: int
    bytes_reused: int
    seconds: float

    @property
    def skipped(self) -> bool:
        """True when containerd already had this image ID under ``ref``: nothing was imported."""
        return self.layers_sent == 0 and self.layers_reused == 0


def chain_id(diff_ids: Sequence[str]) -> str:
    """The OCI ChainID of a layer stack: the key of its top snapshot in containerd."""
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


class _Ctr:
    """The few ``ctr`` calls the import needs, against one containerd and namespace."""

    def __init__(self, address: str, namespace: str) -> None:
        self.base = ["ctr", "--address", address, "--namespace", namespace]
        self.address = address

    def run(self, *args: str) -> str:
        return _run(
            [*self.base, *args],
            hint=f"Hint: is containerd serving on {self.address}?",
        )

    def ok(self, *args: str) -> bool:
        proc = subprocess.run([*self.base, *args], capture_output=True, check=False)
        return proc.returncode == 0

    def images(self) -> dict[str, str]:
        """Image name -> target digest."""
        rows = self.run("images", "ls").splitlines()[1:]
        return {f[0]: f[2] for f in (row.split() for row in rows) if len(f) >= 3}

    def manifests(self, digest: str) -> list[dict]:
        """The image manifests under ``digest`` (itself, or an index's children held here)."""
        try:
            doc = json.loads(self.run("content", "get", digest))
        except (ImageError, ValueError):
            return []
        if "manifests" in doc:
            return [m for child in doc["manifests"] for m in self.manifests(child["digest"])]
        return [doc]

    def blobs(self) -> set[str]:
        return set(self.run("content", "ls", "--quiet").split())


def import_into_containerd(
    ref: str, address: str, namespace: str = "k8s.io", *, log=sys.stderr
) -> ImportResult:
    """Make the containerd at ``address`` hold podman's ``ref`` under the same name and ID.

    Sends only the layers containerd lacks (their sizes come from the manifests it already
    holds; presence from its content store), and nothing when ``ref`` there already is this
    image ID and is unpacked. Unpacks into the default snapshotter, so CRI can run it.
    """
    start = time.monotonic()
    for tool in ("ctr", "skopeo"):
        _require(tool, "Install it: `make node-deps` (root, apt).")
    info = inspect(ref)
    if info is None:
        raise ImageError(
            f"localkube.images: no image {ref} in podman's store (got none). "
            "Build it first (pause_image(), init_image(), ...)."
        )
    image_id = "sha256:" + info["Id"]
    diff_ids: list[str] = info["RootFS"]["Layers"]
    ctr = _Ctr(address, namespace)
    images = ctr.images()
    snapshot = chain_id(diff_ids)
    if ref in images:
        configs = {m["config"]["digest"] for m in ctr.manifests(images[ref])}
        if configs == {image_id} and ctr.ok("snapshots", "info", snapshot):
            return ImportResult(ref, image_id, 0, 0, 0, 0, time.monotonic() - start)
    sizes = {
        layer["digest"]: layer["size"]
        for target in images.values()
        for manifest in ctr.manifests(target)
        for layer in manifest.get("layers", [])
    }
    held = ctr.blobs()
    reuse = {d: sizes[d] for d in diff_ids if d in held and d in sizes}
    with tempfile.TemporaryDirectory(prefix="ddpjob-import-") as tmp:
        layout = Path(tmp)
        blobdir = layout / "blobs" / "sha256"
        blobdir.mkdir(parents=True)
        for digest, size in reuse.items():
            # A sparse file of the right size: skopeo's OCI destination takes an existing blob
            # of that digest as already copied (and reads its size for the manifest).
            with open(blobdir / digest.removeprefix("sha256:"), "wb") as handle:
                handle.truncate(size)
        _run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-oci-accept-uncompressed-layers",
                f"containers-storage:{ref}@{info['Id']}",
                f"oci:{layout}:{ref}",
            ]
        )
        manifest_desc, manifest = _read_layout(layout, image_id, diff_ids)
        send = ["oci-layout", "index.json"] + [
            f"blobs/sha256/{p.name}" for p in blobdir.iterdir() if f"sha256:{p.name}" not in reuse
        ]
        _ctr_import(ctr, layout, send)
    now = ctr.images().get(ref)
    if now != manifest_desc["digest"] or not ctr.ok("snapshots", "info", snapshot):
        raise ImageError(
            f"localkube.images: {ref} is not in containerd as imported (got target {now}, "
            f"expected {manifest_desc['digest']} with snapshot {snapshot}). "
            "Hint: did something delete it meanwhile? Import again."
        )
    sent = [layer for layer in manifest["layers"] if layer["digest"] not in reuse]
    result = ImportResult(
        ref,
        image_id,
        layers_sent=len(sent),
        bytes_sent=sum(layer["size"] for layer in sent),
        layers_reused=len(reuse),
        bytes_reused=sum(reuse.values()),
        seconds=time.monotonic() - start,
    )
    print(
        f"[images] imported {ref} into {address}: {result.layers_sent} layers "
        f"({result.bytes_sent / 2**20:.1f} MiB) sent, {result.layers_reused} "
        f"({result.bytes_reused / 2**20:.1f} MiB) reused, {result.seconds:.1f}s",
        file=log,
        flush=True,
    )
    return result


def _read_layout(layout: Path, image_id: str, diff_ids: list[str]) -> tuple[dict, dict]:
    """Check skopeo's OCI layout is podman's image; name it in index.json; return the manifest.

    The name goes into both annotations containerd reads, so ``ctr images import`` creates the
    image under exactly ``ref`` (not ``import-<date>``).
    """
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    (desc,) = index["manifests"]
    manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_text())
    layers = [layer["digest"] for layer in manifest["layers"]]
    if manifest["config"]["digest"] != image_id or layers != diff_ids:
        raise ImageError(
            f"localkube.images: the OCI copy differs from podman's image (got config "
            f"{manifest['config']['digest']}, layers {layers}; expected {image_id}, {diff_ids})."
        )
    ref = desc["annotations"]["org.opencontainers.image.ref.name"]
    desc["annotations"]["io.containerd.image.name"] = ref
    index_path.write_text(json.dumps(index))
    return desc, manifest


def _ctr_import(ctr: _Ctr, layout: Path, members: list[str]) -> None:
    """Stream ``members`` of the OCI layout as a tar into ``ctr images import -``."""
    tar = subprocess.Popen(
        ["tar", "--create", "--file", "-", "--directory", str(layout), "--", *members],
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    proc = subprocess.run(
        [*ctr.base, "images", "import", "-"],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    tar.stdout.close()
    tar_rc = tar.wait()
    if proc.returncode != 0 or tar_rc != 0:
        raise ImageError(
            f"localkube.images: ctr images import failed (got exit {proc.returncode}, tar exit "
            f"{tar_rc}): {proc.stderr.strip()[-2000:]}. Hint: is containerd serving on "
            f"{ctr.address}, with room on its disk?"
        )


# --- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m localkube.images pause|init|import``; prints the image reference."""
    parser = argparse.ArgumentParser(prog="python -m localkube.images")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pause", help="build the pause image (if stale); print its reference")
    sub.add_parser("init", help="build the init container image (if stale); print its reference")
    imp = sub.add_parser("import", help="import a podman image into a containerd")
    imp.add_argument("ref")
    imp.add_argument("--address", required=True, help="containerd's socket")
    imp.add_argument("--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    try:
        if args.command == "pause":
            print(pause_image())
        elif args.command == "init":
            print(init_image())
        else:
            result = import_into_containerd(args.ref, args.address, args.namespace)
            print(json.dumps(result.__dict__ | {"skipped": result.skipped}))
    except ImageError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
