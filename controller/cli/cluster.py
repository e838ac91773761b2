"""What every cluster command starts with: the flags that name a cluster, a namespace and a
job (:func:`add_target_flags`), and what they name (:func:`connect`; :func:`find`: the job's
snapshot).

``controller.kube.client`` (urllib3, ssl: about 0.1 s) is imported when a command connects, not
when the parser is built, so ``--help`` and the spec commands never pay for it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.jobs.snapshot import Snapshot
    from controller.kube.client import Cluster


def add_target_flags(p: argparse.ArgumentParser, *, name: bool = True) -> None:
    """NAME (with ``name``) and ``--api``, then ``-n``, ``--kubeconfig``, ``--context`` and
    ``--debug``, as every cluster command takes them."""
    if name:
        p.add_argument("name", metavar="NAME", help="job name (the spec's `name:`)")
    if name or p.prog.endswith(" list"):
        p.add_argument(
            "--api",
            choices=("pytorchjob", "trainjob"),
            help="the job's API (default: look in both; needed when a name is in both)",
        )
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    # SUPPRESS: without the flag here, the top-level --debug keeps its value.
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors"
    )


def cluster_of(args: argparse.Namespace) -> Cluster:
    """The cluster ``--kubeconfig`` and ``--context`` name."""
    from controller.kube.client import Cluster  # urllib3 and ssl: only a command that connects

    return Cluster(kubeconfig=args.kubeconfig, context=args.context)


def connect(args: argparse.Namespace) -> tuple[Cluster, str]:
    """The cluster and the namespace: ``-n``, else the kubeconfig context's."""
    cluster = cluster_of(args)
    return cluster, args.namespace or cluster.default_namespace()


def find(args: argparse.Namespace) -> Snapshot:
    """:func:`connect`, and the snapshot of the job NAME names, in whichever API has it
    (``--api`` narrows the lookup): NotFound early, in plain words. The command's readers take
    the snapshot: each object they need is read once."""
    from controller.jobs.snapshot import Snapshot  # holds a Cluster: see the module's docstring

    cluster, namespace = connect(args)
    return Snapshot.find(cluster, args.name, namespace, args.api, where=args.command)


def say(text: str) -> None:
    """A line for the user beside the command's output: on stderr, at once."""
    print(text, file=sys.stderr, flush=True)
