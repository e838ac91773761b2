"""``make test`` puts the node's images into its containerd's root while the Go tools still
build (``python -m localkube preload``), so that ``up``'s own import sends nothing. Here on a
root of the test's own, with real containerds: one imports, the next one on that root holds
the image, unpacked."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.builds import images as built
from localkube.node import images
from localkube.node.image_import import _Ctr, scratch_containerd

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pause_ref() -> str:
    """The node's pause image (built by ``make test``'s build phase)."""
    return built.pause_image()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: containerd's socket goes in it (108 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="preload-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_images_imported_offline_are_held_by_the_next_containerd_on_that_root(pause_ref, short_dir):
    root = short_dir / "root"
    (first,), removed = images.import_offline([pause_ref], root, short_dir / "a")
    assert removed == []
    assert first.layers_sent > 0 and not first.skipped, first
    assert not (short_dir / "a" / "state").exists()  # the containerd stopped and left its state
    assert root.is_dir()  # the root stays: it is the point
    # A second containerd on the same root, as the node's is at `up`: the image is there under
    # its name and ID, its snapshot unpacked (import_into_containerd checks both), so nothing
    # is sent.
    (second,), _ = images.import_offline([pause_ref], root, short_dir / "b")
    assert second.skipped, second
    assert second.image_id == first.image_id


def test_preload_leaves_a_running_nodes_containerd_alone(cluster):
    """With the cluster up, the node's containerd holds the root: preload does nothing, and
    says why."""
    said = images.preload_images(REPO)
    assert said == "not preloaded: the node's containerd runs; `up` imported its images", said


def _held(root: Path, workdir: Path) -> tuple[set[str], set[str], int]:
    """What a containerd on ``root`` holds: image names, content blobs, snapshots."""
    with scratch_containerd(workdir, root=root) as address:
        ctr = _Ctr(address, "k8s.io")
        snapshots = len(ctr.run("snapshots", "ls").splitlines()[1:])
        return set(ctr.images()), ctr.blobs(), snapshots


def test_an_offline_import_removes_the_other_images_it_replaces(pause_ref, short_dir):
    """What preload does to the other checkouts' trainer images, here with the init image as the
    other one: gone by name, and its content and snapshots with it; the kept image untouched."""
    init_ref = built.init_image()
    root = short_dir / "root"
    _, removed = images.import_offline([pause_ref, init_ref], root, short_dir / "a")
    assert removed == []
    names, blobs, snapshots = _held(root, short_dir / "b")
    assert {pause_ref, init_ref} <= names and snapshots >= 2

    (kept,), removed = images.import_offline(
        [pause_ref], root, short_dir / "c", replace="localhost/"
    )
    assert removed == [init_ref] and kept.skipped
    names_after, blobs_after, snapshots_after = _held(root, short_dir / "d")
    assert pause_ref in names_after and init_ref not in names_after
    assert blobs_after < blobs and snapshots_after < snapshots
    (again,), _ = images.import_offline([pause_ref], root, short_dir / "e")
    assert again.skipped  # the kept image is whole: nothing to send
