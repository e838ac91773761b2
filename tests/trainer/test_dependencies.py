"""``pip install "ddpjob[trainer]"`` is all a pod needs: every import of trainer/ is declared.

The static test reads the imports; the slow one proves it for real: a fresh virtual environment
(no system site packages, not even pip of its own) gets exactly ``.[trainer]``, resolved from the
wheel's own metadata among the lock's wheels only (no registry asked), and trains two gloo ranks
to the end. uv installs it, as it installs the project's venv: pip reads the same metadata, but
unpacks the same 3 GiB of wheels that uv links from its cache.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from tests.trainer.conftest import CPU, REPO, Result, base_env, torchrun_cmd

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Needs no import statement shows: a module trainer/ imports that needs another distribution.
INDIRECT = {
    # torch.distributed's *_object collectives (broadcast_object_list, gather_object) pickle
    # through a numpy buffer: without numpy every rank but 0 dies "Numpy is not available".
    "numpy": "trainer",
    # torch.utils.tensorboard (imported only when tensorboard_dir is set) needs this package.
    "tensorboard": "tensorboard",
}


def _dist_name(requirement: str) -> str:
    """``"PyYAML>=6,<7"`` -> ``"pyyaml"`` (PEP 503 normalised)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(extra: str) -> list[str]:
    """What ``pip install "ddpjob[extra]"`` asks for: the base dependencies plus the extra."""
    project = PYPROJECT["project"]
    return project["dependencies"] + project["optional-dependencies"][extra]


def _declared(extra: str) -> set[str]:
    """The distribution names ``ddpjob[extra]`` brings directly."""
    return {_dist_name(d) for d in _requirements(extra)}


def _top_level_imports(path: Path) -> set[str]:
    """Top-level module names of every import in a file, lazy ones inside functions included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_third_party_import_of_trainer_is_declared_in_the_trainer_extra() -> None:
    imported = set()
    for path in (REPO / "trainer").rglob("*.py"):
        imported |= _top_level_imports(path)
    third_party = imported - set(sys.stdlib_module_names) - {"trainer", "__future__"}
    # Sanity: the scan sees the imports we know are there (a broken scan would find nothing).
    assert {"torch", "yaml", "pydantic", "numpy", "pynvml", "tqdm"} <= third_party
    owners = md.packages_distributions()
    trainer_extra = _declared("trainer")
    for module in sorted(third_party):
        dists = {_dist_name(d) for d in owners.get(module, [])}
        assert dists, f"{module}: imported by trainer/ but no installed distribution provides it"
        assert dists & trainer_extra, f"{module} (from {dists}) is not in ddpjob[trainer]"
    for dist, extra in INDIRECT.items():
        assert dist in _declared(extra), f"{dist}: needed indirectly, not in ddpjob[{extra}]"


def _wheel(tmp: Path) -> Path:
    """ddpjob's wheel, built from the files the Dockerfile's build context lets in, copied out of
    the checkout so the build writes no build/ or egg-info into it."""
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in ("pyproject.toml", PYPROJECT["project"]["readme"]):
        shutil.copy2(REPO / name, src / name)
    for package in ("trainer", "controller"):
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / package, src / package, ignore=skip)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-w", dist, src], check=True)
    (wheel,) = dist.glob("ddpjob-*.whl")
    return wheel


def _wheelhouses() -> list[Path]:
    """The wheels of the two views of uv.lock an image installs, torch's and the rest of the
    trainer extra's (``tools.wheelhouse``: one download per machine, hashes checked). Only
    the lock's versions are there, so pip's resolution among them is the lock's."""
    from tools.wheelhouse import BASE_REQUIREMENTS, wheelhouse

    return [wheelhouse(), wheelhouse(view=BASE_REQUIREMENTS.with_name("image.txt"))]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_trainer_extra_alone_trains_two_ranks_in_a_clean_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    try:
        # --without-pip: nothing in it but the standard library; .venv's pip installs into it.
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        py = str(venv / "bin" / "python")
        assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
        probe = [py, "-c", "import numpy"]
        assert subprocess.run(probe, capture_output=True, cwd=tmp_path).returncode != 0

        wheel = _wheel(tmp_path)
        # Offline, from the lock's wheels only: the wheel's own metadata decides what the venv
        # gets, and a requirement the lock cannot meet fails here instead of fetching anything.
        started = time.monotonic()
        houses = _wheelhouses()
        fill_s = time.monotonic() - started
        offline = ["--offline", "--no-index", *(a for h in houses for a in ("--find-links", h))]
        uv = Path(sys.executable).with_name("uv")  # the lock's uv (requirements/uv.txt)
        install = [uv, "pip", "install", "-q", "--python", py, *offline, f"{wheel}[trainer]"]
        subprocess.run(install, check=True, timeout=1500)
        install_s = time.monotonic() - started - fill_s
        print(f"clean venv: wheelhouses {fill_s:.0f}s, uv pip install .[trainer] {install_s:.0f}s")
        version = [py, "-c", "import importlib.metadata as m; print(m.version('torch'))"]
        installed = subprocess.run(version, capture_output=True, text=True, check=True)
        assert installed.stdout.strip() == md.version("torch")

        # Outside the checkout, so `trainer` can only come from the clean venv's site-packages.
        work = tmp_path / "work"
        work.mkdir()
        where = subprocess.run(
            [py, "-c", "import trainer; print(trainer.__file__)"],
            cwd=work,
            env=base_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        assert where.stdout.startswith(str(venv)), where.stdout
        args = [
            "task=lm",  # its corpus is package data: the wheel must ship it
            "max_steps=4",
            "batch_size=4",
            "log_every=2",
            "eval_batches=1",
            "progress=never",
            f"checkpoint.dir={work / 'ckpt'}",
            *(f"{k}={v}" for k, v in CPU.items()),
        ]
        cmd = torchrun_cmd(2, *args, python=py)
        p = subprocess.run(
            cmd, cwd=work, env=base_env(), capture_output=True, text=True, timeout=300
        )
        r = Result(p.returncode, p.stdout, p.stderr)
        assert r.rc == 0, r.stderr[-3000:]
        assert r.of("start")[0]["world_size"] == 2
        (done,) = r.of("done")
        assert done["reason"] == "completed" and done["step"] == 4
        assert r.events[-1]["event"] == "done"
        assert (work / "ckpt" / "step_00000004" / "manifest.json").is_file()
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # several GiB of torch and CUDA wheels
