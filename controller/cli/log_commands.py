"""What a job on a cluster prints: logs (a rank's, or every pod's; followed through restarts)
and plot (rank 0's curves).

    python -m controller logs quickstart -f --rank 1
    python -m controller logs quickstart --all --since 10m
    python -m controller plot quickstart -o curves.png

The following is ``controller.jobs.follow``'s; this module picks the pod and prints. Its
modules that hold a Cluster (urllib3, ssl: about 0.1 s) are imported by the command that uses
them, so ``--help`` and the other commands never pay for them.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from controller.cli.advice import CLI
from controller.cli.cluster import add_target_flags, find, say
from controller.errors import ClusterError, NotFound, Unreachable, UserError
from controller.jobs.read.explain import has_container, is_elastic, job_events
from controller.jobs.read.why import pending_reason
from controller.kube.logstream import LogStreamBroken
from controller.plot import plot_curves
from controller.progress import urgent_lines

if TYPE_CHECKING:
    from controller.jobs.read.apis import JobKind
    from controller.jobs.snapshot import Snapshot
    from controller.kube.client import Cluster


def cmd_logs(args: argparse.Namespace) -> int:
    since_time = _since_time(args.since)
    if args.tail is not None and args.tail < 0:
        raise UserError(f"--tail: must be 0 or more (got {args.tail}). Drop it for every line")
    snap = find(args)
    cluster, namespace, kind, job = snap.cluster, snap.namespace, snap.kind, snap.job
    elastic = is_elastic(job)
    if elastic and args.rank != 0 and not args.all:
        raise UserError(
            f"--rank: job {namespace}/{args.name} is elastic: the rendezvous numbers its nodes, "
            f"so only rank 0 can be found (got --rank {args.rank}). See every worker with "
            f"`{CLI} logs {args.name} -n {namespace} --all`"
        )
    if args.follow:
        return _follow(args, cluster, namespace, kind, elastic, since_time)
    rank0 = None if args.all else _rank_pod(cluster, kind, job, namespace, args.rank)
    if rank0 is not None:
        _print_log(snap, rank0, args, since_time, prefix="")
        return 0
    if not args.all:  # elastic, and no worker's log shows the trainer's events
        say(
            f"logs: no worker of job {namespace}/{args.name} shows the trainer's start event "
            "(a script of your own?): every worker's log, each line after its pod's name"
        )
    pods = [p for p in snap.pods() if has_container(p, kind.container)]  # not an initializer's
    if not pods:
        raise NotFound(
            f"logs: job {namespace}/{args.name} has no pod (got none with "
            f"{kind.pods_selector(args.name)}). See `{CLI} status {args.name} -n {namespace}`"
        )
    for pod in sorted(pods, key=lambda p: (kind.node_rank(p), p["metadata"]["name"])):
        label = pod["metadata"]["name"] if elastic else f"rank {kind.node_rank(pod)}"
        _print_log(snap, pod, args, since_time, prefix=f"[{label}] ")
    return 0


def _follow(
    args: argparse.Namespace,
    cluster: Cluster,
    namespace: str,
    kind: JobKind,
    elastic: bool,
    since_time: str | None,
) -> int:
    """``logs -f``: the rank's log (every pod's with ``--all``) through restarts, until the job
    ends."""
    from controller.jobs.follow import RankFollower  # holds a Cluster
    from controller.jobs.wait import timeout_error

    out = sys.stdout

    def emit(lines: list[str]) -> None:
        out.write("\n".join(lines) + "\n")
        out.flush()
        for text in urgent_lines(lines):  # a verdict on a stuck rank, a straggler
            say(f"logs: {text}")

    follower = RankFollower(
        cluster,
        namespace,
        args.name,
        args.rank,
        emit,
        say,
        kind,
        elastic=elastic,
        every=args.all,
        tail_lines=args.tail,
        since_time=since_time,
    )
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    if follower.follow(deadline) is None:
        raise timeout_error(
            "logs", namespace, args.name, args.timeout, follower.state, follower.waiting()
        )
    return 0


def _since_time(text: str | None) -> str | None:
    """``--since 10m`` as an RFC 3339 time (UTC, whole seconds, rounded down): what kubectl's
    ``--since`` takes, a Go duration (``30s``, ``5m``, ``1h30m``, ``1.5h``)."""
    if text is None:
        return None
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise UserError(
            f"--since: not a duration (got {text!r}). Give a number and a unit: 30s, 5m, 1h30m"
        )
    seconds = sum(float(n) * units[u] for n, u in parts)
    when = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _print_log(
    snap: Snapshot,
    pod: dict[str, Any],
    args: argparse.Namespace,
    since_time: str | None,
    *,
    prefix: str,
) -> None:
    """One pod's log (not followed), as it comes: memory stays flat whatever its size; each
    line after ``prefix``."""
    cluster, namespace, kind = snap.cluster, snap.namespace, snap.kind
    name = pod["metadata"]["name"]
    if pod.get("status", {}).get("phase") == "Pending":
        try:
            events = job_events(args.name, snap.events())
        except ClusterError:
            events = []
        say(f"logs: {name} is pending: {pending_reason(pod, events) or 'no reason reported yet'}")
        return
    try:
        stream = cluster.stream_log(
            name,
            namespace,
            container=kind.container,
            follow=False,
            timestamps=False,
            tail_lines=args.tail,
            since_time=since_time,
        )
        try:
            for batch in stream.batches():
                sys.stdout.write("\n".join(prefix + line for line in batch) + "\n")
        finally:
            stream.close()
    except LogStreamBroken as e:
        raise Unreachable(
            f"logs: the log of pod {namespace}/{name} broke off (got {e})", reason="NoAnswer"
        ) from None
    except ClusterError as e:
        if getattr(e, "reason", "") != "NoLogYet":
            raise
        say(f"logs: {name} has no log yet ({e})")


def _rank_pod(
    cluster: Cluster, kind: JobKind, job: dict[str, Any], namespace: str, rank: int
) -> dict[str, Any] | None:
    """The pod of node ``rank`` (rank 0 of an elastic job: where the rendezvous put it; None
    when no worker's log shows it)."""
    from controller.jobs.rank0 import rank0_pod  # holds a Cluster

    name = job["metadata"]["name"]
    if rank == 0:
        pod, _ = rank0_pod(cluster, namespace, job, kind, scan=True)
        if pod is not None or is_elastic(job):
            return pod
        got = f"none with {kind.rank_selector(name, 0)}"
    else:
        selector = kind.rank_selector(name, rank)
        pods = cluster.list_pods(namespace, selector)
        if pods:
            return pods[-1]
        got = f"none with {selector}"
    raise NotFound(
        f"logs: job {namespace}/{name} has no pod for rank {rank} (got {got}). "
        f"See `{CLI} status {name} -n {namespace}`"
    )


def cmd_plot(args: argparse.Namespace) -> int:
    from controller.jobs.rank0 import rank0_pod  # holds a Cluster

    snap = find(args)
    pod, _ = rank0_pod(snap.cluster, snap.namespace, snap.job, snap.kind, scan=True)
    if pod is None:
        raise NotFound(f"plot: job {snap.namespace}/{args.name} has no pod of rank 0 (got none)")
    text = snap.cluster.read_log(
        pod["metadata"]["name"], snap.namespace, container=snap.kind.container
    )
    n = plot_curves(text.splitlines(), args.output, title=f"{snap.namespace}/{args.name}")
    print(f"wrote {args.output} ({n} train events)")
    return 0


# --------------------------------------------------------------------------------------------
# Parser


def add_commands(sub: Any) -> None:
    """Register logs and plot on the CLI's subparsers."""
    p = sub.add_parser("logs", help="a rank's log; -f follows it through restarts")
    add_target_flags(p)
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument(
        "--rank",
        type=int,
        default=0,
        metavar="N",
        help="node rank: 0 = master (TrainJob: node 0; elastic jobs: the worker running global "
        "rank 0), i = worker i-1 (node i) (default 0)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every pod of the job at once, each line after its rank ([rank 1]; the pod's "
        "name in an elastic job)",
    )
    p.add_argument(
        "--tail", type=int, metavar="N", help="only the last N lines of each log (-f: then on)"
    )
    p.add_argument(
        "--since",
        metavar="DURATION",
        help="only lines newer than this, as kubectl's --since: 30s, 5m, 1h30m",
    )
    p.add_argument("--timeout", type=float, metavar="S", help="with -f: give up (exit 1)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("plot", help="loss and throughput curves from rank-0 events (PNG)")
    add_target_flags(p)
    p.add_argument("-o", "--output", default="curves.png", metavar="PNG")
    p.set_defaults(func=cmd_plot)
