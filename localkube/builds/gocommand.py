"""An upstream command built unmodified by a Go module of its own (``builds/go-<name>``), pinned
in ``localkube/versions.py``: the S3 server (``s3server.py``), Prometheus (``prometheus.py``).

A module of its own because the command's dependencies (an AWS SDK, fiber, Prometheus' own
client-go) are not the Kubernetes modules' to choose, nor theirs its. ``gotools`` builds each
beside the Kubernetes build, at nice 10: it takes the CPU that the others leave idle (their
module downloads and single-threaded links) and yields the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..procs import LocalkubeError
from .gocmd import run_go

#: Niceness of these builds (see the module docstring).
NICE = 10


def required_version(go_mod: str, module: str) -> str | None:
    """The version go.mod requires of ``module`` (a ``require`` line, not a replace)."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    return found.group(1) if found else None


@dataclass(frozen=True)
class GoCommand:
    """``go build`` of ``package`` (in ``module`` at ``version``) in the Go module ``go_dir``
    into ``<tools folder>/bin/<binary>``, with ``ldflags`` and build ``tags``. ``pins``: its
    entry of ``localkube/versions.py``, read when the digest is taken."""

    go_dir: Path
    module: str
    version: str
    pins: Mapping[str, str]
    binary: str
    package: str
    ldflags: str
    tags: tuple[str, ...] = ()

    def source_digest(self) -> bytes:
        """A digest of the module (go.mod, go.sum, *.go), the pin, the flags and the tags."""
        digest = hashlib.sha256()
        d = self.go_dir
        for path in [d / "go.mod", d / "go.sum", *sorted(d.rglob("*.go"))]:
            digest.update(str(path.relative_to(d)).encode())
            digest.update(path.read_bytes())
        digest.update(json.dumps(dict(self.pins), sort_keys=True).encode())
        digest.update(json.dumps([self.ldflags, *self.tags]).encode())
        return digest.digest()

    def is_built(self, root: Path) -> bool:
        """True when the binary is in the tools folder ``root``."""
        return (root / "bin" / self.binary).exists()

    def build(self, root: Path, log) -> dict[str, float]:
        """Build the command into ``root/bin`` when it is missing; return its build seconds."""
        if self.is_built(root):
            return {}
        go_mod = self.go_dir / "go.mod"
        got = required_version(go_mod.read_text(), self.module)
        if got != self.version:
            raise LocalkubeError(
                f"localkube: {go_mod} requires {self.module} {got}, localkube/versions.py pins "
                f"{self.version}. Edit one to match the other, then run `go mod tidy` in "
                f"{self.go_dir}."
            )
        bindir = root / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        tmp = bindir / f".{self.binary}.tmp{os.getpid()}"
        args = ["build", "-trimpath", "-ldflags", self.ldflags]
        if self.tags:
            args += ["-tags", ",".join(self.tags)]
        seconds = run_go([*args, "-o", str(tmp), self.package], log, cwd=self.go_dir, nice=NICE)
        tmp.rename(bindir / self.binary)
        return {self.binary: seconds}
