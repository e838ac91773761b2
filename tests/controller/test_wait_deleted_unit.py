"""``delete --wait`` without a cluster: it returns once the job and its pods are gone, and for
a TrainJob it also waits out pods that the Trainer controller creates again after that (seen on
the local cluster: ``tests/e2e/test_trainjob.py`` listed two pods after "deleted ... and its
pods")."""

from __future__ import annotations

import time

import pytest

from controller.jobs.read.apis import PYTORCHJOB_KIND, TrainJobKind
from controller.jobs.wait import WaitTimeout, wait_deleted
from controller.kube.watch import RESYNC


def _pod(name: str) -> dict:
    return {"metadata": {"name": name}}


class FakeCluster:
    """Each pod watch plays the next script: (seconds to wait, event type, pod name or None);
    then it stays open, quiet, until its deadline, as a real watch would. One watch plays its
    script in order whatever the machine's speed; the waits only space the events out."""

    def __init__(self, pod_scripts: list[list[tuple[float, str, str | None]]]):
        self.pod_scripts = pod_scripts
        self.pod_watches = 0
        self.quiet_waits = 0  # watches that played their script and were kept open
        self.deleted_at = 0.0  # time.monotonic() when the last DELETED was handed over

    def watch(self, what: str, namespace: str, *, deadline: float | None = None, **kw):
        if what == "job":
            yield RESYNC, {"count": 0}  # the job is gone
            return
        script = self.pod_scripts[min(self.pod_watches, len(self.pod_scripts) - 1)]
        self.pod_watches += 1
        for wait_s, etype, name in script:
            time.sleep(wait_s)
            if etype == "DELETED":
                self.deleted_at = time.monotonic()
            yield etype, (_pod(name) if name else {"count": 0})
        assert deadline is not None, "a quiet watch without a deadline would never end"
        self.quiet_waits += 1
        time.sleep(max(0.0, deadline - time.monotonic()))


def quick_trainjob() -> TrainJobKind:
    kind = TrainJobKind()
    kind.pods_recreated_within_s = 0.3  # the real 5 s, shortened
    return kind


def test_a_pytorchjob_delete_returns_when_its_pods_are_gone():
    c = FakeCluster([[(0, "ADDED", "a"), (0, RESYNC, None), (0.05, "DELETED", "a")]])
    wait_deleted(c, "j", "ns", kind=PYTORCHJOB_KIND, timeout_s=10)
    assert c.pod_watches == 1 and c.quiet_waits == 0  # returned at the DELETED, not later


def test_a_trainjob_delete_waits_for_pods_created_again_after_its_pods_were_gone():
    kind = quick_trainjob()
    c = FakeCluster(
        [
            [(0, "ADDED", "a-0"), (0, RESYNC, None), (0.05, "DELETED", "a-0")],
            # watched again: the JobSet was created again and its pod comes, then goes
            [(0, RESYNC, None), (0.1, "ADDED", "a-0-new"), (0.2, "DELETED", "a-0-new")],
            [(0, RESYNC, None)],
        ]
    )
    wait_deleted(c, "j", "ns", kind=kind, timeout_s=10)
    # Once the re-created pod went, a quiet watch as long as the pods may come back: a lower
    # bound on one clock, which a loaded machine only lengthens.
    assert c.pod_watches == 3 and c.quiet_waits == 1
    assert time.monotonic() - c.deleted_at >= kind.pods_recreated_within_s


def test_a_trainjob_whose_recreated_pod_stays_times_out_naming_its_pods():
    c = FakeCluster(
        [
            [(0, "ADDED", "a-0"), (0, RESYNC, None), (0.05, "DELETED", "a-0")],
            [(0, RESYNC, None), (0.05, "ADDED", "a-0-new")],
            [(0, "ADDED", "a-0-new"), (0, RESYNC, None)],
        ]
    )
    with pytest.raises(WaitTimeout, match="is gone, but some of its pods are not"):
        wait_deleted(c, "j", "ns", kind=quick_trainjob(), timeout_s=1.5)
