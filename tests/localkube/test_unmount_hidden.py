"""``down``/``up`` put back what a node left mounted, even a pod's network namespace hidden under a
later bind of /run/netns onto itself (left there, it makes every later ``up`` fail with EBUSY).
For real, as root, in a private mount namespace (``unshare``): the host's mounts are untouched."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.localkube.namespaces import run_unshared

SCRIPT = r"""
import os, subprocess, sys
from localkube.node import host
name = sys.argv[1]
path = f"/run/netns/{name}"
# Start from a /run/netns with nothing mounted in it here: the host's binds and a running
# cluster's pod namespaces stay as they are outside this namespace (this test runs beside the
# cluster tests, whose pods' namespaces would be listed too). Some lie hidden under the bind, so
# this takes passes.
for _ in range(5):
    ours = [m for m in host.mountpoints() if m == "/run/netns" or m.startswith("/run/netns/")]
    for m in reversed(ours):
        subprocess.run(["umount", "-l", m], check=False, capture_output=True)
assert not [m for m in host.mountpoints() if m.startswith("/run/netns")], host.mountpoints()
before = {"mounts": host.mountpoints()}
open(path, "w").close()
# The state to clean up: a netns mounted on the parent at /run/netns/<name>, hidden under a
# bind of /run/netns onto itself (containerd's), and listed after it. One way to build it: with
# / shared here, the bind is its peer, so a mount on the bind propagates a copy onto / beneath
# it, and the copy outlives the visible one once the bind is made private.
subprocess.run(["mount", "--make-rshared", "/"], check=True)  # in this namespace only
subprocess.run(["mount", "--bind", "/run/netns", "/run/netns"], check=True)
subprocess.run(["mount", "--bind", "/proc/self/ns/net", path], check=True)
subprocess.run(["mount", "--make-private", "/run/netns"], check=True)
subprocess.run(["umount", path], check=True)
listed = [m for m in host.mountpoints() if m.startswith("/run/netns")]
assert listed == ["/run/netns", path], listed  # the hidden one listed after the bind
said = []
host._unmount_ours(before, said.append)
left = [m for m in host.mountpoints() if m.startswith("/run/netns")]
os.unlink(path)  # EBUSY while it is still a mount point
print(left, said)
"""


def test_a_netns_hidden_under_a_bind_of_run_netns_is_unmounted_and_removed():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail(
            "test_unmount_hidden: needs root and unshare (util-linux), as the node's reset does "
            f"(got uid {os.geteuid()}, unshare {shutil.which('unshare') or 'missing'}). "
            "Run the tests as root, with util-linux installed",
            pytrace=False,
        )
    made = not os.path.isdir("/run/netns")
    os.makedirs("/run/netns", exist_ok=True)
    name = f"cni-ddpjob-test-{uuid.uuid4()}"
    try:
        stdout = run_unshared(["--mount", "--propagation", "private"], SCRIPT, name)
    finally:
        Path("/run/netns", name).unlink(missing_ok=True)
        if made and not os.listdir("/run/netns"):
            os.rmdir("/run/netns")  # the machine as it was
    assert stdout.strip() == "[] ['node: unmounted 2 of 2 leftover mounts']", stdout
