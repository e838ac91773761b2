"""The pods' bridge keeps one MAC address while pods come and go.

A Linux bridge whose address nobody set takes the lowest MAC among its ports
(``br_stp_recalculate_bridge_id``), and every pod's veth is a port with a random one. When the
pod whose veth lent the bridge its address goes, the gateway's address changes under every
other pod, whose ARP cache still holds the old one: frames to it are flooded, never delivered to
the host, until the entry goes stale (tens of seconds). For that long a pod reaches no CoreDNS
and no status server on the gateway, while pod-to-pod traffic is fine: a TrainJob's rank 0 whose
peer's pod has just gone cannot post its last progress. ``host.create_bridge`` sets the address,
and the kernel keeps an address that was set.

For real, in a network namespace of the test's own (``unshare``; not as root, in a user
namespace of its own too): the bridge, the veths, ping and ARP are the kernel's; the machine's
own network is untouched."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.localkube.namespaces import run_unshared

# In a network namespace of its own: the node's bridge as ``up`` makes it and a "pod" (a network
# namespace behind a veth); a second pod, whose veth has a lower MAC, joins; the first pod
# learns the gateway's address then; the second pod goes, as pods do. The first pod must still
# reach the gateway with the address it learnt (its ARP entry is made permanent: no new lookup).
SCRIPT = r"""
import json, socket, subprocess, sys
from localkube.node import host

def ip(*args, ns=None):
    argv = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

def mac():
    return open(f"/sys/class/net/{host.BRIDGE}/address").read().strip()

def pod(name, veth_mac, address):
    ip("netns", "add", name)
    ip("link", "add", f"veth-{name}", "address", veth_mac, "type", "veth", "peer", "name", "eth0",
       "netns", name)
    ip("link", "set", f"veth-{name}", "master", host.BRIDGE, "up")
    ip("addr", "add", f"{address}/24", "dev", "eth0", ns=name)
    ip("link", "set", "eth0", "up", ns=name)
    ip("link", "set", "lo", "up", ns=name)

# This namespace's own /sys (its links) and /run (`ip netns add` makes files in /run/netns).
subprocess.run(["mount", "-t", "sysfs", "sysfs", "/sys"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"], check=True)
host.create_bridge()
seen = {"empty": mac()}
pod("a", "fe:00:00:00:00:0a", "10.244.0.10")
seen["one pod"] = mac()
pod("b", "02:00:00:00:00:01", "10.244.0.11")
seen["a lower MAC joined"] = mac()
# The first pod's ARP entry for the gateway, as it holds it after a packet sent now, kept for
# good: whatever it reaches later, it reaches with this address (the kernel's entry would last
# until it goes stale, tens of seconds).
ip("neigh", "replace", host.GATEWAY, "lladdr", mac(), "dev", "eth0", "nud", "permanent", ns="a")
ip("link", "del", "veth-b")
seen["it left"] = mac()
# What a pod's post to the status server does: a TCP connection to the gateway.
server = socket.create_server((host.GATEWAY, 8443))
connect = f"import socket; socket.create_connection(({host.GATEWAY!r}, 8443), timeout=3)"
reached = subprocess.run(
    ["ip", "netns", "exec", "a", sys.executable, "-c", connect], capture_output=True, text=True
)
reached = reached.returncode == 0 or reached.stderr.strip().splitlines()[-1]
assigned = open(f"/sys/class/net/{host.BRIDGE}/addr_assign_type").read().strip()
print(json.dumps({"seen": seen, "reached": reached, "assign_type": assigned}))
"""


def test_the_gateway_keeps_its_mac_while_pods_come_and_go():
    if not shutil.which("unshare"):
        pytest.fail(
            "test_bridge_mac: needs unshare (got none on PATH). Install util-linux", pytrace=False
        )
    # A mount namespace too: its own /sys and /run, and `ip netns add`'s mounts. Not root: a user
    # namespace as well, in which the network and mounts are the test's to change.
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    stdout = run_unshared([*user, "--net", "--mount", "--propagation", "private"], SCRIPT)
    import json

    out = json.loads(stdout)
    from localkube.node import host

    # Set, not taken from a port (NET_ADDR_SET is 3), and the same address throughout.
    assert out["assign_type"] == "3", out
    assert set(out["seen"].values()) == {host.BRIDGE_MAC}, out
    assert out["reached"] is True, out
