"""The stores under checkpoints (trainer/checkpoint/storage.py): a local directory and S3, the
latter against moto's S3 server through the real boto3 (tests/trainer/s3.py)."""

from __future__ import annotations

import socket
import threading
import zlib
from pathlib import Path

import pytest

from tests.trainer.s3 import MotoServer, free_port
from trainer.checkpoint import storage
from trainer.checkpoint.storage import LocalStore, S3Store, StorageError, open_store

MiB = 1 << 20


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path: Path):
    if request.param == "local":
        return LocalStore(tmp_path / "ckpt")
    return S3Store(request.getfixturevalue("s3") + "/runs/a")


def _produce(data: bytes, piece: int = 1000):
    def produce(f) -> None:
        for at in range(0, len(data), piece):
            f.write(data[at : at + piece])

    return produce


def test_a_store_writes_reads_lists_and_deletes_whole_objects(store) -> None:
    data = bytes(range(256)) * 4099
    assert store.write("step_00000001/state.pt", _produce(data)) == (len(data), zlib.crc32(data))
    store.write_bytes("step_00000001/manifest.json", b"{}")
    store.write_bytes("step_00000002.pt", b"legacy")
    assert store.read_bytes("step_00000001/state.pt") == data
    assert sorted(store.list()) == [
        "step_00000001/manifest.json",
        "step_00000001/state.pt",
        "step_00000002.pt",
    ]
    store.delete(["step_00000001/manifest.json", "step_00000001/state.pt", "nope/x"])
    assert store.list() == ["step_00000002.pt"]
    with pytest.raises(FileNotFoundError):
        store.read_bytes("step_00000001/state.pt")
    if isinstance(store, LocalStore):  # a step's directory goes with its last object
        assert [p.name for p in store.root.iterdir()] == ["step_00000002.pt"]


def test_an_object_whose_producer_fails_is_not_stored(store) -> None:
    def produce(f) -> None:
        f.write(b"x" * (12 * MiB))
        raise ValueError("the state did not serialise")

    with pytest.raises(ValueError, match="did not serialise"):
        store.write("step_00000001/state.pt", produce)
    assert store.list() == []  # no truncated object, no temp file


def test_an_s3_object_streams_up_as_multipart_parts(s3, moto, monkeypatch) -> None:
    """A state larger than a part goes up as a multipart upload, part by part, from the pipe."""
    monkeypatch.setattr(storage, "PART_BYTES", 5 * MiB)  # S3's smallest part
    store = S3Store(s3 + "/p")
    parts = []
    store.client.meta.events.register(
        "provide-client-params.s3.UploadPart",
        lambda params, **_: parts.append(params["PartNumber"]),
    )
    data = bytes(range(251)) * (23 * MiB // 251)
    assert store.write("step_00000001/state.pt", _produce(data, piece=3 * MiB))[0] == len(data)
    assert sorted(parts) == [1, 2, 3, 4, 5]  # 4 x 5 MiB and the rest
    assert store.read_bytes("step_00000001/state.pt") == data
    assert moto.open_uploads(s3[len("s3://") :]) == []


@pytest.mark.parametrize("failure", ["no bucket", "before reading"])
def test_a_failed_upload_stops_its_producer_instead_of_hanging(s3, monkeypatch, failure) -> None:
    """The upload fails (the bucket is gone; or the transfer gives up before it reads a byte),
    and the producer, which writes far more than the pipe and the in-memory parts hold, gets
    the error instead of blocking forever."""
    monkeypatch.setattr(storage, "PART_BYTES", 5 * MiB)
    store = S3Store("s3://no-such-bucket-here/p")
    if failure == "before reading":
        store = S3Store(s3 + "/p")

        def refuse(*args, **kwargs):
            raise ValueError("the transfer gave up")

        monkeypatch.setattr(store.client, "upload_fileobj", refuse)
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            store.write("step_00000001/state.pt", _produce(b"x" * (200 * MiB), piece=MiB))
        except BaseException as e:
            outcome.append(e)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(timeout=120)
    assert not writer.is_alive(), "the producer is still blocked on the pipe"
    (error,) = outcome
    answer = "NoSuchBucket" if failure == "no bucket" else "ValueError: the transfer gave up"
    assert isinstance(error, StorageError) and error.detail.startswith(answer), error


def test_remove_partial_clears_temp_files_and_open_uploads(s3, moto, tmp_path: Path) -> None:
    local = LocalStore(tmp_path)
    (tmp_path / "step_00000003").mkdir()
    (tmp_path / "step_00000003" / ".state.pt.tmp-77").write_bytes(b"half")
    (tmp_path / ".step_00000002.pt.tmp-76").write_bytes(b"half")
    (tmp_path / "step_00000003" / "state.pt").write_bytes(b"whole")
    local.remove_partial()
    assert local.list() == ["step_00000003/state.pt"]

    bucket = s3[len("s3://") :]
    client = moto.client()
    client.create_multipart_upload(Bucket=bucket, Key="run/step_00000003/state.pt")
    client.create_multipart_upload(Bucket=bucket, Key="other-run/step_00000003/state.pt")
    S3Store(s3 + "/run").remove_partial()
    assert moto.open_uploads(bucket) == ["other-run/step_00000003/state.pt"]


def test_probe_of_a_good_location_leaves_nothing(store) -> None:
    store.probe()
    assert store.list() == []


def test_probe_names_the_location_and_the_answer(s3, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StorageError) as e:
        LocalStore(tmp_path / "a-file" / "ckpt").probe()
    assert e.value.url == str(tmp_path / "a-file" / "ckpt")
    assert e.value.detail.startswith(("FileExistsError", "NotADirectoryError")), e.value.detail

    with pytest.raises(StorageError) as e:
        open_store("s3://no-such-bucket-here/run").probe()
    assert e.value.url == "s3://no-such-bucket-here/run"
    assert e.value.detail == "NoSuchBucket: The specified bucket does not exist"


def test_probe_with_wrong_credentials_says_the_servers_answer(monkeypatch) -> None:
    with MotoServer(auth=True) as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(StorageError) as e:
            open_store("s3://ckpt/run").probe()
    assert e.value.detail.startswith("InvalidAccessKeyId: The AWS Access Key Id you provided")


def test_probe_of_an_endpoint_that_is_not_there(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    for name, value in MotoServer().env.items():
        if name != "AWS_ENDPOINT_URL":
            monkeypatch.setenv(name, value)
    with pytest.raises(StorageError) as e:
        open_store("s3://ckpt/run").probe()
    assert e.value.detail.startswith("EndpointConnectionError: Could not connect to the endpoint")


def test_probe_of_an_endpoint_that_never_answers_ends_at_its_read_timeout(monkeypatch) -> None:
    """A server that accepts and then says nothing: the probe's bounded read timeout and
    attempts end it with an error (the bounds lowered here; the probe's own are seconds)."""
    monkeypatch.setattr(storage, "PROBE_TIMEOUTS", {"connect_timeout": 1, "read_timeout": 1})
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        for name, value in MotoServer().env.items():
            if name != "AWS_ENDPOINT_URL":
                monkeypatch.setenv(name, value)
        with pytest.raises(StorageError) as e:
            open_store("s3://ckpt/run").probe()
    assert e.value.detail.startswith("ReadTimeoutError: Read timeout on endpoint URL")
