"""``python -m controller`` (and the ``ddpjob`` console script): the parser and the entry point.

The commands live beside, one file per family: ``spec_commands.py`` (validate, render, schema,
run --local), ``submit_commands.py`` (submit, wait, delete, doctor), ``status_commands.py``
(status, list, events, goodput), ``log_commands.py`` (logs, plot); ``cluster.py`` holds what
every cluster command starts with. Nothing imports this package; it imports the commands.

Exit codes: 0 ok, 1 the job or the cluster failed, 2 bad input (one ``error:`` line a problem,
no traceback; ``--debug`` shows it). Start-up stays cheap: argparse only at import time.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from controller.cli import log_commands, spec_commands, status_commands, submit_commands
from controller.cli.advice import CLI, error_lines
from controller.errors import DdpjobError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=CLI,
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
    for family in (spec_commands, submit_commands, status_commands, log_commands):
        family.add_commands(sub)
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
        sys.stderr.write("\n".join(error_lines(e)) + "\n")
        sys.stderr.flush()
        return e.exit_code
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `render ... | head`: the reader left; not an error of ours
        return 0
    finally:
        if args.debug and "controller.kube.tally" in sys.modules:  # it talked to a cluster
            from controller.kube import tally

            for line in tally.requests():
                print(f"debug:   {line}", file=sys.stderr)
            print(f"debug: {tally.summary()}", file=sys.stderr, flush=True)
