"""The local cluster's S3 server, built by a Go module of its own (``builds/go-s3``): the Versity S3
Gateway's command, unmodified (``github.com/versity/versitygw/cmd/versitygw`` at
``versions.VERSITYGW``, Apache-2.0). ``addons/s3.py`` runs it.

A module of its own because its AWS SDK, fiber and golang.org/x versions are not the Kubernetes
modules' to choose (nor theirs its). ``gotools`` builds it beside the Kubernetes build, at
nice 10: it takes the CPU that the others leave idle (their module downloads and
single-threaded links) and yields the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .. import versions
from ..procs import LocalkubeError
from .gocmd import run_go

GO_DIR = Path(__file__).resolve().parent / "go-s3"

MODULE = "github.com/versity/versitygw"
#: The module go.mod must require at exactly this version (``build`` checks; a test too).
PINS = {MODULE: versions.VERSITYGW}
BINARY = "versitygw"
PACKAGE = f"{MODULE}/cmd/versitygw"
#: Niceness of its build (see the module docstring).
NICE = 10


def source_digest() -> bytes:
    """A digest of the go-s3 module (go.mod, go.sum, *.go) and the pin, for the tools folder."""
    digest = hashlib.sha256()
    for path in [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.rglob("*.go"))]:
        digest.update(str(path.relative_to(GO_DIR)).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(versions.S3_SERVER, sort_keys=True).encode())
    return digest.digest()


def is_built(root: Path) -> bool:
    """True when the server's binary is in the tools folder ``root``."""
    return (root / "bin" / BINARY).exists()


def required_version(go_mod: str) -> str | None:
    """The version go.mod requires of :data:`MODULE` (a ``require`` line, not a replace)."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)}\s+(v\S+)", go_mod, re.MULTILINE)
    return found.group(1) if found else None


def _ldflags() -> str:
    """Strip symbols; stamp the version as upstream's Makefile does (``main.Version``)."""
    return f"-s -w -X main.Version={versions.VERSITYGW}"


def build(root: Path, log) -> dict[str, float]:
    """Build the server into ``root/bin`` when it is missing; return build seconds by name."""
    if is_built(root):
        return {}
    got = required_version((GO_DIR / "go.mod").read_text())
    if got != versions.VERSITYGW:
        raise LocalkubeError(
            f"localkube: {GO_DIR / 'go.mod'} requires {MODULE} {got}, localkube/versions.py "
            f"pins {versions.VERSITYGW}. Edit one to match the other, then run `go mod tidy` "
            f"in {GO_DIR}."
        )
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    tmp = bindir / f".{BINARY}.tmp{os.getpid()}"
    args = ["build", "-trimpath", "-ldflags", _ldflags(), "-o", str(tmp), PACKAGE]
    seconds = run_go(args, log, cwd=GO_DIR, nice=NICE)
    tmp.rename(bindir / BINARY)
    return {BINARY: seconds}
