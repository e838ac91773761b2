"""Every rank's log at once: ``python -m controller logs NAME --all -f`` beside the built
``kubectl logs -f -l <the job's pods> --prefix``, side by side in one run on the local cluster.

    python bench/logs_all_bench.py                       # 3 pods x 100,000 lines, 5 rounds
    python bench/logs_all_bench.py --lines 20000 --rounds 3

A 3-node TrainJob on the cluster's real node whose containers each print LINES lines of 70 bytes
and exit (the kubelet serves the logs, as on a cluster); once it is Complete each client follows
every pod's log to its end, with each line after its pod (kubectl: ``[pod/<name>/node] ``,
ddpjob: ``[rank N] ``). Each client's output must hold, per prefix, exactly the lines one pod
printed, in order. Rounds alternate the clients. Per client: median and best wall time, lines
per second from the median, least CPU time (user + system), highest peak RSS (VmHWM); and the
same at a tenth of the lines, so memory that grows with the logs shows.

Targets (exit 1 if missed): ddpjob's lines per second >= 0.8x kubectl's (it reads the pods
one after another where kubectl opens a stream per pod at once; see docs/benchmarks.md), its
peak RSS below kubectl's, and growing by less than 10 MiB from LINES/10 to LINES lines a pod.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.logs_bench import LINE_BYTES, PRINTER, RSS_GROWTH_LIMIT_MIB, measure  # noqa: E402

PODS = 3
SPEED_TARGET = 0.8
KUBECTL, OURS = "kubectl logs -f -l --prefix", "python -m controller logs --all -f"


def job_manifest(name: str, namespace: str, lines: int, image: str) -> dict[str, Any]:
    """The printing TrainJob (the local runtime places it on the real node)."""
    from controller.render.job import render_job
    from controller.spec import validate_spec

    pad = LINE_BYTES - len("line 000000000 ") - 1
    spec = {
        "name": name,
        "namespace": namespace,
        "api": "trainjob",
        "image": image,
        "nodes": PODS,
        "resources": {"cpu": "500m", "memory": "512Mi"},
        "shm_size": "64Mi",  # counts against memory; the default is 1Gi
        "command": ["python", "-c", PRINTER.format(lines=lines, pad=pad)],
        "args": [],
    }
    return render_job(validate_spec(spec))


def expected_digest(lines: int) -> str:
    """The digest of one pod's lines, as the printer prints them."""
    body = "x" * (LINE_BYTES - len("line 000000000 ") - 1)
    digest = hashlib.sha256()
    for i in range(lines):
        digest.update(f"line {i:09d} {body}\n".encode())
    return digest.hexdigest()


def per_prefix_digests(path: Path) -> dict[str, str]:
    """{prefix: digest of its lines without the prefix} of a client's output."""
    digests: dict[str, Any] = {}
    with open(path, "rb") as f:
        for line in f:
            prefix, sep, rest = line.partition(b"] ")
            if not sep:
                raise SystemExit(f"a line without a prefix: {line[:80]!r}")
            digests.setdefault(prefix.decode(), hashlib.sha256()).update(rest)
    return {p: d.hexdigest() for p, d in digests.items()}


def follow_all(
    handle: Any, name: str, namespace: str, lines: int, rounds: int, tmp: Path
) -> dict[str, dict[str, float]]:
    """Each client reads every pod's log of the finished job ``rounds`` times, alternating."""
    from controller import kubeflow

    selector = f"{kubeflow.LABEL_JOBSET_NAME}={name}"
    clients = {
        KUBECTL: [
            str(handle.kubectl_path), "logs", "-f", "-l", selector,
            "-c", kubeflow.TRAINJOB_CONTAINER, "--prefix", "--max-log-requests", str(PODS),
            "--tail", "-1",  # with -l, kubectl shows each pod's last 10 lines unless told
            "-n", namespace,
        ],
        OURS: [sys.executable, "-m", "controller", "logs", name, "--all", "-f", "-n", namespace],
    }  # fmt: skip
    want = expected_digest(lines)
    walls: dict[str, list[float]] = {who: [] for who in clients}
    best: dict[str, dict[str, float]] = {}
    for r in range(rounds):
        order = list(clients)[r % 2 :] + list(clients)[: r % 2]
        for who in order:
            out_path = tmp / "out.txt"
            wall, cpu, rss, count = measure(clients[who], handle.env, REPO, out_path)
            digests = per_prefix_digests(out_path)
            if count != lines * PODS or len(digests) != PODS or set(digests.values()) != {want}:
                raise SystemExit(
                    f"{who}: {count} lines under {len(digests)} prefixes; each of the {PODS} "
                    f"pods printed {lines}, and every pod's must come out whole and in order"
                )
            walls[who].append(wall)
            b = best.setdefault(who, {"wall_s": wall, "cpu_s": cpu, "rss_mib": rss})
            b["wall_s"], b["cpu_s"] = min(b["wall_s"], wall), min(b["cpu_s"], cpu)
            b["rss_mib"] = max(b["rss_mib"], rss)
    for who, b in best.items():
        b["median_s"] = statistics.median(walls[who])
        b["lines_per_s"] = lines * PODS / b["median_s"]
    return best


def run_job(handle: Any, ours: Any, namespace: str, name: str, lines: int) -> None:
    from controller.jobs.read.apis import TRAINJOB_KIND
    from controller.jobs.wait import wait_for_job

    ours.create_job(job_manifest(name, namespace, lines, handle.trainer_image()))
    job = wait_for_job(ours, name, namespace, kind=TRAINJOB_KIND, timeout_s=600)
    if TRAINJOB_KIND.terminal(job) != "Succeeded":
        raise SystemExit(f"{name}: the printing job ended {TRAINJOB_KIND.condition(job)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000, help="lines per pod")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    from controller.kube.client import Cluster
    from localkube.handle import start_or_reuse, temporary_namespace
    from localkube.node import host

    handle = start_or_reuse()
    try:
        host.require()
        ours = Cluster(kubeconfig=str(handle.kubeconfig), notice=lambda s: None)
        results: dict[int, dict[str, dict[str, float]]] = {}
        with (
            temporary_namespace(handle, "bench-all") as namespace,
            tempfile.TemporaryDirectory() as tmp,
        ):
            for lines in (args.lines // 10, args.lines):
                name = f"printers-{lines}-{uuid.uuid4().hex[:4]}"
                run_job(handle, ours, namespace, name, lines)
                results[lines] = follow_all(handle, name, namespace, lines, args.rounds, Path(tmp))
    finally:
        handle.control_plane.release()

    print(
        f"every pod's log of a finished {PODS}-pod TrainJob on the real node, each line after "
        f"its pod ({LINE_BYTES} bytes a line; {args.rounds} rounds: median and best wall, "
        "lines/s of the median, least CPU, highest peak RSS)"
    )
    print(
        f"  {'lines/pod':>9s}  {'client':34s} {'median':>8s} {'best':>7s} {'lines/s':>10s} "
        f"{'CPU':>7s} {'peak RSS':>10s}"
    )
    for lines, rows in results.items():
        for who, r in rows.items():
            print(
                f"  {lines:9d}  {who:34s} {r['median_s']:7.2f}s {r['wall_s']:6.2f}s "
                f"{r['lines_per_s']:10.0f} {r['cpu_s']:6.2f}s {r['rss_mib']:8.1f}MiB"
            )
    big = results[args.lines]
    speed = big[OURS]["lines_per_s"] / big[KUBECTL]["lines_per_s"]
    rss_ratio = big[OURS]["rss_mib"] / big[KUBECTL]["rss_mib"]
    growth = big[OURS]["rss_mib"] - results[args.lines // 10][OURS]["rss_mib"]
    print(
        f"  ddpjob / kubectl at {args.lines} lines a pod: lines/s x{speed:.2f} "
        f"(target >= {SPEED_TARGET}), peak RSS x{rss_ratio:.2f} (target < 1)"
    )
    print(
        f"  ddpjob peak RSS from {args.lines // 10} to {args.lines} lines a pod: {growth:+.1f} MiB "
        f"(target < {RSS_GROWTH_LIMIT_MIB:g})"
    )
    ok = speed >= SPEED_TARGET and rss_ratio < 1 and growth < RSS_GROWTH_LIMIT_MIB
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
