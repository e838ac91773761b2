"""The janitor of one ``run --local --container``: undoes the run if its controller cannot.

The controller starts it before it creates anything, in a session of its own (Ctrl-C in the
terminal does not reach it), with the run's plan as JSON and a pipe on its stdin:

    python -m controller.local.janitor '{"engine": {...}, "containers": [...], ...}'

After its own clean-up the controller writes ``done`` and closes the pipe; the janitor exits.
When the pipe closes without ``done`` (the controller was killed, even by SIGKILL, and the
kernel closed its end), the janitor does what the controller would have: SIGTERM to the
containers, SIGKILL after the grace period, removes them and the run's network, and gives the
volume directories back to the invoking user.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from controller.local.engine import Engine, remove

DONE = b"done"


class Janitor:
    """The running janitor process; :meth:`dismiss` once the controller has cleaned up."""

    def __init__(self, plan: dict[str, Any]):
        # The janitor must import this same controller (a checkout run with PYTHONPATH, or an
        # editable install pointing elsewhere), so the directory above the package goes first.
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller.local.janitor", json.dumps(plan)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )

    def dismiss(self) -> None:
        """Tell the janitor the run is cleaned up; it exits without touching anything."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(DONE)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """``chown -R uid:gid root`` without following symlinks."""
    os.chown(root, uid, gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def clean_up(plan: dict[str, Any]) -> None:
    """Stop and remove the plan's containers and networks; hand its directories back."""
    e = plan["engine"]
    engine = Engine(e["name"], e["path"], e.get("rootless", False))
    remove(engine, plan["containers"], plan["networks"], grace_s=plan.get("grace_s", 0))
    back = plan.get("hand_back")
    if back:
        for d in back["dirs"]:
            with contextlib.suppress(OSError):
                chown_tree(Path(d), back["uid"], back["gid"])


def main(argv: list[str]) -> int:
    plan = json.loads(argv[0])
    told = sys.stdin.buffer.read()  # until the controller writes done, or dies
    if told.strip() == DONE:
        return 0
    clean_up(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
