"""run --local with a workdir: the nodes run in the packed copy, unpacked afresh, as pods do.

The CLI as a user runs it, on a real git project: ``command: [python, train.py]`` and
``python -m mypkg.train`` import the project's own package, read its data beside them, and see
what a pod would see (not the ignored file, not ``.git``), from a folder that is not the
project's and is gone after the run. Tiny scripts, no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.controller.conftest import REPO
from tests.projects import git_repository

PROBE = """\
import json, os, sys
from pathlib import Path
import mypkg.helper
print(json.dumps({
    "cwd": os.getcwd(),
    "helper": mypkg.helper.VALUE,
    "data": Path("data/words.txt").read_text().strip(),
    # Less the bytecode this run's own imports wrote (where PYTHONDONTWRITEBYTECODE is unset).
    "files": sorted(
        str(p) for p in Path(".").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ),
    "pythonpath": os.environ.get("PYTHONPATH", ""),
    "digest": os.environ.get("DDPJOB_WORKDIR_DIGEST", ""),
    "rank": os.environ.get("RANK"),
}), flush=True)
"""


def _project(root: Path) -> Path:
    files = {
        ".gitignore": "secret.txt\n",
        "secret.txt": "x",
        "train.py": PROBE,
        "mypkg/__init__.py": "",
        "mypkg/train.py": PROBE,
        "mypkg/helper.py": "VALUE = 'own helper'\n",
        "data/words.txt": "hello\n",
    }
    return git_repository(root, files)


def _run(
    tmp_path: Path, command: list[str], *extra: str
) -> tuple[subprocess.CompletedProcess, list]:
    spec = {"name": "wd", "image": "i:1", "nodes": 2, "command": command, "args": []}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "run", str(spec_path), "--local",
         "--logs-dir", str(logs), *extra],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    probes = [json.loads((logs / f"rank-{i}.log").read_text().splitlines()[-1]) for i in (0, 1)]
    return proc, probes


@pytest.mark.parametrize(
    "command", [["python", "train.py"], ["python", "-m", "mypkg.train"]], ids=["script", "module"]
)
def test_the_nodes_run_in_a_fresh_copy_of_what_a_pod_gets(tmp_path, command):
    project = _project(tmp_path / "project")
    proc, probes = _run(tmp_path, command, "--workdir", str(project))
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("workdir: ")]
    assert line.startswith("workdir: 6 files, ") and "(a fresh copy, removed after the run)" in line
    copy = probes[0]["cwd"]
    assert copy != str(project) and not Path(copy).exists()  # removed after the run
    for rank, probe in enumerate(probes):
        assert probe["rank"] == str(rank) and probe["cwd"] == copy
        assert (probe["helper"], probe["data"]) == ("own helper", "hello")
        assert probe["files"] == [
            ".ddpjob-digest", ".gitignore", "data/words.txt",
            "mypkg/__init__.py", "mypkg/helper.py", "mypkg/train.py", "train.py",
        ]  # fmt: skip
        assert probe["pythonpath"].split(":")[0] == copy
        assert probe["digest"].startswith("sha256:")


def test_the_spec_workdir_is_relative_to_the_spec_file(tmp_path):
    project = _project(tmp_path / "project")
    spec = {"name": "wd", "image": "i:1", "command": ["python", "train.py"], "args": []}
    spec["workdir"] = "."
    (project / "spec.yaml").write_text(yaml.safe_dump(spec))
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "run", str(project / "spec.yaml"), "--local",
         "--logs-dir", str(logs)],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    probe = json.loads((logs / "rank-0.log").read_text().splitlines()[-1])
    assert "spec.yaml" in probe["files"] and "secret.txt" not in probe["files"]


def test_a_missing_folder_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "run", str(_spec(tmp_path)), "--local",
         "--workdir", str(tmp_path / "nope")],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: workdir: {tmp_path / 'nope'} does not exist (got {tmp_path / 'nope'}). Set "
        "workdir to your project's folder, relative to the spec file's folder, or pass "
        "--workdir DIR"
    ]


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "wd", "image": "i:1", "command": ["python", "x.py"]}))
    return path
