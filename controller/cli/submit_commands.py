"""A job's life on a cluster: doctor (the checks before), submit, wait, delete.

    python -m controller doctor examples/quickstart.yaml
    python -m controller submit examples/quickstart.yaml --wait --follow
    python -m controller wait quickstart --timeout 600
    python -m controller delete quickstart --wait

The work is ``controller.jobs``'s (doctor, wait, follow, status); this module parses, prints and
names the next command. ``controller.jobs``'s modules that hold a Cluster (urllib3, ssl: about
0.1 s) and the spec (pydantic: about 0.2 s) are imported by the command that uses them, so
``--help`` and the other commands never pay for them.
Exit codes: 0 ok (Succeeded), 1 the job or the cluster failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from controller.cli.advice import kubectl_hints
from controller.cli.cluster import add_target_flags, cluster_of, find, say
from controller.cli.spec_commands import Prepared, add_spec_argument, add_workdir_flag, prepare
from controller.errors import NotFound
from controller.jobs.read.apis import kind_of
from controller.jobs.read.explain import condition_message, is_elastic, job_condition, max_pods
from controller.progress import Progress

if TYPE_CHECKING:
    from controller.jobs.read.apis import JobKind
    from controller.jobs.watches import PodHistory
    from controller.kube.client import Cluster
    from controller.spec import JobSpec


def cmd_doctor(args: argparse.Namespace) -> int:
    from controller.jobs.doctor import FAIL, run_checks, spec_checks  # holds a Cluster

    cluster = cluster_of(args)
    manifest, namespace, first = None, args.namespace, []
    if args.spec:
        spec, manifest = _spec_and_manifest(args)
        namespace = manifest["metadata"]["namespace"]
        first = spec_checks(spec)
    checks = [*first, *run_checks(cluster, namespace or cluster.default_namespace(), manifest)]
    for c in checks:
        print(c.line())
    return 1 if any(c.status == FAIL for c in checks) else 0


def _spec_and_manifest(args: argparse.Namespace) -> tuple[JobSpec, dict[str, Any]]:
    prepared = prepare(args, namespace=args.namespace)  # the spec's pydantic models
    try:
        return prepared.spec, prepared.objects()[0]
    finally:
        prepared.remove()


def _check_beside(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """A server-side dry run of each object that goes with the job: a cluster without the
    Prometheus Operator's CRDs has no PodMonitor, said before anything is created."""
    from controller.errors import ClusterError, UserError

    for obj in objects:
        try:
            cluster.create_beside(obj, None, dry_run=True)
        except ClusterError as e:
            if e.reason == "AlreadyExists":
                continue
            hint = ""
            if obj["kind"] == "PodMonitor" and e.status == 404:
                hint = (
                    " This cluster has no PodMonitor API (monitoring.coreos.com/v1): install "
                    "the Prometheus Operator, or set monitoring.pod_monitor: false"
                )
            raise UserError(f"submit: preflight {obj['kind']} refused: {e}.{hint}") from None


def cmd_submit(args: argparse.Namespace) -> int:
    prepared = prepare(args, namespace=args.namespace)
    try:
        return _submit(args, prepared)
    finally:
        prepared.remove()


def _submit(args: argparse.Namespace, prepared: Prepared) -> int:
    from controller.jobs.doctor import preflight, spec_checks  # holds a Cluster
    from controller.jobs.submit import create
    from controller.jobs.wait import wait_deleted, wait_for_job
    from controller.jobs.watches import PodHistory

    manifest, *beside = prepared.objects()
    kind = kind_of(manifest)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    cluster = cluster_of(args)
    if args.replace:
        try:
            cluster.delete_job(name, namespace, api=kind.api)
            say(f"submit: --replace: deleting {kind.name} {namespace}/{name} and its pods")
            wait_deleted(cluster, name, namespace, kind=kind, timeout_s=120)
        except NotFound:
            pass
    if not args.no_preflight:
        checks = spec_checks(prepared.spec)
        preflight(cluster, manifest, force=args.force, say=say, spec_checks=checks)
    shipped_to, workdir_map = _ship(prepared, namespace)
    if workdir_map is not None:
        beside.append(workdir_map)
    if not args.no_preflight:
        _check_beside(cluster, beside)
    create(cluster, manifest, beside)  # owned by the job: deleted with it
    elastic = is_elastic(manifest)
    print(f"submitted {kind.name} {namespace}/{name}")
    if shipped_to:
        print(shipped_to)
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
            say=say,
            where="submit",
        )
        return _outcome(cluster, job, seen)
    return 0


def _ship(prepared: Prepared, namespace: str) -> tuple[str | None, dict[str, Any] | None]:
    """Send the workdir where the job reads it: an object store now (exit 2 when it refuses),
    or a ConfigMap that goes with the job (made once the job exists, owned by it). The line
    submit prints and that ConfigMap, each None where there is none."""
    from controller.workdir import configmap_manifest, summary, upload

    archive, shipped = prepared.archive, prepared.shipped
    if archive is None:
        return None, None
    if shipped.url:
        url, uploaded = upload(archive, prepared.spec.workdir_store)
        return summary(archive, f"{url} ({'uploaded' if uploaded else 'already there'})"), None
    from controller.render.pod import pod_labels

    config_map = configmap_manifest(shipped, namespace, archive, pod_labels(prepared.spec))
    return summary(archive, f"ConfigMap {namespace}/{shipped.config_map}"), config_map


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
    from controller.jobs.follow import RankFollower  # holds a Cluster
    from controller.jobs.wait import timeout_error

    with Progress(sys.stdout, label=name) as progress:
        follower = RankFollower(
            cluster, namespace, name, rank, progress.feed_lines, say, kind, elastic=elastic
        )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        job = follower.follow(deadline)
    if job is None:
        raise timeout_error(
            "submit", namespace, name, timeout_s, follower.state, follower.waiting()
        )
    return _outcome(cluster, job)


def cmd_wait(args: argparse.Namespace) -> int:
    from controller.jobs.wait import wait_for_job  # holds a Cluster
    from controller.jobs.watches import PodHistory

    snap = find(args)
    seen = PodHistory()
    job = wait_for_job(
        snap.cluster,
        args.name,
        snap.namespace,
        kind=snap.kind,
        timeout_s=args.timeout,
        on_change=_announcer(snap.cluster),
        history=seen,
        say=say,
    )
    return _outcome(snap.cluster, job, seen)


def _outcome(cluster: Cluster, job: dict[str, Any], seen: PodHistory | None = None) -> int:
    """Print how the job ended: 0 Succeeded; Failed raises JobFailed with the story, read from
    a snapshot of the job as it ended."""
    from controller.jobs.snapshot import Snapshot  # holds a Cluster
    from controller.jobs.status import outcome

    print(outcome(Snapshot(cluster, job), seen))
    return 0


def _announcer(cluster: Cluster):
    """``on_change`` for ``wait``: the job's condition, and where it stands in its Kueue queue
    while it waits there (a suspended job in a queue is queued, not failed)."""
    from controller.jobs.queue import QueueNotes  # holds a Cluster

    notes = QueueNotes(cluster)

    def announce(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        line = notes.see(job)
        if line is not None:
            say(f"job {name}: {line}")
        if notes.was_queued:
            return  # "Suspended" says less than the queue line
        cond = job_condition(job)
        msg = condition_message(job, cond)
        say(f"job {name}: {cond}" + (f" ({msg})" if msg else ""))

    return announce


def cmd_delete(args: argparse.Namespace) -> int:
    from controller.jobs.wait import wait_deleted  # holds a Cluster

    snap = find(args)
    cluster, namespace, kind = snap.cluster, snap.namespace, snap.kind
    cluster.delete_job(args.name, namespace, api=kind.api)
    print(f"deleting {kind.name} {namespace}/{args.name}")
    if args.wait:
        wait_deleted(cluster, args.name, namespace, kind=kind, timeout_s=args.timeout)
        print(f"deleted {kind.name} {namespace}/{args.name} and its pods")
    return 0


# --------------------------------------------------------------------------------------------
# Parser


def add_commands(sub: Any) -> None:
    """Register submit, wait, delete and doctor on the CLI's subparsers."""
    p = sub.add_parser(
        "submit",
        help="create the job (PyTorchJob or TrainJob) on the cluster (after a preflight)",
        description="Run the preflight checks (doctor), create the PyTorchJob or TrainJob, "
        "print the kubectl commands to inspect it. Exit 0 Succeeded, 1 Failed.",
    )
    add_spec_argument(p)
    add_target_flags(p, name=False)
    add_workdir_flag(p)
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
    add_target_flags(p)
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 1)")
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("delete", help="delete a job and its pods")
    add_target_flags(p)
    p.add_argument("--wait", action="store_true", help="wait until the job and pods are gone")
    p.add_argument(
        "--timeout", type=float, default=120, metavar="S", help="with --wait (default 120)"
    )
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("doctor", help="check the cluster (and a spec) before submitting")
    add_spec_argument(p, required=False)
    add_target_flags(p, name=False)
    add_workdir_flag(p)
    p.set_defaults(func=cmd_doctor)
