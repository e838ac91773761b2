"""What the Prometheus metrics cost the trainer per step: served against not, same run.

    python bench/metrics_bench.py                      # 2 gloo ranks on CPU, 7 rounds
    python bench/metrics_bench.py --rounds 9 --json bench-metrics.json

``on``: ``prometheus.serve=true`` (each rank's step-time histogram, its counters and gauges
every step, its log window's figures, a server on its port) and a scrape of every rank each
second while it trains (Prometheus scrapes every 15-60 s: this is the cost of rendering the page
fifteen times over); ``off``: ``prometheus.serve=false``. How the rounds run and the target:
``on_off.py``.
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


if __name__ == "__main__":
    os.environ.setdefault(PORT_ENV, str(free_port()))
    port = int(os.environ[PORT_ENV])
    sys.exit(main(__file__, __doc__.split("\n")[0], "metrics", settings(port), scraped))
