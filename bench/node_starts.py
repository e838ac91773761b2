"""Start the real 2-rank trainer as PyTorchJobs on the local cluster's real node, many times.

Where the SIGABRT at the trainer's exit was seen: in the image, on the kubelet node,
while the suite's own jobs loaded the machine. bench/stress_starts.py reproduces the start
outside the cluster (torchrun, the pods' environment, podman); this one goes through every layer a
user's job does: `submit` renders the quickstart as a Master + Worker PyTorchJob, the training
operator makes the pods, containerd runs the image's `python -m trainer`, gloo rendezvous goes
through the master's Service, checkpoints land on a local PersistentVolume.

Each round is two jobs on the same checkpoint folder: a fresh run of ``--steps`` steps, then a
run that resumes from its last checkpoint and exits at once (the start that aborted most). A
start is *ok* when its job Succeeded with no container restarted; an *abort* when any container
of it ended with 134 (or signal 6, or "terminate called" in its log); anything else is a
*failure*, kept with its pods' ends and log tails. Run it beside the suite's cluster phase to have
the suite's load (docs/benchmarks.md)::

    python bench/node_starts.py --rounds 40 --json node-starts.json

Needs the local cluster (`make cluster-up`, or a running `make test`) with its real node.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localkube.handle import start_or_reuse, temporary_namespace  # noqa: E402

CLAIM, MOUNT = "ckpt", "/ckpt"


def spec(name: str, ns: str, folder: str, steps: int, cpu: str) -> dict:
    s = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    s.update(name=name, namespace=ns, clean_pod_policy="None", restart_policy="Never")
    s["resources"] = {"cpu": cpu, "memory": "1536Mi"}
    s["volumes"] = [{"name": CLAIM, "claim": CLAIM, "mount_path": MOUNT}]
    s["trainer"].update(
        max_steps=steps,
        log_every=1,
        eval_every=0,
        warmup_steps=0,
        resume="auto",
        task_args={"image_size": 16, "noise": 2.0},
        checkpoint={"dir": f"{MOUNT}/{folder}", "every_steps": steps},
    )
    return s


def controller(cluster, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        cwd=REPO,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ends(cluster, ns: str, name: str) -> list[dict]:
    """Every container end of the job's pods: (pod, restarts, exit codes, log tail if bad)."""
    got = cluster.kubectl(
        "get", "pods", "-n", ns, "-l", f"training.kubeflow.org/job-name={name}", "-o", "json"
    )
    out = []
    for pod in json.loads(got.stdout)["items"]:
        pname = pod["metadata"]["name"]
        for st in pod.get("status", {}).get("containerStatuses") or []:
            codes = [
                s["terminated"].get("exitCode")
                for s in (st.get("lastState") or {}, st.get("state") or {})
                if "terminated" in s
            ]
            signals = [
                s["terminated"].get("signal")
                for s in (st.get("lastState") or {}, st.get("state") or {})
                if "terminated" in s
            ]
            row = {"pod": pname, "restarts": st.get("restartCount", 0), "codes": codes}
            if any(c not in (0, None) for c in codes) or st.get("restartCount"):
                log = cluster.kubectl("logs", pname, "-n", ns, "-c", "pytorch", check=False)
                row["tail"] = log.stdout[-1500:] + log.stderr[-300:]
            row["signals"] = [s for s in signals if s]
            out.append(row)
    return out


def verdict(rc: int, rows: list[dict]) -> str:
    aborted = any(
        134 in r["codes"] or 6 in r["signals"] or "terminate called" in r.get("tail", "")
        for r in rows
    )
    if aborted:
        return "abort"
    if rc == 0 and len(rows) == 2 and not any(r["restarts"] for r in rows):
        return "ok"
    return "failure"


def one_job(cluster, ns: str, tmp: Path, name: str, folder: str, args) -> dict:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec(name, ns, folder, args.steps, args.cpu)))
    t0 = time.monotonic()
    sub = controller(cluster, "submit", str(path), timeout=120)
    if sub.returncode != 0:
        return {"job": name, "verdict": "failure", "submit": sub.stderr[-1000:]}
    w = controller(cluster, "wait", name, "-n", ns, "--timeout", str(args.timeout_s), timeout=900)
    rows = ends(cluster, ns, name)
    result = {
        "job": name,
        "wait_rc": w.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "pods": rows,
        "verdict": verdict(w.returncode, rows),
    }
    if result["verdict"] != "ok":
        result["wait"] = (w.stdout + w.stderr)[-1500:]
    else:  # a kept pod per job would fill the node: only bad ones stay to be read
        cluster.kubectl("delete", "pytorchjob", name, "-n", ns, "--wait=false", check=False)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="fresh + resume-and-exit job pairs")
    ap.add_argument("--parallel", type=int, default=1, help="rounds at once (default 1)")
    ap.add_argument("--steps", type=int, default=4, help="max_steps of the fresh run")
    ap.add_argument("--cpu", default="250m", help="each pod's CPU (request = limit)")
    ap.add_argument("--timeout-s", type=int, default=600, help="a job past this is a hang")
    ap.add_argument("--json", type=Path, help="write every start's record here")
    args = ap.parse_args()

    cluster = start_or_reuse()
    counts = {"ok": 0, "abort": 0, "failure": 0}
    records: list[dict] = []
    t0 = time.monotonic()
    try:
        with temporary_namespace(cluster, "starts") as ns:
            cluster.local_volume(ns, CLAIM)
            tmp = Path(f"/tmp/node-starts-{uuid.uuid4().hex[:6]}")
            tmp.mkdir()

            def round_(i: int) -> list[dict]:
                folder = f"r{i:03d}"
                got = []
                for kind in ("fresh", "resume"):
                    rec = one_job(cluster, ns, tmp, f"{folder}-{kind}", folder, args)
                    rec["kind"] = kind
                    got.append(rec)
                    if rec["verdict"] != "ok":
                        break
                return got

            with ThreadPoolExecutor(args.parallel) as pool:
                for got in pool.map(round_, range(args.rounds)):
                    for rec in got:
                        counts[rec["verdict"]] += 1
                        records.append(rec)
                        if rec["verdict"] != "ok":
                            print(json.dumps(rec, indent=1), file=sys.stderr)
                    done = sum(counts.values())
                    print(f"[node-starts] {done} jobs ({2 * done} trainer starts): {counts}")
    finally:
        cluster.control_plane.release()
    summary = {
        "jobs": sum(counts.values()),
        "starts": 2 * sum(counts.values()),
        "counts": counts,
        "seconds": round(time.monotonic() - t0),
        "args": vars(args) | {"json": str(args.json)},
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "jobs": records}, indent=1))
    return 0 if counts["abort"] == 0 and counts["failure"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
