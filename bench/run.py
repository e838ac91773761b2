"""Run every benchmark, one after the other, each printing its own side-by-side ratios.

    make bench                      # all thirteen
    python bench/run.py trainjob    # one of: trainer checkpoint controller cluster logs logs-all
                                    #         image local trainjob queue recovery watchdog
                                    #         metrics

The trainer, checkpoint, watchdog and metrics benches need only CPU (the checkpoint bench
starts moto's S3 server unless AWS_ENDPOINT_URL names one); the cluster, logs, logs-all,
trainjob, queue and recovery benches reuse a live `make cluster-up` or start the local cluster
themselves (logs-all, trainjob and recovery need its real node); the image bench needs root,
podman and containerd; the local bench builds the trainer image when it is stale. Exit status:
non-zero if any bench missed its target or failed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = {
    "trainer": HERE / "trainer_bench.py",
    "checkpoint": HERE / "checkpoint_bench.py",
    "controller": HERE / "controller_bench.py",
    "cluster": HERE / "cluster_bench.py",
    "logs": HERE / "logs_bench.py",
    "logs-all": HERE / "logs_all_bench.py",
    "image": HERE / "image_bench.py",
    "local": HERE / "local_bench.py",
    "trainjob": HERE / "trainjob_bench.py",
    "queue": HERE / "queue_bench.py",
    "recovery": HERE / "recovery_bench.py",
    "watchdog": HERE / "watchdog_bench.py",
    "metrics": HERE / "metrics_bench.py",
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"bench: unknown bench {unknown[0]!r}; choose from {', '.join(BENCHES)}")
        return 2
    worst = 0
    for name in names:
        print(f"\n===== {name} =====", flush=True)
        code = subprocess.call([sys.executable, str(BENCHES[name])], cwd=HERE.parent)
        worst = worst or code
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
