"""What the watchdog and the straggler check cost the trainer: with them against without, same run.

    python bench/watchdog_bench.py                     # 2 gloo ranks on CPU, 7 rounds
    python bench/watchdog_bench.py --rounds 9 --json bench-watchdog.json

``on`` is the defaults: the watchdog's progress marks and thread, the busy-time marks in the
comm hook, one all-gather per log window; ``off`` is ``watchdog.stuck_after_s=0``,
``watchdog.straggler_factor=0``. How the rounds run and the target: ``on_off.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from on_off import main

OFF = {"watchdog": {"stuck_after_s": 0, "straggler_factor": 0}}
SETTINGS = {"on": {}, "off": OFF, "off again": OFF}

if __name__ == "__main__":
    sys.exit(main(__file__, __doc__.split("\n")[0], "the watchdog", SETTINGS))
