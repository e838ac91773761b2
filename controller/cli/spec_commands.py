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
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.cli.advice import CLI
from controller.errors import UserError


def load_spec(path: str, overrides: list[str] | None = None):
    """The validated spec at ``path`` (``controller.spec.load_spec``, imported on use)."""
    from controller.spec import load_spec as load

    return load(path, overrides)


@dataclass
class Prepared:
    """A spec with its workdir packed: what render names, submit ships and run unpacks."""

    spec: Any
    archive: Any = None  # controller.workdir.Archive
    shipped: Any = None  # controller.workdir.Shipped

    def objects(self) -> list[dict[str, Any]]:
        """The job, then what its ``monitoring`` asks for (``render.job.render_objects``)."""
        from controller.render.job import render_objects

        return render_objects(self.spec, self.shipped)

    def remove(self) -> None:
        if self.archive is not None:
            self.archive.remove()


def prepare(args: argparse.Namespace, namespace: str | None = None) -> Prepared:
    """The spec of ``args`` (``--set``, ``--workdir``, a ``-n`` namespace applied) and, where it
    has a workdir, the folder packed; UserError before anything is created when the folder is
    missing, holds what cannot be packed, or is over a ConfigMap's size."""
    spec = load_spec(args.spec, args.set)
    update: dict[str, Any] = {}
    if getattr(args, "workdir", None):
        update["workdir"] = str(Path(args.workdir).absolute())
    if namespace:
        update["namespace"] = namespace
    spec = spec.model_copy(update=update) if update else spec
    if not spec.workdir:
        return Prepared(spec)
    from controller.workdir import CONFIGMAP_LIMIT_BYTES, check_fits, folder_of, pack, shipped_for

    archive = pack(folder_of(spec.workdir, args.spec))
    if not spec.workdir_store:
        try:
            check_fits(archive, CONFIGMAP_LIMIT_BYTES, "a ConfigMap")
        except UserError:
            archive.remove()
            raise
    return Prepared(spec, archive, shipped_for(spec.name, spec.workdir_store, archive))


def add_workdir_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="ship this folder with the job (the spec's workdir, relative to here): it is "
        "packed, and unpacked in every pod at /workdir, the working directory",
    )


# --------------------------------------------------------------------------------------------
# Commands


def cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec, args.set)
    print(
        f"{args.spec}: ok ({spec.name}: {spec.nodes} node(s) x {spec.nproc_per_node} "
        f"process(es), {spec.resources.gpus} GPU(s) per node)"
    )
    model_state = spec.model_state()
    if model_state is not None and model_state.fits is False:
        print(f"{args.spec}: warning: {model_state.line()}", file=sys.stderr)
    elif model_state is not None:
        print(f"{args.spec}: {model_state.line()}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    prepared = prepare(args)
    try:
        if args.values:
            from controller.render.values import render_values

            sys.stdout.write(_dump(render_values(prepared.spec, *_chart_workdir(prepared)), args))
            return 0
        objects = prepared.objects()
        if prepared.archive is not None:
            from controller.workdir import summary

            where = prepared.shipped.url or f"ConfigMap {prepared.shipped.config_map}"
            _say(summary(prepared.archive, f"{where} (named; submit ships it)"))
    finally:
        prepared.remove()
    # The job alone as one document; with what monitoring adds, one document each (YAML) or a
    # List (JSON), as kubectl reads them.
    if len(objects) == 1:
        sys.stdout.write(_dump(objects[0], args))
    elif args.output == "json":
        sys.stdout.write(_dump({"apiVersion": "v1", "kind": "List", "items": objects}, args))
    else:
        from controller.render.output import to_yaml

        sys.stdout.write("---\n".join(to_yaml(o) for o in objects))
    return 0


def _dump(obj: Any, args: argparse.Namespace) -> str:
    from controller.render.output import dump

    return dump(obj, args.output)


def _chart_workdir(prepared: Prepared) -> tuple[Any, bytes | None]:
    """What the chart needs of the workdir: what to name, and the archive itself where the
    chart creates the ConfigMap; an object store's archive is uploaded here, as submit does."""
    if prepared.archive is None:
        return None, None
    from controller.workdir import HELM_LIMIT_BYTES, check_fits, summary, upload

    if prepared.shipped.url:
        url, uploaded = upload(prepared.archive, prepared.spec.workdir_store)
        _say(summary(prepared.archive, f"{url} ({'uploaded' if uploaded else 'already there'})"))
        return prepared.shipped, None
    check_fits(prepared.archive, HELM_LIMIT_BYTES, "a Helm release")
    _say(
        summary(
            prepared.archive, f"the values (the chart's ConfigMap {prepared.shipped.config_map})"
        )
    )
    return prepared.shipped, prepared.archive.read_bytes()


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


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
    prepared = prepare(args)
    with _unpacked(prepared) as workdir:
        if args.container:
            from controller.local.container import run_container

            return run_container(
                prepared.spec,
                engine=args.engine or "auto",
                logs_dir=args.logs_dir,
                grace_s=args.grace_s,
                workdir=workdir,
            )
        from controller.local.processes import run_local

        return run_local(
            prepared.spec, logs_dir=args.logs_dir, grace_s=args.grace_s, workdir=workdir
        )


@contextlib.contextmanager
def _unpacked(prepared: Prepared):
    """The packed workdir unpacked into a fresh temp folder, as a pod's /workdir is: what the
    cluster would run, not the folder as it is (yields None without a workdir)."""
    if prepared.archive is None:
        yield None
        return
    import tempfile

    from controller.local.processes import LocalWorkdir
    from controller.workdir import summary
    from trainer.workdir import install

    try:
        with tempfile.TemporaryDirectory(prefix=f"ddpjob-{prepared.spec.name}-") as tmp:
            path = Path(tmp) / "workdir"
            install(prepared.archive.read_bytes(), prepared.archive.digest, path)
            _say(summary(prepared.archive, f"{path} (a fresh copy, removed after the run)"))
            yield LocalWorkdir(path, prepared.shipped)
    finally:
        prepared.remove()


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
    add_workdir_flag(p)
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
    add_workdir_flag(p)
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
