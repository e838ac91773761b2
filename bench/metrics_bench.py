"""What the Prometheus metrics cost the trainer per step: served against not, same run.

    python bench/metrics_bench.py                      # 2 gloo ranks on CPU, 7 rounds
    python bench/metrics_bench.py --rounds 9 --json bench-metrics.json

``on``: ``prometheus.serve=true`` (each rank's step-time histogram, its counters and gauges
every step, its log window's figures, a server on its port) and a scrape of every rank each
second while it trains (Prometheus scrapes every 15-60 s: this is the cost of rendering the page
fifteen times over); ``off``: ``prometheus.serve=false``. How the rounds run and the target:
``on_off.py``. The round-to-round noise of a shared machine hides a cost this small, so the
bench also times the per-step call alone (``Metrics.stepped``, 20000 times), in a process of its
own and in a launcher's worker (the multiprocess mode), and says what share of the measured
step it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from on_off import free_port, main

#: The port the bench's ranks serve on (each on it + its local rank): drawn by the launching
#: process, handed to the ranks in their environment.
PORT_ENV = "METRICS_BENCH_PORT"
SCRAPE_EVERY_S = 1.0


def settings(port: int) -> dict[str, dict[str, Any]]:
    off = {"prometheus": {"serve": False}}
    return {"on": {"prometheus": {"serve": True, "port": port}}, "off": off, "off again": off}


@contextlib.contextmanager
def scraped(name: str, env: Any) -> Iterator[None]:
    """While an ``on`` run trains: this rank's metrics scraped every second."""
    stop = threading.Event()

    def scrape() -> None:
        url = f"http://127.0.0.1:{int(os.environ[PORT_ENV]) + env.local_rank}/metrics"
        while not stop.wait(SCRAPE_EVERY_S):
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
                r.read()

    thread = threading.Thread(target=scrape, daemon=True)
    if name == "on":
        thread.start()
    try:
        yield
    finally:
        stop.set()


CALL = """
import timeit
from trainer.telemetry import metrics as m
labels = {"job_name": "j", "namespace": "n", "rank": "0", "node": "x"}
x = m.Metrics(labels, samples=32, world_size=2)
print(timeit.timeit(lambda: x.stepped(5, 0.01, 0.001), number=20000) / 20000)
"""


def call_us(multiprocess: bool) -> float:
    """Microseconds of one ``Metrics.stepped``, alone or in the multiprocess mode."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": folder} if multiprocess else None
        out = subprocess.run(
            [sys.executable, "-c", CALL], env=env, capture_output=True, text=True, check=True
        )
    return float(out.stdout) * 1e6


if __name__ == "__main__":
    worker = "--worker" in sys.argv
    os.environ.setdefault(PORT_ENV, str(free_port()))
    port = int(os.environ[PORT_ENV])
    code = main(__file__, __doc__.split("\n")[0], "metrics", settings(port), scraped)
    if not worker:
        print(
            f"Metrics.stepped per step: {call_us(False):.1f} us alone, "
            f"{call_us(True):.1f} us in a launcher's worker (multiprocess mode)"
        )
    sys.exit(code)
