"""The cluster commands of ``python -m controller``: submit, wait, status, logs, list, delete,
events, doctor, plot, goodput.

    python -m controller doctor examples/quickstart.yaml
    python -m controller submit examples/quickstart.yaml --wait --follow
    python -m controller status quickstart
    python -m controller logs quickstart -f --rank 1
    python -m controller wait quickstart --timeout 600
    python -m controller plot quickstart -o curves.png
    python -m controller goodput quickstart --price-per-gpu-hour 2.5
    python -m controller delete quickstart --wait

The work is done by ``controller.jobs`` (status, wait, follow, explain, doctor) on top of
``controller.kube``; this module parses, prints and names the next command. Nothing heavy is
imported here at import time (argparse only): the kubernetes client, pydantic and matplotlib
load inside the command that needs them, so ``--help`` stays fast.
Exit codes: 0 ok (Succeeded), 1 the job or the cluster failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from controller.cli.advice import CLI, kubectl_hints
from controller.cli.spec_commands import add_spec_argument, load_spec

if TYPE_CHECKING:
    from controller.jobs.read.apis import JobKind
    from controller.jobs.watches import PodHistory
    from controller.kube.client import Cluster


# --------------------------------------------------------------------------------------------
# Shared plumbing


def _cluster(args: argparse.Namespace) -> Cluster:
    from controller.kube.client import Cluster

    return Cluster(kubeconfig=args.kubeconfig, context=args.context)


def _namespace(args: argparse.Namespace, cluster: Cluster) -> str:
    return args.namespace or cluster.default_namespace()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _outcome(
    cluster: Cluster, job: dict[str, Any], namespace: str, seen: PodHistory | None = None
) -> int:
    """Print how the job ended: 0 Succeeded; Failed raises JobFailed with the story."""
    from controller.jobs.status import outcome

    print(outcome(cluster, job, namespace, seen))
    return 0


def _find(args: argparse.Namespace, cluster: Cluster, namespace: str) -> tuple[JobKind, dict]:
    """The job NAME names, in whichever API has it (``--api`` narrows the lookup)."""
    from controller.jobs.find import find_job

    return find_job(cluster, args.name, namespace, args.api, where=args.command)


def _announcer(cluster: Cluster):
    """``on_change`` for ``wait``: the job's condition, and where it stands in its Kueue queue
    while it waits there (a suspended job in a queue is queued, not failed)."""
    from controller.jobs.queue import QueueNotes
    from controller.jobs.read.explain import condition_message, job_condition

    notes = QueueNotes(cluster)

    def announce(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        line = notes.see(job)
        if line is not None:
            _say(f"job {name}: {line}")
        if notes.was_queued:
            return  # "Suspended" says less than the queue line
        cond = job_condition(job)
        msg = condition_message(job, cond)
        _say(f"job {name}: {cond}" + (f" ({msg})" if msg else ""))

    return announce


# --------------------------------------------------------------------------------------------
# Commands


def cmd_doctor(args: argparse.Namespace) -> int:
    from controller.jobs.doctor import FAIL, run_checks

    cluster = _cluster(args)
    manifest, namespace = None, args.namespace
    if args.spec:
        manifest = _manifest(args)
        namespace = manifest["metadata"]["namespace"]
    checks = run_checks(cluster, namespace or cluster.default_namespace(), manifest)
    for c in checks:
        print(c.line())
    return 1 if any(c.status == FAIL for c in checks) else 0


def _manifest(args: argparse.Namespace) -> dict[str, Any]:
    from controller.render.job import render_job

    spec = load_spec(args.spec, args.set)
    manifest = render_job(spec)
    if args.namespace:
        manifest["metadata"]["namespace"] = args.namespace
    return manifest


def cmd_submit(args: argparse.Namespace) -> int:
    from controller.errors import NotFound
    from controller.jobs.doctor import preflight
    from controller.jobs.read.apis import kind_of
    from controller.jobs.wait import wait_deleted, wait_for_job
    from controller.jobs.watches import PodHistory

    manifest = _manifest(args)
    kind = kind_of(manifest)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    cluster = _cluster(args)
    if args.replace:
        try:
            cluster.delete_job(name, namespace, api=kind.api)
            _say(f"submit: --replace: deleting {kind.name} {namespace}/{name} and its pods")
            wait_deleted(cluster, name, namespace, kind=kind, timeout_s=120)
        except NotFound:
            pass
    if not args.no_preflight:
        preflight(cluster, manifest, force=args.force, say=_say)
    from controller.jobs.read.explain import is_elastic, max_pods

    cluster.create_job(manifest)
    elastic = is_elastic(manifest)
    print(f"submitted {kind.name} {namespace}/{name}")
    print(kubectl_hints(name, namespace, kind, elastic=elastic, max_pods=max_pods(manifest)))
    sys.stdout.flush()
    if args.follow:
        return _follow_to_end(
            cluster, kind, name, namespace, rank=0, timeout_s=args.timeout, elastic=elastic
        )
    if args.wait:
        seen = PodHistory()
        job = wait_for_job(
            cluster,
            name,
            namespace,
            kind=kind,
            timeout_s=args.timeout,
            on_change=_announcer(cluster),
            history=seen,
            say=_say,
            where="submit",
        )
        return _outcome(cluster, job, namespace, seen)
    return 0


def _follow_to_end(
    cluster: Cluster,
    kind: JobKind,
    name: str,
    namespace: str,
    *,
    rank: int,
    timeout_s: float | None,
    elastic: bool,
) -> int:
    import time

    from controller.jobs.follow import RankFollower
    from controller.jobs.wait import timeout_error
    from controller.progress import Progress

    with Progress(sys.stdout, label=name) as progress:
        follower = RankFollower(
            cluster, namespace, name, rank, progress.feed_lines, _say, kind, elastic=elastic
        )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        job = follower.follow(deadline)
    if job is None:
        raise timeout_error(
            "submit", namespace, name, timeout_s, follower.state, follower.waiting()
        )
    return _outcome(cluster, job, namespace)


def cmd_wait(args: argparse.Namespace) -> int:
    from controller.jobs.wait import wait_for_job
    from controller.jobs.watches import PodHistory

    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, _ = _find(args, cluster, namespace)
    seen = PodHistory()
    job = wait_for_job(
        cluster,
        args.name,
        namespace,
        kind=kind,
        timeout_s=args.timeout,
        on_change=_announcer(cluster),
        history=seen,
        say=_say,
    )
    return _outcome(cluster, job, namespace, seen)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from controller.cli.table import format_table
    from controller.jobs.read.explain import format_progress, format_reported
    from controller.jobs.status import job_status
    from controller.progress import describe
    from trainer.contract import STRAGGLER

    price = _price(args)
    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    st = job_status(cluster, args.name, namespace, args.api, price)
    if args.output == "json":
        print(json.dumps(st, indent=2))
        return 0
    msg = f" ({st['message']})" if st["message"] else ""
    print(f"{st['kind']} {namespace}/{st['name']}: {st['condition']}{msg}, age {st['age']}")
    if st["queue"]:
        from controller.jobs.read.queue import QueueView, preemption_line, summary, verdict_line

        view = QueueView(**st["queue"])
        for line in (summary(view), verdict_line(view), preemption_line(view)):
            if line:
                print(f"queue: {line}")
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
    if st["elastic"] and st["rank0_pod"]:
        print(f"rank 0: pod {st['rank0_pod']} (the rendezvous placed it)")
    if st["progress"]:
        print(f"progress: {format_progress(st['progress'])}")
    if st["checkpoint"]:
        from controller.jobs.read.checkpoints import format_checkpoint

        print(f"checkpoint: {format_checkpoint(st['checkpoint'])}")
    if st["stuck"]:
        print(describe(st["stuck"]))
    for straggler in st["stragglers"]:
        print(describe({"event": STRAGGLER, **straggler}))
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


def _price(args: argparse.Namespace) -> float | None:
    """``--price-per-gpu-hour``, checked before the cluster is asked anything."""
    from controller.errors import UserError

    price = args.price_per_gpu_hour
    if price is not None and not price >= 0:
        raise UserError(
            f"--price-per-gpu-hour: must be 0 or more (got {price}). Give your cluster's price, "
            "e.g. --price-per-gpu-hour 2.5"
        )
    return price


def _price_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="X",
        help="what one GPU-hour costs (in your currency): adds the cost of the GPU-hours held",
    )


def cmd_goodput(args: argparse.Namespace) -> int:
    import json

    from controller.jobs.goodput import read_goodput
    from controller.jobs.read.goodput import format_goodput

    price = _price(args)
    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, job = _find(args, cluster, namespace)
    g = read_goodput(cluster, kind, job, price_per_gpu_hour=price)
    if args.output == "json":
        print(json.dumps({"name": args.name, "namespace": namespace, **g}, indent=2))
    else:
        print("\n".join(format_goodput(f"{kind.name} {namespace}/{args.name}", g)))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    import time

    from controller.errors import NotFound, UserError
    from controller.jobs.follow import RankFollower
    from controller.jobs.read.explain import has_container, is_elastic
    from controller.jobs.wait import timeout_error

    since_time = _since_time(args.since)
    if args.tail is not None and args.tail < 0:
        raise UserError(f"--tail: must be 0 or more (got {args.tail}). Drop it for every line")
    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, job = _find(args, cluster, namespace)  # NotFound early, in plain words
    elastic = is_elastic(job)
    if elastic and args.rank != 0 and not args.all:
        raise UserError(
            f"--rank: job {namespace}/{args.name} is elastic: the rendezvous numbers its nodes, "
            f"so only rank 0 can be found (got --rank {args.rank}). See every worker with "
            f"`{CLI} logs {args.name} -n {namespace} --all`"
        )
    if args.follow:
        from controller.progress import urgent_lines

        out = sys.stdout

        def emit(lines: list[str]) -> None:
            out.write("\n".join(lines) + "\n")
            out.flush()
            for text in urgent_lines(lines):  # a verdict on a stuck rank, a straggler
                _say(f"logs: {text}")

        follower = RankFollower(
            cluster,
            namespace,
            args.name,
            args.rank,
            emit,
            _say,
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
    rank0 = None if args.all else _rank_pod(cluster, kind, job, namespace, args.rank)
    if rank0 is not None:
        _print_log(cluster, kind, rank0, namespace, args, since_time, prefix="")
        return 0
    if not args.all:  # elastic, and no worker's log shows the trainer's events
        _say(
            f"logs: no worker of job {namespace}/{args.name} shows the trainer's start event "
            "(a script of your own?): every worker's log, each line after its pod's name"
        )
    pods = cluster.list_pods(namespace, kind.pods_selector(args.name))
    pods = [p for p in pods if has_container(p, kind.container)]  # not an initializer's
    if not pods:
        raise NotFound(
            f"logs: job {namespace}/{args.name} has no pod (got none with "
            f"{kind.pods_selector(args.name)}). See `{CLI} status {args.name} -n {namespace}`"
        )
    for pod in sorted(pods, key=lambda p: (kind.node_rank(p), p["metadata"]["name"])):
        label = pod["metadata"]["name"] if elastic else f"rank {kind.node_rank(pod)}"
        _print_log(cluster, kind, pod, namespace, args, since_time, prefix=f"[{label}] ")
    return 0


def _since_time(text: str | None) -> str | None:
    """``--since 10m`` as an RFC 3339 time (UTC, whole seconds, rounded down): what kubectl's
    ``--since`` takes, a Go duration (``30s``, ``5m``, ``1h30m``, ``1.5h``)."""
    import re
    from datetime import datetime, timedelta, timezone

    from controller.errors import UserError

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
    cluster: Cluster,
    kind: JobKind,
    pod: dict[str, Any],
    namespace: str,
    args: argparse.Namespace,
    since_time: str | None,
    *,
    prefix: str,
) -> None:
    """One pod's log (not followed), as it comes: memory stays flat whatever its size; each
    line after ``prefix``."""
    from controller.errors import ClusterError, Unreachable
    from controller.jobs.read.explain import job_events
    from controller.jobs.read.why import pending_reason
    from controller.kube.logstream import LogStreamBroken

    name = pod["metadata"]["name"]
    if pod.get("status", {}).get("phase") == "Pending":
        try:
            events = job_events(args.name, cluster.list_events(namespace))
        except ClusterError:
            events = []
        _say(f"logs: {name} is pending: {pending_reason(pod, events) or 'no reason reported yet'}")
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
        _say(f"logs: {name} has no log yet ({e})")


def _rank_pod(
    cluster: Cluster, kind: JobKind, job: dict[str, Any], namespace: str, rank: int
) -> dict[str, Any] | None:
    """The pod of node ``rank`` (rank 0 of an elastic job: where the rendezvous put it; None
    when no worker's log shows it)."""
    from controller.errors import NotFound
    from controller.jobs.rank0 import rank0_pod
    from controller.jobs.read.explain import is_elastic

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


def cmd_list(args: argparse.Namespace) -> int:
    from controller.cli.table import format_table
    from controller.errors import NotFound
    from controller.jobs.read.apis import KINDS
    from controller.jobs.read.explain import age
    from controller.jobs.read.queue import queue_name, queued

    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
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
    rows = [["NAME", "KIND", "STATUS", "QUEUE", "NODES", "PROGRESS", "AGE"]]
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
    print(format_table(rows))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from controller.jobs.wait import wait_deleted

    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, _ = _find(args, cluster, namespace)
    cluster.delete_job(args.name, namespace, api=kind.api)
    print(f"deleting {kind.name} {namespace}/{args.name}")
    if args.wait:
        wait_deleted(cluster, args.name, namespace, kind=kind, timeout_s=args.timeout)
        print(f"deleted {kind.name} {namespace}/{args.name} and its pods")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    from controller.cli.table import format_table
    from controller.jobs.read.explain import age, sort_events

    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, _ = _find(args, cluster, namespace)
    events = [
        e
        for e in cluster.list_events(namespace)
        if e.get("involvedObject", {}).get("name", "") == args.name
        or e.get("involvedObject", {}).get("name", "").startswith(f"{args.name}-")
    ]
    if args.api is not None and _twin(cluster, kind, args.name, namespace):
        # Both jobs' objects are named after it: keep those of the API asked.
        mine = kind.name == "pytorchjob"
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
    from controller.errors import NotFound
    from controller.jobs.read.apis import KINDS

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
    import re

    from controller.kubeflow import PYTORCHJOB

    if obj.get("kind") == PYTORCHJOB.kind:
        return obj.get("name") == name
    pattern = rf"{re.escape(name)}-(master|worker)-\d+"
    named = re.fullmatch(pattern, obj.get("name", "")) is not None
    return named and obj.get("kind") in ("Pod", "Service")


def cmd_plot(args: argparse.Namespace) -> int:
    from controller.errors import NotFound
    from controller.jobs.rank0 import rank0_pod
    from controller.plot import plot_curves

    cluster = _cluster(args)
    namespace = _namespace(args, cluster)
    kind, job = _find(args, cluster, namespace)
    pod, _ = rank0_pod(cluster, namespace, job, kind, scan=True)
    if pod is None:
        raise NotFound(f"plot: job {namespace}/{args.name} has no pod of rank 0 (got none)")
    text = cluster.read_log(pod["metadata"]["name"], namespace, container=kind.container)
    n = plot_curves(text.splitlines(), args.output, title=f"{namespace}/{args.name}")
    print(f"wrote {args.output} ({n} train events)")
    return 0


# --------------------------------------------------------------------------------------------
# Parser


def _common(p: argparse.ArgumentParser, *, name: bool = True) -> None:
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


def add_commands(sub: Any) -> None:
    """Register the cluster commands on the CLI's subparsers."""
    p = sub.add_parser(
        "submit",
        help="create the job (PyTorchJob or TrainJob) on the cluster (after a preflight)",
        description="Run the preflight checks (doctor), create the PyTorchJob or TrainJob, "
        "print the kubectl commands to inspect it. Exit 0 Succeeded, 1 Failed.",
    )
    add_spec_argument(p)
    _common(p, name=False)
    p.add_argument("--wait", action="store_true", help="wait until the job ends")
    p.add_argument(
        "--follow",
        action="store_true",
        help="stream rank-0 logs with progress and ETA until the job ends",
    )
    p.add_argument("--replace", action="store_true", help="delete a job of the same name first")
    p.add_argument(
        "--force",
        action="store_true",
        help="submit even if no node can fit the pods (it will stay Pending)",
    )
    p.add_argument("--no-preflight", action="store_true", help="skip the doctor checks")
    p.add_argument("--timeout", type=float, metavar="S", help="with --wait/--follow: give up")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("wait", help="wait until a job ends (watch-based); exit 0 Succeeded")
    _common(p)
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 1)")
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("status", help="condition, replicas, progress of a job")
    _common(p)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    _price_flag(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="a rank's log; -f follows it through restarts")
    _common(p)
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

    p = sub.add_parser("list", help="PyTorchJobs and TrainJobs with their status")
    _common(p, name=False)
    p.add_argument("-l", "--selector", help="label selector, e.g. app.kubernetes.io/name=ddpjob")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("delete", help="delete a job and its pods")
    _common(p)
    p.add_argument("--wait", action="store_true", help="wait until the job and pods are gone")
    p.add_argument(
        "--timeout", type=float, default=120, metavar="S", help="with --wait (default 120)"
    )
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("events", help="Kubernetes events of a job and its pods")
    _common(p)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("doctor", help="check the cluster (and a spec) before submitting")
    add_spec_argument(p, required=False)
    _common(p, name=False)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser(
        "goodput",
        help="where a job's wall time and GPU-hours went: queued, start-up, steps, lost work",
        description="Split a job's wall time and GPU-hours into queued, scheduling and image "
        "pull, start-up and compile, productive steps, checkpoint stalls, evaluation, work lost "
        "to restarts and preemptions, and the rest; goodput is productive / wall.",
    )
    _common(p)
    _price_flag(p)
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("plot", help="loss and throughput curves from rank-0 events (PNG)")
    _common(p)
    p.add_argument("-o", "--output", default="curves.png", metavar="PNG")
    p.set_defaults(func=cmd_plot)
