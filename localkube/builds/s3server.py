"""The local cluster's S3 server, built by a Go module of its own (``builds/go-s3``): the Versity S3
Gateway's command, unmodified (``github.com/versity/versitygw/cmd/versitygw`` at
``versions.VERSITYGW``, Apache-2.0). ``addons/s3.py`` runs it. How such a command is built:
``gocommand.py``.
"""

from __future__ import annotations

from pathlib import Path

from .. import versions
from .gocommand import GoCommand
from .gocommand import required_version as _required_version

GO_DIR = Path(__file__).resolve().parent / "go-s3"

MODULE = "github.com/versity/versitygw"
#: The module go.mod must require at exactly this version (``build`` checks; a test too).
PINS = {MODULE: versions.VERSITYGW}
BINARY = "versitygw"

#: Stripped; the version stamped as upstream's Makefile does (``main.Version``).
COMMAND = GoCommand(
    go_dir=GO_DIR,
    module=MODULE,
    version=versions.VERSITYGW,
    pins=versions.S3_SERVER,
    binary=BINARY,
    package=f"{MODULE}/cmd/versitygw",
    ldflags=f"-s -w -X main.Version={versions.VERSITYGW}",
)


def required_version(go_mod: str) -> str | None:
    """The version go.mod requires of :data:`MODULE` (a ``require`` line, not a replace)."""
    return _required_version(go_mod, MODULE)


def source_digest() -> bytes:
    """A digest of the go-s3 module and the pin, for the tools folder's name."""
    return COMMAND.source_digest()


def is_built(root: Path) -> bool:
    return COMMAND.is_built(root)


def build(root: Path, log) -> dict[str, float]:
    """Build the server into ``root/bin`` when it is missing; return build seconds by name."""
    return COMMAND.build(root, log)
