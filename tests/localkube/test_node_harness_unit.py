"""Pure parts of the real node's harness (no control plane needed): its ``local`` volumes and
the kept container logs."""

from __future__ import annotations

import errno
import os

from localkube.node import podlogs, volumes


def test_a_local_volume_is_bound_ahead_to_its_claim_on_the_real_node():
    pv = volumes.persistent_volume("ns1", "ckpt", "1Gi", "localkube-node")
    pvc = volumes.persistent_volume_claim("ns1", "ckpt", "1Gi")
    assert pv["spec"]["local"]["path"] == str(volumes.VOLUMES_DIR / "ns1-ckpt")
    assert pv["spec"]["claimRef"] == {"namespace": "ns1", "name": "ckpt"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["storageClassName"] == pvc["spec"]["storageClassName"]
    term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["localkube-node"]
    assert pv["metadata"]["labels"][volumes.LABEL_NAMESPACE] == "ns1"
    assert volumes.storage_class()["provisioner"] == "kubernetes.io/no-provisioner"


def _cri(path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def test_cri_logs_are_read_run_after_run_with_partial_lines_joined(tmp_path):
    first = tmp_path / "ns_p_uid1" / "pytorch" / "0.log"
    second = tmp_path / "ns_p_uid2" / "pytorch" / "0.log"
    # Written out of order on purpose; Go's RFC3339Nano drops trailing zeros of the fraction.
    _cri(second, "2026-01-01T00:00:05.1Z stdout F run 2")
    _cri(
        first,
        "2026-01-01T00:00:05.09Z stdout P hel",
        "2026-01-01T00:00:05.2Z stdout F lo",
        "2026-01-01T00:00:05.3Z stderr F  with a space",
    )
    assert podlogs.read_lines([second, first]) == ["hello", " with a space", "run 2"]


def test_log_keeper_keeps_a_log_the_kubelet_removed_and_what_was_written_after(tmp_path):
    source, kept = tmp_path / "pods", tmp_path / "kept"
    log = source / "ns_p_uid1" / "pytorch" / "0.log"
    _cri(log, "2026-01-01T00:00:01Z stdout F one")
    keeper = podlogs.LogKeeper(kept, source)
    keeper.sync()
    _cri(log, "2026-01-01T00:00:02Z stdout F two")  # after the link: the same inode
    (source / "ns_p_uid1" / "pytorch" / "0.log").unlink()  # the kubelet's GC
    (source / "ns_p_uid1" / "pytorch").rmdir()
    assert podlogs.read_lines(keeper.files("ns", "p", ["pytorch"])) == ["one", "two"]
    assert keeper.files("ns", "other", ["pytorch"]) == []


def test_log_keeper_copies_where_it_cannot_link_and_catches_up(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    source = tmp_path / "pods"
    log = source / "ns_p_uid1" / "pytorch" / "0.log"
    _cri(log, "2026-01-01T00:00:01Z stdout F one")
    keeper = podlogs.LogKeeper(tmp_path / "kept", source)
    keeper.sync()
    _cri(log, "2026-01-01T00:00:02Z stdout F two")
    assert podlogs.read_lines(keeper.files("ns", "p", ["pytorch"])) == ["one", "two"]
