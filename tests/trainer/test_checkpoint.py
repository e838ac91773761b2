"""The checkpoint manager (trainer/checkpoint/manager.py), one process, on a local dir and on S3
(moto's server): complete only by the manifest, saved in the background from a copy, pruned whole,
damaged ones skipped, the layout before still read."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import manager
from trainer.checkpoint.manager import CheckpointManager, read_path, scan
from trainer.checkpoint.storage import LocalStore
from trainer.config import ConfigError
from trainer.contract import GRACE_PERIOD_ENV


def _state(step: int, n: int = 1000) -> dict:
    return {
        "model": {"w": torch.full((n,), float(step)), "b": torch.arange(3)},
        "optimizer": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": []},
        "step": step,
        "rng": [{"torch": torch.get_rng_state()}],
    }


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "ckpt")
    return request.getfixturevalue("s3") + "/runs/a"


def _save(mgr: CheckpointManager, step: int, **kw) -> dict:
    mgr.save(step, lambda: _state(step, **kw))
    (done,) = mgr.flush()
    return done


class _Gate:
    """Holds a store's manifest writes until opened; logs what the store was asked to do."""

    def __init__(self, mgr: CheckpointManager):
        self.open, self.reached, self.log = threading.Event(), threading.Event(), []
        store = mgr.store
        real_write_bytes, real_delete = store.write_bytes, store.delete

        def write_bytes(name: str, data: bytes) -> None:
            self.reached.set()
            assert self.open.wait(timeout=120), "the gate was never opened"
            real_write_bytes(name, data)
            self.log.append(f"wrote {name}")

        def delete(names: list[str]) -> None:
            real_delete(names)
            self.log += [f"deleted {n}" for n in names]

        store.write_bytes, store.delete = write_bytes, delete


def test_a_save_returns_before_its_write_and_is_complete_only_with_its_manifest(
    location: str,
) -> None:
    mgr = CheckpointManager(location, keep=3, is_main=True)
    gate = _Gate(mgr)
    started = time.perf_counter()
    mgr.save(7, lambda: _state(7))  # returns: the write waits at the gate, in the background
    save_s = time.perf_counter() - started  # what the caller paid: the stall is no more
    assert gate.reached.wait(timeout=120)
    assert mgr.completed() == []
    found, partial = scan(mgr.store.list())
    assert found == [] and partial == ["step_00000007/state.pt"]  # written, not yet complete
    # The write is held at the gate past twice what the save took (a pace, not a proof): it
    # started before the save returned, so it lasts longer than the save.
    time.sleep(max(0.0, started + 2 * save_s - time.perf_counter()))
    gate.open.set()
    (done,) = mgr.flush()
    assert done["step"] == 7 and done["path"] == mgr.store.url_of("step_00000007")
    assert done["bytes"] > 4000 and done["write_s"] > 0
    # The save stalled the caller for the copy alone, less than the write it started took.
    assert 0 <= done["stall_s"] <= save_s < done["write_s"], (done, save_s)
    assert [f.name for f in mgr.list()] == ["step_00000007"]
    manifest = json.loads(mgr.store.read_bytes("step_00000007/manifest.json"))
    assert manifest["objects"]["state.pt"]["bytes"] == done["bytes"]
    assert read_path(done["path"])["step"] == 7


def test_the_state_written_is_the_one_at_the_save_not_what_training_made_of_it(
    location: str,
) -> None:
    mgr = CheckpointManager(location, keep=3, is_main=True)
    gate = _Gate(mgr)
    live = _state(1)
    mgr.save(1, lambda: live)
    live["model"]["w"].add_(100)  # the next optimizer step, while the write is in flight
    gate.open.set()
    (done,) = mgr.flush()
    assert torch.equal(read_path(done["path"])["model"]["w"], torch.full((1000,), 1.0))


def test_a_new_save_waits_for_the_one_before(location: str) -> None:
    mgr = CheckpointManager(location, keep=3, is_main=True)
    gate = _Gate(mgr)
    mgr.save(1, lambda: _state(1))
    # Which comes first in save 2: its wait for save 1's write, or its reading of the state.
    seen, order = [], queue.Queue()
    inflight = mgr._inflight
    result = inflight.result
    inflight.result = lambda *a, **k: (order.put("waits for save 1"), result(*a, **k))[1]

    def state_2() -> dict:
        order.put("reads the state")
        seen.append([f.step for f in mgr.list()])  # what was complete when save 2 began
        return _state(2)

    second = threading.Thread(target=mgr.save, args=(2, state_2))
    second.start()
    assert order.get(timeout=120) == "waits for save 1"  # while save 1 is held at the gate
    gate.open.set()
    second.join(timeout=120)
    assert order.get(timeout=0) == "reads the state"
    assert seen == [[1]]
    assert [d["step"] for d in mgr.flush()] == [1, 2]  # each reported once, in order
    assert [f.step for f in mgr.list()] == [2, 1]


def test_keep_prunes_whole_steps_manifest_first(location: str) -> None:
    mgr = CheckpointManager(location, keep=2, is_main=True)
    gate = _Gate(mgr)
    gate.open.set()
    for step in (1, 2, 3, 4):
        _save(mgr, step)
    assert sorted(mgr.store.list()) == [
        "step_00000003/manifest.json",
        "step_00000003/state.pt",
        "step_00000004/manifest.json",
        "step_00000004/state.pt",
    ]
    for old in ("step_00000001", "step_00000002"):
        after = gate.log[gate.log.index(f"wrote {old}/manifest.json") :]
        deleted = [e for e in after if e.startswith(f"deleted {old}")]
        assert deleted == [f"deleted {old}/manifest.json", f"deleted {old}/state.pt"]


def test_a_damaged_checkpoint_is_skipped_for_the_one_before(location: str) -> None:
    mgr = CheckpointManager(location, keep=5, is_main=True)
    for step in (1, 2, 3, 4, 5):
        _save(mgr, step)
    store = mgr.store
    state5 = store.read_bytes("step_00000005/state.pt")
    store.write_bytes("step_00000005/state.pt", state5[: len(state5) // 2])  # truncated
    state4 = bytearray(store.read_bytes("step_00000004/state.pt"))
    state4[len(state4) // 2] ^= 0xFF  # one byte flipped: the same size
    store.write_bytes("step_00000004/state.pt", bytes(state4))
    store.write_bytes("step_00000003/manifest.json", b"{not json")
    store.delete(["step_00000002/state.pt"])

    state, where, skipped = CheckpointManager(location, keep=5, is_main=True).load("auto")
    assert state["step"] == 1 and where == store.url_of("step_00000001")
    assert [s.split(": unreadable (")[0] for s in skipped] == [
        store.url_of(f"step_0000000{i}") for i in (5, 4, 3, 2)
    ]
    assert "state.pt has" in skipped[0] and "its manifest says" in skipped[0]
    assert "CRC-32" in skipped[1]
    assert "manifest.json is damaged" in skipped[2]
    assert "FileNotFoundError" in skipped[3]
    with pytest.raises(ConfigError, match=r"resume: cannot load .*CRC-32"):  # named: no fallback
        mgr.load(store.url_of("step_00000004"))
    assert mgr.load("never") == (None, None, [])


def test_a_step_cut_off_before_its_manifest_is_never_read_and_goes_at_start(
    location: str,
) -> None:
    mgr = CheckpointManager(location, keep=3, is_main=True)
    _save(mgr, 1)
    mgr.store.write_bytes("step_00000002/state.pt", b"an upload that was cut off")
    again = CheckpointManager(location, keep=3, is_main=True)
    assert sorted(again.store.list()) == ["step_00000001/manifest.json", "step_00000001/state.pt"]
    state, _, skipped = again.load("auto")
    assert state["step"] == 1 and skipped == []


def test_a_step_written_again_is_incomplete_until_its_new_manifest(location: str) -> None:
    mgr = CheckpointManager(location, keep=3, is_main=True)
    _save(mgr, 5)
    gate = _Gate(mgr)
    mgr.save(5, lambda: _state(50))  # resume=never into a used dir reaches step 5 again
    assert gate.reached.wait(timeout=120)
    assert mgr.list() == []  # its old manifest went first
    gate.open.set()
    mgr.flush()
    assert gate.log[0] == "deleted step_00000005/manifest.json"
    assert read_path(mgr.store.url_of("step_00000005"))["model"]["w"][0] == 50


def test_checkpoints_of_the_layout_before_are_read_and_pruned(tmp_path: Path) -> None:
    for step in (1, 2):
        torch.save(_state(step), tmp_path / f"step_{step:08d}.pt")
    mgr = CheckpointManager(tmp_path, keep=2, is_main=True)
    state, where, _ = mgr.load("auto")
    assert state["step"] == 2 and where == str(tmp_path / "step_00000002.pt")
    assert read_path(str(tmp_path / "step_00000001.pt"))["step"] == 1
    _save(mgr, 3)
    _save(mgr, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]


def test_a_failed_write_is_reported_with_where_and_why_and_the_next_save_goes_on(
    tmp_path: Path,
) -> None:
    mgr = CheckpointManager(tmp_path, keep=3, is_main=True)
    real_write = mgr.store.write

    def full(name, produce):
        real_write(name, produce)  # the state is written, then the disk is full
        raise OSError(28, "No space left on device")

    mgr.store.write = full
    mgr.save(3, lambda: _state(3))
    assert mgr.flush() == [
        {
            "step": 3,
            "path": str(tmp_path / "step_00000003"),
            "error": f"{tmp_path / 'step_00000003'}: OSError: [Errno 28] No space left on device",
        }
    ]
    assert not (tmp_path / "step_00000003").exists()  # what it wrote of the step is gone
    mgr.store.write = real_write
    mgr.save(4, lambda: _state(4))
    (done,) = mgr.close()
    assert done["step"] == 4 and "error" not in done
    assert [f.step for f in mgr.list()] == [4]


def test_a_write_longer_than_the_grace_period_warns_once(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(GRACE_PERIOD_ENV, "0")
    mgr = CheckpointManager(tmp_path, keep=3, is_main=True)
    with caplog.at_level(logging.WARNING):
        _save(mgr, 1)
        _save(mgr, 2)
    (warning,) = [r.getMessage() for r in caplog.records if "grace period" in r.getMessage()]
    assert warning.startswith("checkpoint: writing step 1 took")
    assert "Raise grace_period_s in the job spec" in warning


def test_the_grace_period_is_kubernetes_default_in_a_pod_and_none_outside(monkeypatch) -> None:
    monkeypatch.delenv(GRACE_PERIOD_ENV, raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert manager.grace_period_s() is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert manager.grace_period_s() == 30
    monkeypatch.setenv(GRACE_PERIOD_ENV, "120")
    assert manager.grace_period_s() == 120


def test_a_location_that_cannot_be_written_is_a_config_error(s3, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        CheckpointManager("s3://no-such-bucket-here/run", keep=3, is_main=True)
    assert e.value.problems == [
        "checkpoint.dir: cannot write, read and delete in s3://no-such-bucket-here/run "
        "(NoSuchBucket: The specified bucket does not exist). Check the bucket name, the "
        "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and, for an S3-compatible "
        "server, AWS_ENDPOINT_URL"
    ]
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"cannot write, read and delete in .*/file/ckpt \("):
        CheckpointManager(tmp_path / "file" / "ckpt", keep=3, is_main=True)


def test_a_location_that_lists_but_refuses_writes_is_a_config_error(tmp_path, monkeypatch):
    """A read-only volume (or a key allowed to list, not to put): the probe's write says so at
    start, not the first save's, an hour later."""

    class ReadOnly(LocalStore):
        def write(self, name, produce):
            raise OSError(30, "Read-only file system")

    monkeypatch.setattr(manager, "open_store", lambda location, _: ReadOnly(Path(location)))
    with pytest.raises(ConfigError) as e:
        CheckpointManager(tmp_path, keep=3, is_main=True)
    (line,) = e.value.problems
    assert line.startswith(
        f"checkpoint.dir: cannot write, read and delete in {tmp_path} "
        "(OSError: [Errno 30] Read-only file system)"
    )
