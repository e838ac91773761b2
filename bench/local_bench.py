"""The two local modes side by side: the quickstart as host processes and as containers.

    .venv/bin/python bench/local_bench.py [--rounds 3] [--image REF] [--steps 100]

Each round runs ``run examples/quickstart.yaml --local`` and then the same with ``--container`` (the
image ``localkube.builds.images.trainer_image()`` builds from this checkout, unless --image), both
with ``trainer.log_every=1``, so rank 0's first ``train`` event comes after one step. Measured from
the command's start: the first ``train`` event on its stdout (start-up: engine, interpreter,
imports, the process group, one step), the ``done`` event (training over) and the exit (total wall
time; after done: the ranks leave, containers and network are removed). Rounds alternate the modes
so background load hits both alike. Prints every round, the medians and container / host ratios;
exits 1 if any run fails."""

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

from localkube.builds import images  # noqa: E402
from tools import podman  # noqa: E402
from trainer.contract import is_event  # noqa: E402

SPEC = REPO / "examples" / "quickstart.yaml"


def run_once(mode: str, image: str, steps: int, env: dict[str, str]) -> tuple[float, ...]:
    """Seconds from the command's start to rank 0's first train event, to its done event, and
    to the command's exit, in one run of ``mode``."""
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
        first_train = done = None
        for line in proc.stdout:
            if first_train is None and is_event(line, "train"):
                first_train = time.perf_counter() - started
            if is_event(line, "done"):
                done = time.perf_counter() - started
        err = proc.stderr.read() if proc.stderr else ""
        code = proc.wait()
        total = time.perf_counter() - started
    if code != 0 or first_train is None or done is None:
        raise SystemExit(f"local bench: the {mode} run failed (exit {code}):\n{err[-3000:]}")
    return first_train, done, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, alternating")
    parser.add_argument("--steps", type=int, default=100, help="trainer.max_steps of each run")
    parser.add_argument("--image", help="the trainer image (default: built from this checkout)")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("CONTAINERS_CONF", str(podman.CONTAINERS_CONF))
    os.environ.setdefault("CONTAINERS_CONF", env["CONTAINERS_CONF"])
    image = args.image or images.trainer_image()
    samples: dict[str, list[tuple[float, ...]]] = {"host": [], "container": []}
    print(f"quickstart, 2 nodes, {args.steps} steps, {args.rounds} rounds; image {image}")
    print(f"{'round':>5}  {'mode':<9}  {'first train s':>13}  {'done s':>7}  {'total s':>8}")
    for r in range(args.rounds):
        for mode in ("host", "container") if r % 2 == 0 else ("container", "host"):
            first, done, total = run_once(mode, image, args.steps, env)
            samples[mode].append((first, done, total))
            print(f"{r + 1:>5}  {mode:<9}  {first:13.1f}  {done:7.1f}  {total:8.1f}", flush=True)

    med = {m: [statistics.median(x[i] for x in s) for i in range(3)] for m, s in samples.items()}
    for mode, (first, done, total) in med.items():
        print(
            f"median {mode + ':':<10} first train {first:5.1f} s, training {done - first:5.1f} s, "
            f"after done {total - done:4.1f} s, total {total:5.1f} s"
        )
    (hf, _, ht), (cf, _, ct) = med["host"], med["container"]
    print(
        f"container / host: first train {cf / hf:.2f}x (+{cf - hf:.1f} s), "
        f"total {ct / ht:.2f}x (+{ct - ht:.1f} s); load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
