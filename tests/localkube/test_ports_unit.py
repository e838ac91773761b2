"""The cluster's ports come from below the kernel's ephemeral range (a port picked from it can
become some outgoing connection's local end before its component binds it, which then cannot
start).

Each test runs in a network namespace of its own (``unshare --net``), whose ports nothing else
uses. On the machine's own, the cluster that the e2e tests run beside the offline ones picks its
ports from the same range: it may hold one of the ports this test wants free, and the test's own
binds could take a port a component is about to listen on."""

from __future__ import annotations

import json
import os

from localkube import procs
from tests.localkube.namespaces import run_unshared


def _in_own_netns(script: str) -> dict:
    """Run ``script`` (Python, ``procs`` imported) in a new network namespace; its last line of
    stdout is JSON. Root makes one directly; anyone else through a user namespace."""
    flags = ["--net"] if os.geteuid() == 0 else ["-r", "--net"]
    code = "from localkube import procs\nimport json, socket\n" + script
    return json.loads(run_unshared(flags, code).splitlines()[-1])


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    out = _in_own_netns(
        "held = socket.socket()\n"
        "held.bind(('', procs.PORTS_FROM + 1))\n"  # one in use: never picked
        "ports = procs.free_ports(40)\n"
        "low = min(procs._ephemeral_range()[0], procs.PORTS_TO)\n"
        "for p in ports:\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('', p))\n"  # free: each can be listened on (or the script fails)
        "print(json.dumps({'ports': ports, 'low': low}))"
    )
    ports, low = out["ports"], out["low"]
    assert len(set(ports)) == 40
    assert all(procs.PORTS_FROM <= p < low for p in ports), ports
    assert procs.PORTS_FROM + 1 not in ports


def test_a_port_in_use_is_not_picked():
    out = _in_own_netns(
        "held = socket.socket()\n"
        "held.bind(('', procs.PORTS_FROM))\n"
        "held.listen()\n"
        "procs._ephemeral_range = lambda: (procs.PORTS_FROM + 8, 60999)\n"
        "picked = [sorted(procs.free_ports(7)) for _ in range(20)]\n"
        "try:\n"
        "    procs.free_ports(8)\n"
        "    said = None\n"
        "except procs.LocalkubeError as e:\n"
        "    said = str(e)\n"
        "print(json.dumps({'picked': picked, 'said': said}))"
    )
    start = procs.PORTS_FROM
    # Eight ports, the first in use: every pick is the other seven (shuffled 20 times).
    assert all(p == list(range(start + 1, start + 8)) for p in out["picked"]), out["picked"]
    # Not enough left: one line that says where it looked and what to change.
    assert out["said"] is not None and out["said"].startswith(
        "localkube: no 8 free TCP ports from 20000 to 20008 for the cluster's components."
    ), out["said"]
    assert "net.ipv4.ip_local_port_range" in out["said"]
