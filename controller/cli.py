"""``python -m controller``: validate, render and run a job spec; cluster commands beside them.

    python -m controller validate examples/quickstart.yaml
    python -m controller render examples/gpu.yaml | kubectl apply -f -
    python -m controller render examples/gpu.yaml --values      # Helm chart values instead
    python -m controller schema > controller/spec.schema.json
    python -m controller run examples/quickstart.yaml --local

Exit codes: 0 ok, 1 the job or the cluster failed, 2 bad input (one ``error:`` line a problem,
no traceback; ``--debug`` shows it). Start-up stays cheap: argparse only at import time; pydantic
is imported when a spec is read, torch and the kubernetes client never by validate/render/help.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from typing import TYPE_CHECKING, Any

from controller.errors import DdpjobError, UserError

if TYPE_CHECKING:
    from controller.spec import JobSpec

# The cluster commands (submit, wait, logs, ...) live beside, importing kubernetes lazily. Only a
# missing module is tolerated; an error inside it must surface.
if importlib.util.find_spec("controller.cli_cluster") is not None:
    from controller import cli_cluster
else:  # pragma: no cover - only while that module is being written
    cli_cluster = None


def load_spec(path: str, overrides: list[str] | None = None) -> JobSpec:
    """Read and validate a spec file (plus ``key=value`` overrides); UserError on any mistake."""
    from controller.spec import validate_spec
    from trainer.config import ConfigError, deep_merge, parse_overrides, read_yaml

    try:
        data = read_yaml(path)
        if overrides:
            if not isinstance(data, dict):
                data = {} if data is None else data
            if isinstance(data, dict):
                data = deep_merge(data, parse_overrides(overrides))
    except ConfigError as e:
        raise UserError(e.problems) from None
    return validate_spec(data)


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
        from controller.values import render_values  # written by the packaging side

        obj: Any = render_values(spec)
    else:
        from controller.render import render_pytorchjob

        obj = render_pytorchjob(spec)
    sys.stdout.write(_dump(obj, args.output))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from controller.spec import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        raise UserError(
            "run: only --local is supported here; to run on a cluster use "
            "`python -m controller submit SPEC`"
        )
    spec = load_spec(args.spec, args.set)
    from controller.local import run_local

    return run_local(spec, logs_dir=args.logs_dir, grace_s=args.grace_s)


def _dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        import json

        return json.dumps(obj, indent=2) + "\n"
    from controller.render import to_yaml

    return to_yaml(obj)


# --------------------------------------------------------------------------------------------
# Parser and entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controller",
        description=(
            "ddpjob: turn one YAML job spec into a Kubeflow PyTorchJob, run it locally, or "
            "submit and watch it on a cluster."
        ),
        epilog="Exit codes: 0 ok, 1 the job or cluster failed, 2 bad input.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks for errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def spec_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("spec", metavar="SPEC", help="job spec YAML file")
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a spec field, dotted (e.g. --set trainer.max_steps=50); repeatable",
        )
        return p

    p = spec_command("validate", "check a spec; one line per problem")
    p.set_defaults(func=cmd_validate)

    p = spec_command("render", "print the PyTorchJob manifest (for kubectl apply -f -)")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument(
        "--values", action="store_true", help="print Helm chart values (charts/ddpjob) instead"
    )
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("schema", help="print the JSON Schema of the spec")
    p.set_defaults(func=cmd_schema)

    p = spec_command("run", "run the job on this machine, one process per node")
    p.add_argument(
        "--local", action="store_true", help="run here (required; clusters use `submit`)"
    )
    p.add_argument(
        "--logs-dir",
        metavar="DIR",
        help="per-rank log files go here (default runs/<name>/logs)",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        metavar="S",
        help="on stop, seconds between SIGTERM and SIGKILL (default 30; checkpoints need time)",
    )
    p.set_defaults(func=cmd_run)

    if cli_cluster is not None:
        cli_cluster.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 job/cluster failed, 2 bad input, 130 ^C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DdpjobError as e:
        if args.debug:
            traceback.print_exc()
        _print_error(e)
        return e.exit_code
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `render ... | head`: the reader left; not an error of ours
        return 0


def _print_error(e: DdpjobError) -> None:
    if isinstance(e, UserError):
        lines = [f"error: {p}" for p in e.problems]
    else:
        first, *rest = str(e).splitlines() or [type(e).__name__]
        lines = [f"error: {first}", *rest]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
