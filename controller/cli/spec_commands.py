"""The commands on a spec, no cluster needed: validate, render, schema, run --local [--container].

    python -m controller validate examples/quickstart.yaml
    python -m controller render examples/gpu.yaml | kubectl apply -f -
    python -m controller render examples/gpu.yaml --values      # Helm chart values instead
    python -m controller render examples/gpu.yaml --set api=trainjob   # a TrainJob instead
    python -m controller schema        # the spec's JSON Schema (make generate checks it in)
    python -m controller run examples/quickstart.yaml --local
    python -m controller run examples/quickstart.yaml --local --container --set image=REF

Start-up stays cheap: pydantic is imported when a spec is read, torch and the kubernetes client
never by validate/render/help.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from controller.cli.advice import CLI
from controller.errors import UserError


def load_spec(path: str, overrides: list[str] | None = None):
    """The validated spec at ``path`` (``controller.spec.load_spec``, imported on use)."""
    from controller.spec import load_spec as load

    return load(path, overrides)


# --------------------------------------------------------------------------------------------
# Commands


def cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, args.set)
    print(
        f"{args.spec}: ok ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node} "
        f"process(es), {spec.resources.gpus} GPU(s) per node)"
    )
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, args.set)
    if args.values:
        from controller.render.values import render_values

        obj: Any = render_values(spec)
    else:
        from controller.render.job import render_objects

        objects = render_objects(spec)
        # The job alone as one document; with what monitoring adds, one document each (YAML)
        # or a List (JSON), as kubectl reads them.
        if len(objects) == 1:
            obj = objects[0]
        elif args.output == "json":
            obj = {"apiVersion": "v1", "kind": "List", "items": objects}
        else:
            from controller.render.output import to_yaml

            sys.stdout.write("---\n".join(to_yaml(o) for o in objects))
            return 0
    from controller.render.output import dump

    sys.stdout.write(dump(obj, args.output))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from controller.spec import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.cleanup:
        if args.spec is not None:
            raise UserError(
                f"run --cleanup: takes no SPEC (got {args.spec}); it removes what any earlier "
                f"run --container left behind. Run `{CLI} run --cleanup` alone"
            )
        from controller.local.container import cleanup

        return cleanup(args.engine or "auto")
    if args.spec is None:
        raise UserError(
            f"run: a SPEC is needed (got none). Run `{CLI} run SPEC --local [--container]`"
        )
    if not args.local:
        raise UserError(
            f"run: only --local is supported here; to run on a cluster use `{CLI} submit SPEC`"
        )
    if args.engine and not args.container:
        raise UserError(
            f"--engine: chooses the engine of --container runs (got --engine {args.engine} "
            "without --container). Add --container, or leave --engine out"
        )
    spec = load_spec(args.spec, args.set)
    if args.container:
        from controller.local.container import run_container

        return run_container(
            spec, engine=args.engine or "auto", logs_dir=args.logs_dir, grace_s=args.grace_s
        )
    from controller.local.processes import run_local

    return run_local(spec, logs_dir=args.logs_dir, grace_s=args.grace_s)


# --------------------------------------------------------------------------------------------
# Parser


def add_spec_argument(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """SPEC and --set, as every command that reads a spec takes them."""
    p.add_argument(
        "spec", metavar="SPEC", nargs=None if required else "?", help="job spec YAML file"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field, dotted (e.g. --set trainer.max_steps=50); repeatable",
    )


def add_commands(sub: Any) -> None:
    """Register validate, render, schema and run on the CLI's subparsers."""

    def spec_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_spec_argument(p)
        return p

    p = spec_command("validate", "check a spec; one line per problem")
    p.set_defaults(func=cmd_validate)

    p = spec_command(
        "render", "print the job manifest, PyTorchJob or TrainJob (for kubectl apply -f -)"
    )
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument(
        "--values", action="store_true", help="print Helm chart values (charts/ddpjob) instead"
    )
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("schema", help="print the JSON Schema of the spec")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "run",
        help="run the job on this machine: one process, or one container, per node",
        description=(
            "Run the job on this machine with the environment its operator would inject: one "
            "process per node (--local), or one container of the spec's image per node "
            "(--local --container, with docker or podman)."
        ),
    )
    add_spec_argument(p, required=False)
    p.add_argument(
        "--local", action="store_true", help="run here (required; clusters use `submit`)"
    )
    p.add_argument(
        "--container",
        action="store_true",
        help="with --local: each node as a container of the spec's image, on a network of its "
        "own (docker where a daemon answers, else podman)",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "docker", "podman"),
        help="with --container: the container engine (default auto)",
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help="remove the containers and networks that --container runs whose controller was "
        "killed left behind, then exit (no SPEC)",
    )
    p.add_argument(
        "--logs-dir",
        metavar="DIR",
        help="per-rank log files go here (default runs/<name>/logs)",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=None,
        metavar="S",
        help="on stop, seconds between SIGTERM and SIGKILL (default: the spec's grace_period_s, "
        "else 30; checkpoints need time)",
    )
    p.set_defaults(func=cmd_run)
