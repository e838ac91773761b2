"""Every generated file in the repository, written by one command: ``make generate``.

    python -m controller.generate              # write them into this checkout
    python -m controller.generate --out DIR    # write them under DIR instead (the tests compare)

Each file is made from the code that is its source of truth:

- controller/spec.schema.json          the job spec's JSON Schema (``spec.json_schema``)
- charts/ddpjob/values.schema.json     the chart's values schema, derived from the spec's
                                       (``render.values_schema``, which lists the rules)
- charts/ddpjob/ci/<example>-values.yaml   ``render <example> --values``, per examples/*.yaml
- tests/controller/golden/<example>.yaml   ``render <example>``: the manifests the tests pin
- k8s/pytorchjob.yaml                  ``render examples/quickstart.yaml --set namespace=ddpjob``

Each starts with :data:`MARK`: a comment line in YAML, a ``"$comment"`` key in JSON (which has
no comments). A file carrying the mark that the generator no longer makes (its example was
removed) is deleted. tests/test_generated.py runs the generator into a temporary folder and
compares: a stale file fails there, naming ``make generate``.

A development tool: it reads examples/ from the checkout it sits in, and nothing in the
controller imports it (render stays pure; this module does the file I/O).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from controller import dashboard
from controller.render.job import render_job
from controller.render.output import GENERATED, to_yaml
from controller.render.pytorchjob import render_pytorchjob
from controller.render.values import render_values
from controller.render.values_schema import values_schema
from controller.spec import json_schema, load_spec

REPO = Path(__file__).resolve().parents[1]
MARK = GENERATED

# The example job of k8s/ (kustomization.yaml): the quickstart, in the namespace k8s/ creates.
K8S_EXAMPLE = ("examples/quickstart.yaml", "namespace=ddpjob")


def generated_files(repo: Path = REPO) -> dict[str, str]:
    """Every generated file of ``repo``: its path (relative, POSIX) -> its text."""
    examples = sorted((repo / "examples").glob("*.yaml"))
    if not examples:
        raise FileNotFoundError(f"{repo / 'examples'}: no example specs; run from a checkout")
    files = {
        "controller/spec.schema.json": _json(json_schema()),
        "charts/ddpjob/values.schema.json": _json(values_schema()),
        # The ConfigMap holds it byte for byte, as render's does (the mark included).
        f"charts/ddpjob/dashboards/{dashboard.FILE}": dashboard.text(),
    }
    for path in examples:
        rel = path.relative_to(repo).as_posix()
        spec = load_spec(str(path))
        files[f"charts/ddpjob/ci/{path.stem}-values.yaml"] = _yaml(
            render_values(spec), f"python -m controller render {rel} --values"
        )
        files[f"tests/controller/golden/{path.stem}.yaml"] = _yaml(
            render_job(spec), f"python -m controller render {rel}"
        )
    example, override = K8S_EXAMPLE
    files["k8s/pytorchjob.yaml"] = _yaml(
        render_pytorchjob(load_spec(str(repo / example), [override])),
        f"python -m controller render {example} --set {override}",
        "The example job `kubectl apply -k k8s/` creates.",
    )
    return files


def is_generated(text: str) -> bool:
    """Whether ``text`` starts with the mark the generator puts on its files."""
    return text.startswith((f"# {MARK}\n", "{\n  " + json.dumps({"$comment": MARK})[1:-1]))


def write(files: dict[str, str], out: Path) -> tuple[list[str], list[str]]:
    """Write ``files`` under ``out`` (only those whose text changed) and delete the files that
    carry the mark beside them but are no longer made. Returns (written, removed)."""
    written, removed = [], []
    for rel, text in files.items():
        path = out / rel
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(rel)
    for folder in sorted({(out / rel).parent for rel in files}):
        for path in sorted(folder.iterdir()):
            rel = path.relative_to(out).as_posix()
            if rel not in files and path.is_file() and is_generated(path.read_text()):
                path.unlink()
                removed.append(rel)
    return written, removed


def _json(schema: dict[str, Any]) -> str:
    return json.dumps({"$comment": MARK, **schema}, indent=2) + "\n"


def _yaml(obj: Any, *comments: str) -> str:
    return "".join(f"# {line}\n" for line in (MARK, *comments)) + to_yaml(obj)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.generate", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "--out", type=Path, default=REPO, help="write under this folder (default: the checkout)"
    )
    args = parser.parse_args(argv)
    files = generated_files()
    written, removed = write(files, args.out)
    for rel in written:
        print(f"wrote {rel}")
    for rel in removed:
        print(f"removed {rel} (no longer generated)")
    print(f"{len(files)} generated files, {len(written)} written, {len(removed)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
