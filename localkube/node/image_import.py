"""A podman image into a containerd, sending only what that containerd lacks.

The layers it already holds (the multi-GB torch layer of the trainer image) become sparse
placeholders in a temporary OCI layout, so skopeo skips them and ``ctr images import`` gets an
archive with the new layers only. Same image ID already there: nothing to do. Nothing there yet:
skopeo's docker-archive streams straight into ``ctr images import``. docs/image.md has the
figures.

:func:`scratch_containerd` is a throwaway containerd (no CRI) for tests, benchmarks and the
node's preload.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.podman import ImageError, inspect, podman_env, require, run


def serves(address: str) -> bool:
    """True when a containerd answers on ``address``."""
    proc = subprocess.run(["ctr", "--address", address, "version"], capture_output=True)
    return proc.returncode == 0


def tag(address: str, ref: str, name: str, namespace: str = "k8s.io") -> None:
    """Give the containerd's copy of ``ref`` a second name (one image, no copy).

    Each xdist worker of make test's cluster phase names the trainer image so, at once:
    ``ctr images tag --force`` deletes the name and creates it again, and a caller whose create
    comes after another's fails with "already exists". The name then is what was asked, or is
    tagged again."""
    ctr = _Ctr(address, namespace)
    if ctr.ok("images", "tag", "--force", ref, name):
        return
    targets = ctr.images()
    if ref in targets and targets.get(name) == targets[ref]:
        return  # another caller named it so between our delete and create
    ctr.run("images", "tag", "--force", ref, name)


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
        return run(
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


def remove_other_images(
    address: str, prefix: str, keep: Sequence[str], namespace: str = "k8s.io"
) -> list[str]:
    """Remove from the containerd at ``address`` the images named ``prefix...`` other than
    ``keep``, and wait for its garbage collection, which deletes the layers and snapshots that no
    image left holds; the names removed."""
    ctr = _Ctr(address, namespace)
    gone = sorted(n for n in ctr.images() if n.startswith(prefix) and n not in keep)
    if gone:
        ctr.run("images", "rm", "--sync", *gone)
    return gone


def import_into_containerd(
    ref: str, address: str, namespace: str = "k8s.io", *, log=sys.stderr
) -> ImportResult:
    """Make the containerd at ``address`` hold podman's ``ref`` under the same name and ID.

    - ``ref`` there already is this image ID, unpacked: nothing to do.
    - containerd holds some of its layers (the sizes come from the manifests it holds, the
      presence from its content store): only the others are sent.
    - none: skopeo's docker-archive is streamed straight in, with no copy on disk.

    Unpacks into the default snapshotter, so CRI can run it.
    """
    start = time.monotonic()
    for tool in ("ctr", "skopeo"):
        require(tool, "Install it: `make node-deps` (root, apt).")
    info = inspect(ref)
    if info is None:
        raise ImageError(
            f"localkube images: no image {ref} in podman's store (got none). "
            "Build it first (pause_image(), init_image(), ...)."
        )
    image_id = "sha256:" + info["Id"]
    diff_ids: list[str] = info["RootFS"]["Layers"]
    ctr = _Ctr(address, namespace)
    targets = ctr.images()
    snapshot = chain_id(diff_ids)
    if ref in targets:
        configs = {m["config"]["digest"] for m in ctr.manifests(targets[ref])}
        if configs == {image_id} and ctr.ok("snapshots", "info", snapshot):
            return ImportResult(ref, image_id, 0, 0, 0, 0, time.monotonic() - start)
    known = {
        layer["digest"]: layer["size"]
        for target in targets.values()
        for manifest in ctr.manifests(target)
        for layer in manifest.get("layers", [])
    }
    held = ctr.blobs()
    reuse = {d: known[d] for d in diff_ids if d in held and d in known}
    # Import under a name of its own, then move ``ref``: replacing ``ref`` first would leave
    # the reused layers' snapshots referenced by nothing while the new image unpacks on top of
    # them, and containerd's GC removes them under it ("parent snapshot ... does not exist").
    staging = f"{ref}-importing-{os.getpid()}"
    try:
        if reuse:
            _import_missing_layers(staging, info["Id"], reuse, ctr)
        else:
            _import_whole(staging, info["Id"], ctr)
        ctr.run("images", "tag", "--force", staging, ref)
    finally:
        ctr.ok("images", "rm", staging)
    manifests = ctr.manifests(ctr.images().get(ref, ""))
    if {m["config"]["digest"] for m in manifests} != {image_id} or not ctr.ok(
        "snapshots", "info", snapshot
    ):
        raise ImageError(
            f"localkube images: {ref} is not in containerd as imported (got "
            f"{[m['config']['digest'] for m in manifests]}, expected config {image_id} with "
            f"snapshot {snapshot}). Hint: did something delete it meanwhile? Import again."
        )
    sent = [(d, layer["size"]) for d, layer in zip(diff_ids, manifests[0]["layers"], strict=True)]
    result = ImportResult(
        ref,
        image_id,
        layers_sent=len(diff_ids) - len(reuse),
        bytes_sent=sum(size for d, size in sent if d not in reuse),
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


def _import_whole(name: str, image_id: str, ctr: _Ctr) -> None:
    """Nothing to reuse: stream skopeo's docker-archive straight into ``ctr images import``.

    No temporary copy of the layers on disk. skopeo keeps the config bytes (the image ID) and
    the uncompressed layers (digest = diff ID), so a later import finds them reusable.
    """
    _pipe_into_ctr(
        ["skopeo", "copy", "--quiet", f"containers-storage:{image_id}",
         f"docker-archive:/dev/stdout:{name}"],
        ctr,
        env=podman_env(),
    )  # fmt: skip


def _import_missing_layers(name: str, image_id: str, reuse: dict[str, int], ctr: _Ctr) -> None:
    """skopeo into a temporary OCI layout where the reused layers are sparse placeholders (its
    OCI destination takes an existing blob of that digest as copied, and reads its size for the
    manifest); ``ctr images import`` of that layout without them."""
    with tempfile.TemporaryDirectory(prefix="ddpjob-import-") as tmp:
        layout = Path(tmp)
        blobdir = layout / "blobs" / "sha256"
        blobdir.mkdir(parents=True)
        for digest, size in reuse.items():
            with open(blobdir / digest.removeprefix("sha256:"), "wb") as handle:
                handle.truncate(size)
        run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-oci-accept-uncompressed-layers",
                f"containers-storage:{image_id}",
                f"oci:{layout}:{name}",
            ]
        )
        _name_and_check_layout(layout, "sha256:" + image_id)
        send = ["oci-layout", "index.json"] + [
            f"blobs/sha256/{p.name}" for p in blobdir.iterdir() if f"sha256:{p.name}" not in reuse
        ]
        _pipe_into_ctr(
            ["tar", "--create", "--file", "-", "--directory", str(layout), "--", *send], ctr
        )


def _name_and_check_layout(layout: Path, image_id: str) -> None:
    """Check skopeo's OCI layout holds podman's image (config = image ID); name it for containerd.

    The reference goes into both annotations ``ctr images import`` reads, so the image is
    created under exactly that name (not ``import-<date>``).
    """
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    (desc,) = index["manifests"]
    manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_text())
    if manifest["config"]["digest"] != image_id:
        raise ImageError(
            f"localkube images: the OCI copy is not podman's image (got config "
            f"{manifest['config']['digest']}, expected {image_id}). Hint: was it rebuilt meanwhile?"
        )
    ref = desc["annotations"]["org.opencontainers.image.ref.name"]
    desc["annotations"]["io.containerd.image.name"] = ref
    index_path.write_text(json.dumps(index))


def _pipe_into_ctr(producer: list[str], ctr: _Ctr, env: dict[str, str] | None = None) -> None:
    """Run ``producer`` (an image archive on stdout) into ``ctr images import -``."""
    source = subprocess.Popen(
        producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or os.environ
    )
    assert source.stdout is not None and source.stderr is not None
    proc = subprocess.run(
        [*ctr.base, "images", "import", "-"],
        stdin=source.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    source.stdout.close()
    source_err = source.stderr.read().decode(errors="replace")
    source_rc = source.wait()
    if proc.returncode != 0 or source_rc != 0:
        raise ImageError(
            f"localkube images: {Path(producer[0]).name} | ctr images import failed (got exit "
            f"{source_rc} | {proc.returncode}): {(source_err + proc.stderr).strip()[-2000:]}. "
            f"Hint: is containerd serving on {ctr.address}, with room on its disk?"
        )


@contextlib.contextmanager
def scratch_containerd(
    workdir: Path, timeout_s: float = 30, root: Path | None = None
) -> Iterator[str]:
    """A throwaway containerd with its root, state and socket under ``workdir`` (no CRI), for
    tests and benchmarks; yields its address, then stops it and removes ``workdir``'s contents.

    Never the real node's (its root is /var/lib/ddpjob/containerd), except for
    ``images.preload_images``, which gives ``root``: that one is used and kept. Use a namespace
    of your own with ``ctr run``: runc keeps its state in /run/containerd/runc/<namespace> for
    every containerd on the machine.
    """
    require("containerd", "Install it: `make node-deps` (root, apt).")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{root or workdir / "root"}"\n'
        f'state = "{workdir}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{workdir}/containerd.sock"\n'
        f'[ttrpc]\n  address = "{workdir}/containerd.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{workdir}/opt"\n'
    )
    address = str(workdir / "containerd.sock")
    log_path = workdir / "containerd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not serves(address):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ImageError(
                    f"localkube images: the scratch containerd did not serve on {address} "
                    f"(got: {log_path.read_text()[-600:]!r})."
                )
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name in ("state", "opt") if root else ("root", "state", "opt"):
            shutil.rmtree(workdir / name, ignore_errors=True)
