"""The node's images: the ones it needs before any pod, imported into its containerd at ``up``
(or before, by ``preload``), and any other one by ``load`` (``kind load`` for the real node).

Images come in by import (there is no registry): the pause image, the training operator's init
image, this checkout's trainer image (also under the name the examples use: :func:`alias`). They
persist in containerd's root across ``down``, so an import after the first sends only what
changed (``image_import.py``). The recipes are ``builds/images.py``'s.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tools.podman import ImageError

from ..builds import images as built
from ..procs import LocalkubeError
from . import host
from .image_import import (
    ImportResult,
    import_into_containerd,
    remove_other_images,
    scratch_containerd,
    serves,
    tag,
)


@contextlib.contextmanager
def _said_as_cluster_errors() -> Iterator[None]:
    """An image that cannot be built or imported fails the cluster's start in one line."""
    try:
        yield
    except ImageError as exc:
        raise LocalkubeError(str(exc)) from None


@functools.cache
def images() -> dict[str, str]:
    """The images the node needs before any pod: the pause (sandbox) image and the init image
    of the training operator's Worker pods (built when missing or stale)."""
    with _said_as_cluster_errors():
        return {"pause": built.pause_image(), "init": built.init_image()}


def import_images(_ctx=None) -> None:
    """Import the node's images into containerd (a no-op for those already there: they persist
    in its root across ``down``), this checkout's trainer image included."""
    with _said_as_cluster_errors():
        for ref in images().values():
            import_into_containerd(ref, str(host.CONTAINERD_SOCKET))
    import_trainer_image()


def import_trainer_image(log=sys.stderr) -> str:
    """This checkout's trainer image, rebuilt if its code changed (about a minute) and imported
    into the node's containerd if containerd's copy is another image ID (seconds: only the
    trainer's own layer is sent); its reference. Also named as the examples and the chart name it
    (``builds.images.published_ref()``, e.g. ghcr.io/ddpjob/trainer:0.1.0), as ``kind load``
    would: a spec copied from examples/ runs this checkout's trainer, with nothing to pull."""
    with _said_as_cluster_errors():
        ref = built.trainer_image(log)
        import_into_containerd(ref, str(host.CONTAINERD_SOCKET), log=log)
        alias(ref, built.published_ref())
    return ref


def alias(ref: str, name: str) -> None:
    """Give the node's copy of ``ref`` a second name (one image, no copy: ``ctr images tag``)."""
    with _said_as_cluster_errors():
        tag(str(host.CONTAINERD_SOCKET), ref, name)


def load(ref: str, name: str | None = None, log=sys.stderr) -> str:
    """``kind load`` for the real node: import podman's ``ref`` into the node's containerd (only
    the layers it lacks), under its own name and ``name`` if given; the name pods use."""
    host.require()
    with _said_as_cluster_errors():
        import_into_containerd(ref, str(host.CONTAINERD_SOCKET), log=log)
    if name and name != ref:
        alias(ref, name)
    return name or ref


#: The private containerd of :func:`preload_images`: its config, state and socket (the root is
#: the node's).
PRELOAD_DIR = host.RUN_DIR / "containerd-preload"


def preload_images(repo: Path, log=sys.stderr) -> str:
    """Import the node's images into its containerd's root before the cluster starts; one line
    on what was done.

    ``make test`` runs this once its images are built, while the Go tools still build: the
    import of the multi-GB stand-in torch base then overlaps the Go build instead of lying on
    ``up``'s critical path, and ``up``'s own import (``node-images``) finds every image in place
    and sends nothing. The import goes through a containerd of its own: the node's root, no CRI
    plugin, a state folder and socket of its own; it stops when the import ends. Nothing is done
    (and ``up`` imports as before) when the node is off or cannot run here, or any node
    containerd already runs. The machine lock is held throughout, so a cluster starting
    meanwhile waits for it rather than opening the same root.

    The other checkouts' trainer images (each checkout has its own tag) are removed then, with
    the layers and snapshots only they held: the node never collects an image (it could not
    pull it again), and a CI clone in a new folder each run would leave one behind each time.
    Nothing of the node runs meanwhile; a checkout whose image went imports it again at its
    next ``up`` (its own layer only).
    """
    if not host.ENABLED:
        return "the node is off (DDPJOB_NODE=off): nothing to preload"
    try:
        host.preflight(repo)
    except LocalkubeError as e:
        return f"not preloaded: {e}"
    with host.machine_lock():
        if host.node_processes()["containerd"] or (
            host.CONTAINERD_SOCKET.exists() and serves(str(host.CONTAINERD_SOCKET))
        ):
            return "not preloaded: the node's containerd runs; `up` imported its images"
        start = time.monotonic()
        with _said_as_cluster_errors():
            refs = [*images().values(), built.trainer_image(log)]
            results, removed = import_offline(
                refs, host.CONTAINERD_ROOT, PRELOAD_DIR, log=log, replace=built.TRAINER_REF_PREFIX
            )
    sent = sum(r.bytes_sent for r in results) / 2**20
    took = time.monotonic() - start
    others = f"; removed {len(removed)} other checkouts' trainer images" if removed else ""
    return (
        f"preloaded {', '.join(refs)} ({sent:.0f} MiB sent) into the node's containerd "
        f"in {took:.0f}s{others}"
    )


def import_offline(
    refs: list[str], root: Path, workdir: Path, log=sys.stderr, replace: str | None = None
) -> tuple[list[ImportResult], list[str]]:
    """Import podman's ``refs`` into the containerd root ``root`` through a containerd of its
    own (``image_import.scratch_containerd`` on that root: config, state, socket and log in
    ``workdir``; no CRI plugin), stopped after. With ``replace``, the images named ``replace...``
    other than ``refs`` are removed, layers and snapshots too. What each import did, and the
    names removed. A containerd started on ``root`` later (the node's, at ``up``) holds the
    images, unpacked."""
    with scratch_containerd(workdir, root=root) as address:
        results = [import_into_containerd(ref, address, log=log) for ref in refs]
        removed = remove_other_images(address, replace, refs) if replace else []
    return results, removed
