"""Shared helpers for the controller tests: a minimal valid spec and a spec-from-dict builder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
PYTHON = sys.executable


def minimal(**fields: Any) -> dict[str, Any]:
    """The smallest valid spec, with ``fields`` merged over it."""
    return {"name": "job", "image": "repo/trainer:1", **fields}


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec (dict or raw text) to a file and return its path."""
    import yaml

    def write(content: dict[str, Any] | str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text)
        return path

    return write
