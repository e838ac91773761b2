"""Following a long rank-0 log: ``python -m controller logs -f`` beside the built ``kubectl logs
-f``, side by side in one run on the local cluster (localkube).

    python bench/logs_bench.py                 # reuses a live `make cluster-up`, else starts one
    python bench/logs_bench.py --lines 300000 --rounds 5

A one-node job whose container prints LINES lines of 70 bytes and exits, on the cluster's real
node (a real kubelet serves the log, as on a cluster); once it has Succeeded
each client follows the finished pod's log to its end (``kubectl logs -f <job>-master-0``, and
``python -m controller logs -f <job>``, which finds rank 0's pod and reads its log once).
Both write to a file and must print the same text, every line. Rounds alternate the clients so
background load hits both alike. Per client: the median and the best wall time, lines per second
from the median (the log's server, kubelet and API server, sets the pace of both clients and
swings between runs on a shared 2-core machine, so a single lucky round says little), the least
CPU time (user + system, from ``wait4``) and the highest peak RSS (the process's own VmHWM). The
same is measured at a tenth of the lines, so a client whose memory grows with the log shows it.

Targets (exit 1 if missed): ddpjob's lines per second >= kubectl's (ratio >= 1.0), and its peak
RSS grows by less than 10 MiB from LINES/10 to LINES lines.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LINE_BYTES = 70  # with the newline: 300,000 lines = 21 MB, the size in the issue
RSS_GROWTH_LIMIT_MIB = 10.0

PRINTER = """
import sys
out = sys.stdout.buffer
body = b"x" * {pad}
for i in range({lines}):
    out.write(b"line %09d " % i + body + b"\\n")
out.flush()
"""


def job_manifest(name: str, namespace: str, lines: int, image: str) -> dict[str, Any]:
    """The printing job (it lands on the real node, like every pod)."""
    from controller.render.pytorchjob import render_pytorchjob
    from controller.spec import validate_spec

    pad = LINE_BYTES - len("line 000000000 ") - 1
    spec = {
        "name": name,
        "namespace": namespace,
        "image": image,
        "nodes": 1,
        "resources": {"cpu": "1", "memory": "1Gi"},
        "command": ["python3", "-c", PRINTER.format(lines=lines, pad=pad)],
        "args": [],
    }
    return render_pytorchjob(validate_spec(spec))


def _peak_rss_mib(pid: int, stop: threading.Event, out: list[float]) -> None:
    """Poll the process's VmHWM (its own peak RSS since exec) until it exits. wait4's
    ru_maxrss would also count the bench's pages the child shared between fork and exec."""
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out[0] = max(out[0], int(line.split()[1]) / 1024)
        except (OSError, ValueError):
            pass
        stop.wait(0.01)


def measure(
    argv: list[str], env: dict[str, str], cwd: Path, out_path: Path
) -> tuple[float, float, float, int]:
    """Run ``argv`` with stdout to ``out_path``: (wall s, CPU s, peak RSS MiB, lines written)."""
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.PIPE)
        stop, peak = threading.Event(), [0.0]
        poller = threading.Thread(target=_peak_rss_mib, args=(proc.pid, stop, peak))
        poller.start()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}: {err[-2000:]}")
    with open(out_path, "rb") as f:
        count = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return wall, usage.ru_utime + usage.ru_stime, peak[0], count


KUBECTL, OURS, BASELINE = "kubectl logs -f", "python -m controller logs -f", "baseline logs -f"


def follow_all(
    handle: Any,
    name: str,
    namespace: str,
    lines: int,
    rounds: int,
    tmp: Path,
    baseline: Path | None,
) -> dict[str, dict[str, float]]:
    """Each client follows the finished job's log ``rounds`` times, in rotating order."""
    ours = [sys.executable, "-m", "controller", "logs", "-f", name, "-n", namespace]
    kubectl = [str(handle.kubectl_path), "logs", "-f", f"{name}-master-0", "-c", "pytorch"]
    clients: dict[str, tuple[list[str], Path]] = {
        KUBECTL: ([*kubectl, "-n", namespace], REPO),
        OURS: (ours, REPO),
    }
    if baseline is not None:  # another checkout's controller, e.g. before a change
        clients[BASELINE] = (ours, baseline)
    walls: dict[str, list[float]] = {who: [] for who in clients}
    best: dict[str, dict[str, float]] = {}
    for r in range(rounds):
        order = list(clients)[r % len(clients) :] + list(clients)[: r % len(clients)]
        texts = set()
        for who in order:
            argv, cwd = clients[who]
            env = {**handle.env, "PYTHONPATH": str(cwd)}
            out_path = tmp / "out.txt"
            wall, cpu, rss, count = measure(argv, env, cwd, out_path)
            if count != lines:
                raise SystemExit(f"{who}: wrote {count} lines, the pod printed {lines}")
            texts.add(hashlib.sha256(out_path.read_bytes()).hexdigest())
            walls[who].append(wall)
            b = best.setdefault(who, {"wall_s": wall, "cpu_s": cpu, "rss_mib": rss})
            b["wall_s"], b["cpu_s"] = min(b["wall_s"], wall), min(b["cpu_s"], cpu)
            b["rss_mib"] = max(b["rss_mib"], rss)
        if len(texts) != 1:
            raise SystemExit(f"round {r}: the clients printed different text")
    for who, b in best.items():
        b["median_s"] = statistics.median(walls[who])
        b["lines_per_s"] = lines / b["median_s"]
    return best


def run_job(handle: Any, ours: Any, namespace: str, name: str, lines: int) -> str:
    """Run the printing job to Succeeded; the name of the node its pod ran on."""
    from controller.jobs.wait import wait_for_job

    ours.create_job(job_manifest(name, namespace, lines, handle.trainer_image()))
    job = wait_for_job(ours, name, namespace, timeout_s=300)
    cond = job["status"]["conditions"][-1]["type"]
    if cond != "Succeeded":
        raise SystemExit(f"{name}: the printing job ended {cond}")
    pod = ours.get_pod(f"{name}-master-0", namespace)
    return pod["spec"].get("nodeName", "?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also measure the controller of another checkout (e.g. `git archive` of a base)",
    )
    args = parser.parse_args(argv)

    from kubernetes import client

    from controller.kube.client import Cluster
    from localkube.handle import start_or_reuse, wait_until

    handle = start_or_reuse()
    core = client.CoreV1Api(handle.api_client())
    namespace = f"bench-logs-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(
        "service account",
        lambda: any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(namespace).items
        ),
        30,
    )
    ours = Cluster(kubeconfig=str(handle.kubeconfig), notice=lambda s: None)
    results: dict[int, dict[str, dict[str, float]]] = {}
    where = "?"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for lines in (args.lines // 10, args.lines):
                name = f"printer-{lines}"
                where = run_job(handle, ours, namespace, name, lines)
                results[lines] = follow_all(
                    handle, name, namespace, lines, args.rounds, Path(tmp), args.baseline
                )
    finally:
        core.delete_namespace(namespace)
        handle.control_plane.release()

    ours_name, theirs = OURS, KUBECTL
    print(f"follow a finished pod's log to its end, on node {where} ", end="")
    print(f"({LINE_BYTES} bytes a line; {args.rounds} rounds: median and best wall, ", end="")
    print("lines/s of the median, least CPU, highest peak RSS)")
    print(
        f"  {'lines':>8s}  {'client':30s} {'median':>8s} {'best':>7s} {'lines/s':>10s} "
        f"{'CPU':>7s} {'peak RSS':>10s}"
    )
    for lines, rows in results.items():
        for who, r in rows.items():
            print(
                f"  {lines:8d}  {who:30s} {r['median_s']:7.2f}s {r['wall_s']:6.2f}s "
                f"{r['lines_per_s']:10.0f} {r['cpu_s']:6.2f}s {r['rss_mib']:8.1f}MiB"
            )
    big = results[args.lines]
    speed = big[ours_name]["lines_per_s"] / big[theirs]["lines_per_s"]
    rss_ratio = big[ours_name]["rss_mib"] / big[theirs]["rss_mib"]
    growth = big[ours_name]["rss_mib"] - results[args.lines // 10][ours_name]["rss_mib"]
    print(
        f"  ddpjob / kubectl at {args.lines} lines: lines/s x{speed:.2f}, peak RSS x{rss_ratio:.2f}"
    )
    if BASELINE in big:
        before = big[BASELINE]
        print(
            f"  baseline / kubectl at {args.lines} lines: lines/s "
            f"x{before['lines_per_s'] / big[theirs]['lines_per_s']:.2f}, peak RSS "
            f"x{before['rss_mib'] / big[theirs]['rss_mib']:.2f}"
        )
    print(
        f"  ddpjob peak RSS from {args.lines // 10} to {args.lines} lines: {growth:+.1f} MiB "
        f"(target < {RSS_GROWTH_LIMIT_MIB:g})"
    )
    ok = speed >= 1.0 and growth < RSS_GROWTH_LIMIT_MIB
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
