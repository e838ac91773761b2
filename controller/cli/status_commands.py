"""What a job on a cluster is doing: status, goodput, list, events.

    python -m controller status quickstart
    python -m controller goodput quickstart --price-per-gpu-hour 2.5
    python -m controller list
    python -m controller events quickstart

The reading is ``controller.jobs``'s (status, goodput); this module prints it. Its modules that
hold a Cluster (urllib3, ssl: about 0.1 s) are imported by the command that uses them, so
``--help`` and the other commands never pay for them.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from controller.cli.advice import CLI
from controller.cli.cluster import add_target_flags, connect, find
from controller.cli.table import format_table
from controller.errors import NotFound, UserError
from controller.jobs.read.apis import KINDS
from controller.jobs.read.checkpoints import format_checkpoint
from controller.jobs.read.explain import age, format_progress, format_reported, sort_events
from controller.jobs.read.goodput import format_goodput, restart_lines
from controller.jobs.read.queue import (
    QueueView,
    preemption_line,
    queue_name,
    queued,
    summary,
    verdict_line,
)
from controller.jobs.read.workdir import code_line, workdir_of
from controller.kubeflow import PYTORCHJOB
from controller.progress import describe, describe_slow
from trainer.contract import STRAGGLER

if TYPE_CHECKING:
    from controller.jobs.read.apis import JobKind
    from controller.kube.client import Cluster


def cmd_status(args: argparse.Namespace) -> int:
    from controller.jobs.status import status_of  # holds a Cluster

    price = _price(args)
    snap = find(args)
    namespace = snap.namespace
    st = status_of(snap, price)
    if args.output == "json":
        print(json.dumps(st, indent=2))
        return 0
    msg = f" ({st['message']})" if st["message"] else ""
    print(f"{st['kind']} {namespace}/{st['name']}: {st['condition']}{msg}, age {st['age']}")
    if st["queue"]:
        view = QueueView(**st["queue"])
        for line in (summary(view), verdict_line(view), preemption_line(view)):
            if line:
                print(f"queue: {line}")
    _print_replicas(st)
    if st["elastic"] and st["rank0_pod"]:
        print(f"rank 0: pod {st['rank0_pod']} (the rendezvous placed it)")
    if st["workdir"]:
        print(f"workdir: {code_line(st['workdir'])}")
    if st["progress"]:
        print(f"progress: {format_progress(st['progress'])}")
    if st["checkpoint"]:
        print(f"checkpoint: {format_checkpoint(st['checkpoint'])}")
    if st.get("tracking"):
        print(f"mlflow run: {st['tracking']['url']}")
    if st["stuck"]:
        print(describe(st["stuck"]))
    for straggler in st["stragglers"]:
        print(describe({"event": STRAGGLER, **straggler}))
    for slow in st["preflight"]:
        print(f"preflight: {describe_slow(slow)}")
    for line in restart_lines(st):
        print(line)
    _print_nodes(st["nodes"])
    if st["reported_progress"]:
        print(f"reported in the {st['kind']}: {format_reported(st['reported_progress'])}")
    g = st["goodput"]
    if g and g["goodput_pct"] is not None and g["sources"]["trainer"]:
        cost = f", cost {g['cost']:.2f}" if g.get("cost") is not None else ""
        print(
            f"goodput: {g['goodput_pct']:.1f}% of {g['wall_s']:.0f}s wall{cost} "
            f"(`{CLI} goodput {st['name']} -n {namespace}` splits it)"
        )
    return 0


def _print_nodes(nodes: dict[str, Any]) -> None:
    """The nodes the job's ranks failed on, and whether its next pods avoid them."""
    for n in nodes["faults"]:
        causes = "; ".join(n["causes"])
        if n["node"] in nodes["avoided"]:
            print(f"avoids node {n['node']}: {n['faults']} fault(s) of this job there ({causes})")
        else:
            print(f"fault on node {n['node']}: {n['faults']} of this job there ({causes})")


def _print_replicas(st: dict[str, Any]) -> None:
    """The replicas' table, what each one's exit means, and why the pending ones wait."""
    if st["replicas"]:
        rows = [["REPLICA", "POD", "PHASE", "NODE", "RESTARTS", "EXIT", "REASON"]]
        for r in st["replicas"]:
            exit_code = "-" if r["exit_code"] is None else str(r["exit_code"])
            rows.append(
                [
                    r["replica"],
                    r["pod"],
                    r["phase"],
                    r["node"],
                    str(r["restarts"]),
                    exit_code,
                    r["reason"] or "-",
                ]
            )
        print(format_table(rows))
    for r in st["replicas"]:
        if r.get("meaning"):
            print(f"{r['replica']}: {r['reason']}: {r['meaning']}")
    for p in st["pending"]:
        print(f"pending: {p['pod']}: {p['reason'] or 'no reason reported yet'}")


def _price(args: argparse.Namespace) -> float | None:
    """``--price-per-gpu-hour``, checked before the cluster is asked anything."""
    price = args.price_per_gpu_hour
    if price is not None and not price >= 0:
        raise UserError(
            f"--price-per-gpu-hour: must be 0 or more (got {price}). Give your cluster's price, "
            "e.g. --price-per-gpu-hour 2.5"
        )
    return price


def cmd_goodput(args: argparse.Namespace) -> int:
    from controller.jobs.goodput import read_goodput  # holds a Cluster

    price = _price(args)
    snap = find(args)
    g = read_goodput(snap, price_per_gpu_hour=price)
    if args.output == "json":
        print(json.dumps({"name": args.name, "namespace": snap.namespace, **g}, indent=2))
    else:
        print("\n".join(format_goodput(f"{snap.kind.name} {snap.namespace}/{args.name}", g)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    cluster, namespace = connect(args)
    kinds = [KINDS[args.api]] if args.api else list(KINDS.values())
    found, served = [], []
    for kind in kinds:
        try:
            jobs = cluster.list_jobs(namespace, args.selector, api=kind.api)
        except NotFound as e:
            if e.reason == "APINotServed" and len(kinds) > 1:
                continue  # the cluster serves the other API only: list what it has
            raise
        served.append(kind)
        found.extend((kind, job) for job in jobs)
    if not found:
        what = " or ".join(f"{k.api.kind}s" for k in served)
        print(f"no {what} in {namespace}" + (f" with {args.selector}" if args.selector else ""))
        return 0
    wide = args.output == "wide"
    rows = [["NAME", "KIND", "STATUS", "QUEUE", "NODES", "PROGRESS", "AGE"]]
    if wide:
        rows[0].append("CODE")
    for kind, job in sorted(found, key=lambda kj: (kj[1]["metadata"]["name"], kj[0].name)):
        nodes = kind.nodes(job)
        # The job's own record of its progress (a TrainJob's trainerStatus): no log is read.
        reported = kind.reported_progress(job) or {}
        percent = reported.get("progressPercentage")
        rows.append(
            [
                job["metadata"]["name"],
                kind.api.kind,
                "Queued" if queued(job) else kind.condition(job),
                queue_name(job) or "-",
                "?" if nodes is None else str(nodes),
                "-" if percent is None else f"{percent}%",
                age(job["metadata"].get("creationTimestamp")),
            ]
        )
        if wide:  # which code: the shipped workdir's digest and git commit, or the image's
            rows[-1].append(code_line(workdir_of(job)))
    print(format_table(rows))
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    snap = find(args)
    namespace = snap.namespace
    events = [
        e
        for e in snap.events()
        if e.get("involvedObject", {}).get("name", "") == args.name
        or e.get("involvedObject", {}).get("name", "").startswith(f"{args.name}-")
    ]
    if args.api is not None and _twin(snap.cluster, snap.kind, args.name, namespace):
        # Both jobs' objects are named after it: keep those of the API asked.
        mine = snap.kind.name == "pytorchjob"
        events = [
            e for e in events if _pytorchjob_object(args.name, e.get("involvedObject", {})) == mine
        ]
    if not events:
        print(f"no events for job {namespace}/{args.name} (events expire after about an hour)")
        return 0
    rows = [["AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"]]
    for e in sort_events(events):
        obj = e.get("involvedObject", {})
        when = (
            e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
        )
        rows.append(
            [
                age(when),
                e.get("type", ""),
                e.get("reason", ""),
                f"{obj.get('kind', '').lower()}/{obj.get('name', '')}",
                " ".join((e.get("message") or "").split()),
            ]
        )
    print(format_table(rows))
    return 0


def _twin(cluster: Cluster, kind: JobKind, name: str, namespace: str) -> bool:
    """Whether ``namespace/name`` is also a job of another API than ``kind``'s."""
    for other in KINDS.values():
        if other is kind:
            continue
        try:
            cluster.get_job(name, namespace, api=other.api)
            return True
        except NotFound:
            pass
    return False


def _pytorchjob_object(name: str, obj: dict[str, Any]) -> bool:
    """Whether an event's object is PyTorchJob ``name``'s: the job, or a pod or Service the
    training operator names ``<job>-<master|worker>-<index>`` (a TrainJob's JobSet, Jobs, pods
    and Service are named otherwise)."""
    if obj.get("kind") == PYTORCHJOB.kind:
        return obj.get("name") == name
    pattern = rf"{re.escape(name)}-(master|worker)-\d+"
    named = re.fullmatch(pattern, obj.get("name", "")) is not None
    return named and obj.get("kind") in ("Pod", "Service")


# --------------------------------------------------------------------------------------------
# Parser


def _price_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="X",
        help="what one GPU-hour costs (in your currency): adds the cost of the GPU-hours held",
    )


def add_commands(sub: Any) -> None:
    """Register status, list, events and goodput on the CLI's subparsers."""
    p = sub.add_parser("status", help="condition, replicas, progress of a job")
    add_target_flags(p)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    _price_flag(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", help="PyTorchJobs and TrainJobs with their status")
    add_target_flags(p, name=False)
    p.add_argument("-l", "--selector", help="label selector, e.g. app.kubernetes.io/name=ddpjob")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "wide"),
        default="table",
        help="wide: also which code each job runs (its workdir's digest and git commit)",
    )
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("events", help="Kubernetes events of a job and its pods")
    add_target_flags(p)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser(
        "goodput",
        help="where a job's wall time and GPU-hours went: queued, start-up, steps, lost work",
        description="Split a job's wall time and GPU-hours into queued, scheduling and image "
        "pull, start-up and compile, productive steps, checkpoint stalls, evaluation, work lost "
        "to restarts and preemptions, and the rest; goodput is productive / wall.",
    )
    add_target_flags(p)
    _price_flag(p)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_goodput)
