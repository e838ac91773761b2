"""What the pre-flight costs a run's start: with it against without, same run.

    python bench/preflight_bench.py                        # 2 gloo ranks on CPU, 5 rounds
    python bench/preflight_bench.py --nproc 8 --device cuda --rounds 3   # one GPU machine

Each round starts the real trainer twice under torchrun (the order alternates): ``on``
(``preflight.enabled=true``) and ``off``. From each run, the ledger's ``startup_s`` (the
processes' start until the first step is done: imports, the group, the model, the pre-flight,
the first step), and from ``on`` the ``preflight`` event's own ``elapsed_s``. It prints, per
round and as medians: the pre-flight's seconds, both start-ups and their ratio, and what ``on``
added. Target: the pre-flight's own seconds are a few (at most 5), whatever the start-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.local.processes import free_port  # noqa: E402
from trainer.contract import GOODPUT, PREFLIGHT, parse_event, without_launcher  # noqa: E402

#: The target: the pre-flight's own seconds, at most.
TARGET_S = 5.0


def _run(args: argparse.Namespace, preflight: bool, ckpt: str) -> dict[str, float | None]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
        "--master-port", str(free_port()), "-m", "trainer",
        "task=vision", 'task_args={"image_size": 16, "width": 32, "train_size": 2048}',
        "max_steps=2", "log_every=1", "progress=never", "resume=never",
        f"device={args.device}", f"checkpoint.dir={ckpt}", "checkpoint.every_steps=0",
        f"preflight.enabled={'true' if preflight else 'false'}",
    ]  # fmt: skip
    import os

    env = without_launcher(dict(os.environ)) | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(
            f"preflight_bench: a run failed (exit {p.returncode}):\n{p.stderr[-2000:]}"
        )
    events = [e for line in p.stdout.splitlines() if (e := parse_event(line))]
    found = [e for e in events if e["event"] == PREFLIGHT]
    ledger = [e for e in events if e["event"] == GOODPUT][-1]["runs"][-1]
    return {
        "startup_s": ledger["startup_s"],
        "preflight_s": found[0]["elapsed_s"] if found else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {on: _run(args, on, f"{tmp}/r{i}-{on}") for on in order}
            on, off = got[True], got[False]
            rows.append(
                {
                    "preflight_s": on["preflight_s"],
                    "startup_on_s": on["startup_s"],
                    "startup_off_s": off["startup_s"],
                    "ratio": on["startup_s"] / off["startup_s"],
                    "added_s": on["startup_s"] - off["startup_s"],
                }
            )
            r = rows[-1]
            print(
                f"round {i + 1}: pre-flight {r['preflight_s']:.3f} s; start-up on "
                f"{r['startup_on_s']:.2f} s, off {r['startup_off_s']:.2f} s "
                f"({r['ratio']:.3f}x, {r['added_s']:+.2f} s)",
                flush=True,
            )
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"median of {len(rows)} rounds ({args.nproc} ranks, {args.device}): pre-flight "
        f"{median['preflight_s']:.3f} s (max {max(r['preflight_s'] for r in rows):.3f} s); "
        f"start-up on / off {median['ratio']:.3f}x ({median['added_s']:+.2f} s)"
    )
    ok = max(r["preflight_s"] for r in rows) <= TARGET_S
    print(f"target: the pre-flight at most {TARGET_S:g} s: {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "median": median}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
