"""Cold start of the controller CLI, side by side with importing the Kubeflow training SDK.

    .venv/bin/python bench/controller_bench.py [--runs 9]

Each command runs as a fresh interpreter (what a user or CI pays per invocation), interleaved
round by round so background load hits every command alike; one untimed warm-up round fills the
page cache first. Prints min and median wall time per command and the ratios to the SDK import.
Target: ``--help`` and ``render`` under 0.3 s and faster than ``import kubeflow.training``.
Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TARGET_S = 0.3

COMMANDS = {
    "python -c pass (interpreter floor)": [PY, "-c", "pass"],
    "python -m controller --help": [PY, "-m", "controller", "--help"],
    "python -m controller render quickstart": [
        PY,
        "-m",
        "controller",
        "render",
        "examples/quickstart.yaml",
    ],
    "python -m controller render gpu -o json": [
        PY,
        "-m",
        "controller",
        "render",
        "examples/gpu.yaml",
        "-o",
        "json",
    ],
    'python -c "import kubeflow.training" (SDK)': [PY, "-c", "import kubeflow.training"],
}
SDK = 'python -c "import kubeflow.training" (SDK)'
OURS = ("python -m controller --help", "python -m controller render quickstart")


def run_once(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="timed runs per command")
    runs = parser.parse_args().runs

    for cmd in COMMANDS.values():  # warm-up: page cache, .pyc files
        run_once(cmd)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, cmd in COMMANDS.items():
            times[name].append(run_once(cmd))

    sdk = statistics.median(times[SDK])
    width = max(map(len, COMMANDS))
    print(f"cold start, {runs} runs each, interleaved ({sys.version.split()[0]})")
    print(f"{'command':<{width}}  {'min s':>7}  {'median s':>8}  {'vs SDK':>7}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<{width}}  {min(samples):7.3f}  {median:8.3f}  {median / sdk:6.2f}x")

    ok = True
    for name in OURS:
        median = statistics.median(times[name])
        verdict = median < TARGET_S and median < sdk
        ok &= verdict
        print(
            f"{'PASS' if verdict else 'FAIL'}: {name}: {median:.3f} s "
            f"(target < {TARGET_S} s; SDK import is {sdk / median:.1f}x slower)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
