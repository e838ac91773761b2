"""Running the go command for the local cluster's builds (``gotools`` and ``operators`` both
build Go modules; this module imports neither, so neither imports the other)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from ..procs import LocalkubeError

#: The wrapper module of the control-plane components (``builds/go``).
GO_DIR = Path(__file__).resolve().parent / "go"


#: The Go garbage collector's target for the go command and the compilers and linker it starts
#: (they read GOGC too): 4x the live heap between collections instead of 2x, so a build takes
#: a fifth less CPU, for a tenth more memory per compile.
GOGC = "400"


def _go_env() -> dict[str, str]:
    """Return the environment for go commands: module mode, no VCS stamping, local toolchain,
    the collector's :data:`GOGC` (a GOGC of the caller's own wins)."""
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-mod=mod")
    env.setdefault("GOTOOLCHAIN", "local")
    env.setdefault("GOGC", GOGC)
    env["CGO_ENABLED"] = env.get("CGO_ENABLED", "0")
    return env


def module_download(module: str, cwd: Path = GO_DIR) -> dict:
    """``go mod download -json MODULE`` in the Go module at ``cwd``: the module's ``Dir`` in the
    module cache, its ``Origin`` and the rest of what go reports."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=cwd,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise LocalkubeError(
            f"localkube: go mod download {module} in {cwd} failed (got exit {out.returncode}): "
            f"{out.stderr[-2000:]}. Check access to the Go module proxy."
        )
    return json.loads(out.stdout)


def run_go(args: list[str], log, cwd: Path = GO_DIR, nice: int = 0) -> float:
    """Run one go command in the wrapper module (or ``cwd``), at niceness ``nice`` (inherited by
    the compilers it starts); return its wall time in seconds."""
    if shutil.which("go") is None:
        raise LocalkubeError(
            "localkube: the go command is missing (got no `go` on PATH). "
            "Install Go >= 1.24 (https://go.dev/dl/) or point DDPJOB_TOOLS_DIR at built tools."
        )
    start = time.monotonic()
    print(f"[cluster] go {' '.join(args)}", file=log, flush=True)
    argv = ["nice", "-n", str(nice), "go", *args] if nice else ["go", *args]
    proc = subprocess.run(argv, cwd=cwd, env=_go_env(), capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise LocalkubeError(
            f"localkube: go {args[0]} failed (got exit {proc.returncode}):\n"
            f"{proc.stderr[-4000:]}\nHint: check network access to the Go module proxy."
        )
    return elapsed
