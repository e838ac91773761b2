"""``workdir_store: s3://...``: the client's upload and the pod's fetch through the trainer's
own S3 store, against moto's S3 server (real HTTP, real boto3): once per digest, and one clear
line when this machine cannot upload or the store refuses."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from controller.errors import UserError
from controller.workdir import pack, upload
from tests.projects import write_tree
from tests.trainer.s3 import MotoServer
from trainer import workdir as pod

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moto():
    with MotoServer() as server:
        yield server


@pytest.fixture
def store(moto, monkeypatch) -> str:
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    return moto.create_bucket(f"code-{uuid.uuid4().hex[:8]}") + "/team/code"


@pytest.fixture
def archive(tmp_path):
    folder = write_tree(tmp_path / "p", {"train.py": "print('hi')\n", "pkg/__init__.py": ""})
    with pack(folder) as packed:
        yield packed


def test_an_archive_goes_up_once_and_the_pod_fetches_and_unpacks_it(moto, store, archive, tmp_path):
    url, uploaded = upload(archive, store)
    assert (url, uploaded) == (f"{store}/{archive.digest[7:]}.tar.gz", True)
    assert upload(archive, store) == (url, False)  # the same digest: nothing sent again
    bucket = store.removeprefix("s3://").split("/")[0]
    assert moto.keys(bucket) == [f"team/code/{archive.digest[7:]}.tar.gz"]
    assert pod.fetch(url) == archive.read_bytes()
    into = tmp_path / "into"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.workdir", url, "--digest", archive.digest,
         "--into", str(into)],
        env={**os.environ, **moto.env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (into / "train.py").read_text() == "print('hi')\n"


def test_a_missing_object_fails_the_fetch_with_its_url(store):
    with pytest.raises(pod.WorkdirError, match=f"^{store}/nope.tar.gz: no such object$"):
        pod.fetch(f"{store}/nope.tar.gz")


def test_a_store_that_refuses_is_one_line_naming_what_to_check(moto, store, archive):
    missing = store.replace("code-", "no-such-bucket-")
    with pytest.raises(UserError) as e:
        upload(archive, missing)
    (line,) = e.value.problems
    assert line.startswith(f"workdir_store: {missing} refused the upload (")
    assert "NoSuchBucket" in line and "AWS_ENDPOINT_URL" in line


def test_wrong_credentials_are_refused_before_anything_is_created(archive, monkeypatch):
    with MotoServer(auth=True) as checking:
        for name, value in checking.env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(UserError) as e:
            upload(archive, "s3://any-bucket/code")
    (line,) = e.value.problems
    assert line.startswith("workdir_store: s3://any-bucket/code refused the upload (")


def test_without_boto3_here_the_line_says_which_extra_to_install(archive, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` raises ImportError
    with pytest.raises(UserError) as e:
        upload(archive, "s3://bucket/code")
    (line,) = e.value.problems
    assert line.startswith("workdir_store: uploading to s3://bucket/code needs boto3 on this ")
    assert "pip install 'ddpjob[s3]'" in line
