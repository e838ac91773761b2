"""The two local modes side by side: the quickstart as host processes and as containers.

    .venv/bin/python bench/local_bench.py [--rounds 3] [--image REF] [--steps 100]

Each round runs ``run examples/quickstart.yaml --local`` and then the same with ``--container``
(the image ``localkube.images.trainer_image()`` builds from this checkout, unless --image), both
with ``trainer.log_every=1``, so rank 0's first ``train`` event comes after one step. Measured
from the command's start: the first ``train`` event on its stdout (start-up: interpreter,
imports, the process group, one step) and the exit (total wall time). Rounds alternate the modes
so background load hits both alike. Prints every round, the medians and container / host
ratios; exits 1 if any run fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: localkube from this checkout

from localkube import images  # noqa: E402

SPEC = REPO / "examples" / "quickstart.yaml"


def run_once(mode: str, image: str, steps: int, env: dict[str, str]) -> tuple[float, float]:
    """(seconds to rank 0's first train event, seconds to exit) of one run in ``mode``."""
    argv = [
        sys.executable, "-m", "controller", "run", str(SPEC), "--local",
        "--set", f"image={image}", "--set", f"trainer.max_steps={steps}",
        "--set", "trainer.log_every=1", "--set", "trainer.eval_every=0",
    ]  # fmt: skip
    if mode == "container":
        argv.append("--container")
    with tempfile.TemporaryDirectory(prefix="ddpjob-local-bench-") as cwd:
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        first_train = None
        for line in proc.stdout:
            if first_train is None and line.startswith('{"event": "train"'):
                first_train = time.perf_counter() - started
        err = proc.stderr.read() if proc.stderr else ""
        code = proc.wait()
        total = time.perf_counter() - started
    if code != 0 or first_train is None:
        raise SystemExit(f"local bench: the {mode} run failed (exit {code}):\n{err[-3000:]}")
    return first_train, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, alternating")
    parser.add_argument("--steps", type=int, default=100, help="trainer.max_steps of each run")
    parser.add_argument("--image", help="the trainer image (default: built from this checkout)")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("CONTAINERS_CONF", str(images.CONTAINERS_CONF))
    os.environ.setdefault("CONTAINERS_CONF", env["CONTAINERS_CONF"])
    image = args.image or images.trainer_image()
    samples: dict[str, list[tuple[float, float]]] = {"host": [], "container": []}
    print(f"quickstart, 2 nodes, {args.steps} steps, {args.rounds} rounds; image {image}")
    print(f"{'round':>5}  {'mode':<9}  {'first train s':>13}  {'total s':>8}")
    for r in range(args.rounds):
        for mode in ("host", "container") if r % 2 == 0 else ("container", "host"):
            first, total = run_once(mode, image, args.steps, env)
            samples[mode].append((first, total))
            print(f"{r + 1:>5}  {mode:<9}  {first:13.1f}  {total:8.1f}", flush=True)

    medians = {
        mode: (statistics.median(x[0] for x in s), statistics.median(x[1] for x in s))
        for mode, s in samples.items()
    }
    (hf, ht), (cf, ct) = medians["host"], medians["container"]
    print(f"median host:      first train {hf:.1f} s, total {ht:.1f} s")
    print(f"median container: first train {cf:.1f} s, total {ct:.1f} s")
    print(
        f"container / host: first train {cf / hf:.2f}x (+{cf - hf:.1f} s), "
        f"total {ct / ht:.2f}x (+{ct - ht:.1f} s); load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
