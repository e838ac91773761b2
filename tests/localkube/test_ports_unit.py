"""The cluster's ports come from below the kernel's ephemeral range (ci13: a port picked from it
became some outgoing connection's local end before kueue bound it, and kueue could not start)."""

from __future__ import annotations

import socket

import pytest

from localkube import procs


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    low = min(procs._ephemeral_range()[0], procs.PORTS_TO)
    ports = procs.free_ports(40)
    assert len(set(ports)) == 40
    assert all(procs.PORTS_FROM <= p < low for p in ports), ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("", p))  # free: each can be listened on


def test_a_port_in_use_is_not_picked(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", procs.PORTS_FROM))
        held.listen()
        monkeypatch.setattr(procs, "_ephemeral_range", lambda: (procs.PORTS_FROM + 8, 60999))
        assert sorted(procs.free_ports(7)) == list(
            range(procs.PORTS_FROM + 1, procs.PORTS_FROM + 8)
        )
        # Not enough left: one line that says where it looked and what to change.
        with pytest.raises(procs.LocalkubeError, match="no 8 free TCP ports from 20000 to 20008"):
            procs.free_ports(8)
