"""Workdir bench: from an edited script to the job's first training line, shipping the folder
with the job (the workdir) against an image of one's own, on the local cluster's real node.

    python bench/workdir_bench.py                        # 3 rounds of each road, the archive sizes
    python bench/workdir_bench.py --rounds 1 --json workdir.json

The project is a task plug-in package (``mypkg``) that wraps the quickstart's vision task and
prints a marker. Each round edits the marker, then takes one road to a 2-pod PyTorchJob of the
quickstart's size (1 CPU, 2Gi per pod, the vision task at 32 px) and waits for rank 0's first
``train`` event, which must come with the edited marker:

- **workdir**: ``submit --workdir project`` of the stock trainer image: the CLI packs the folder,
  creates the job and its ConfigMap; each pod's container unpacks the archive, then execs the
  trainer;
- **image**: a one-layer image ``FROM`` the trainer image with the project ``COPY``'d in
  (``podman build``), ``python -m localkube load`` into the node, then ``submit --set
  image=...``: the road a user takes today, with a registry as instant as a local one can be.

The roads alternate, round after round, in one run on one machine. Where the time goes (host
clock for the client's steps, the node's CRI time stamps for the pods' lines): the client's
part (pack and submit; build, load and submit), the submit to the container's unpack line (the
workdir road) and to the trainer's first line, and the trainer's start-up to its first step.
Then the archive's own cost at 1, 10 and 100 MB of project (half random bytes, half text):
pack, the upload to the local cluster's S3 server, the fetch and the unpack, with the same code
the pods run (``trainer.workdir``), and at 1 MB the ConfigMap.

Targets: the workdir road no slower than the image road (median ratio <= 1.0) and under 30 s
to the first line (median). Exit status 1 if either is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.recovery_bench import stamped_lines  # noqa: E402

TARGET_S, TARGET_RATIO = 30.0, 1.0
SIZES_MB = (1, 10, 100)
JOB = "wdbench"

TASK = '''\
"""The bench's project: the quickstart's vision task, and a marker each edit changes."""

from trainer.tasks import vision

MARK = "{mark}"


def build(**task_args):
    print(f"mark {{MARK}}", flush=True)
    return vision.build(**task_args)
'''


def write_project(root: Path, mark: str) -> None:
    (root / "mypkg").mkdir(parents=True, exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "tasks.py").write_text(TASK.format(mark=mark))


def write_spec(path: Path, namespace: str, image: str) -> None:
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec |= {"name": JOB, "namespace": namespace, "image": image}
    trainer = spec["trainer"]
    trainer.update(task="mypkg.tasks:build", max_steps=5, warmup_steps=0, log_every=1, eval_every=0)
    trainer["checkpoint"] = {"dir": "/tmp/checkpoints", "every_steps": 0}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


class Node:
    """The job's pods and their lines on the node, read from the API and the kept CRI logs."""

    def __init__(self, handle: Any, namespace: str) -> None:
        self.handle, self.namespace = handle, namespace

    def master(self) -> dict[str, Any] | None:
        resp = self.handle.core_api().list_namespaced_pod(
            self.namespace,
            label_selector=f"training.kubeflow.org/job-name={JOB},"
            "training.kubeflow.org/replica-type=master",
            _preload_content=False,
        )
        items = json.loads(resp.data)["items"]
        return items[0] if items else None

    def lines(self, container: str) -> list[tuple[float, str]]:
        """This round's master pod's lines (the kept logs hold every earlier round's too,
        under the same pod name and another uid)."""
        pod = self.master()
        if pod is None:
            return []
        uid = pod["metadata"]["uid"]
        files = self.handle.log_keeper.files(self.namespace, f"{JOB}-master-0", (container,))
        return stamped_lines([f for f in files if f.parent.parent.name.endswith(uid)])

    def first_train(self, mark: str, timeout_s: float = 300) -> dict[str, float]:
        """When rank 0's trainer printed its first line, the marker and its first train event
        (node time); raises if the marker is not this round's."""
        from trainer.contract import TRAIN, parse_event

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.lines("pytorch")
            marks = [line for _, line in lines if line.startswith("mark ")]
            trains = [t for t, line in lines if (parse_event(line) or {}).get("event") == TRAIN]
            if trains:
                if marks != [f"mark {mark}"]:
                    raise SystemExit(f"workdir bench: rank 0 ran {marks}, not mark {mark}")
                # The container's own command unpacks the workdir first and says so.
                unpacked = [t for t, line in lines if line.startswith("workdir:")]
                trainer = [t for t, line in lines if not line.startswith("workdir:")]
                out = {"first_line": trainer[0], "first_train": trains[0]}
                if unpacked:
                    out["unpacked"] = unpacked[0]
                return out
            time.sleep(0.2)
        raise SystemExit(f"workdir bench: no train event within {timeout_s:.0f} s")

    def delete(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "controller", "delete", JOB, "-n", self.namespace, "--wait"],
            env=self.handle.env, cwd=REPO, capture_output=True, check=True, timeout=300,
        )  # fmt: skip


def cli(handle: Any, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller", *args],
        env=handle.env, cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"workdir bench: controller {' '.join(args[:2])} failed:\n{proc.stderr}")


def round_workdir(handle: Any, node: Node, spec: Path, project: Path, mark: str) -> dict:
    write_project(project, mark)
    t0 = time.time()
    cli(handle, "submit", str(spec), "--workdir", str(project), "--no-preflight")
    submitted = time.time()
    seen = node.first_train(mark)
    return {
        "road": "workdir",
        "client_s": submitted - t0,
        "to_unpacked_s": seen["unpacked"] - submitted,
        "to_trainer_line_s": seen["first_line"] - submitted,
        "trainer_s": seen["first_train"] - seen["first_line"],
        "total_s": seen["first_train"] - t0,
    }


def round_image(
    handle: Any, node: Node, spec: Path, project: Path, base: str, mark: str, n: int
) -> dict:
    from tools.podman import podman_env

    write_project(project, mark)
    ref = f"localhost/ddpjob-workdir-bench:{n}"
    containerfile = project.parent / "Containerfile"
    containerfile.write_text(f"FROM {base}\nCOPY --chown=1000:1000 project/ /workspace/\n")
    t0 = time.time()
    subprocess.run(
        ["podman", "build", "-q", "-t", ref, "-f", str(containerfile), str(project.parent)],
        env=podman_env(), capture_output=True, check=True,
    )  # fmt: skip
    built = time.time()
    subprocess.run(
        [sys.executable, "-m", "localkube", "load", ref],
        cwd=REPO, capture_output=True, check=True, timeout=300,
    )  # fmt: skip
    loaded = time.time()
    cli(handle, "submit", str(spec), "--set", f"image={ref}", "--no-preflight")
    submitted = time.time()
    seen = node.first_train(mark)
    return {
        "road": "image",
        "build_s": built - t0,
        "load_s": loaded - built,
        "client_s": submitted - t0,
        "to_trainer_line_s": seen["first_line"] - submitted,
        "trainer_s": seen["first_train"] - seen["first_line"],
        "total_s": seen["first_train"] - t0,
    }


# ---------------------------------------------------------------------------------------------
# The archive's cost


def make_folder(root: Path, size_mb: int) -> None:
    """``size_mb`` MB in 1 MB files: half random bytes, half text."""
    root.mkdir(parents=True)
    text = ("def f(x):\n    return x * 2  # a line of code\n" * 40000).encode()
    for i in range(size_mb):
        body = os.urandom(500_000) + text[:500_000]
        (root / f"part{i:03d}.bin").write_bytes(body)


def archive_cost(handle: Any, namespace: str, tmp: Path) -> list[dict]:
    from controller.workdir import configmap_manifest, pack, shipped_for
    from localkube.addons import s3
    from trainer import workdir as pod

    creds = s3.credentials(handle.control_plane.state_dir)
    os.environ.update(creds)
    os.environ["AWS_ENDPOINT_URL"] = s3.HOST_ENDPOINT
    os.environ["AWS_REGION"] = s3.REGION
    store = f"s3://{s3.BUCKET}/workdir-bench-{uuid.uuid4().hex[:6]}"
    out = []
    for size in SIZES_MB:
        folder = tmp / f"size{size}"
        make_folder(folder, size)
        t0 = time.perf_counter()
        archive = pack(folder)
        packed = time.perf_counter()
        url, uploaded = pod.upload(archive.path, store, archive.digest)
        up = time.perf_counter()
        data = pod.fetch(url)
        fetched = time.perf_counter()
        pod.install(data, archive.digest, tmp / f"into{size}")
        unpacked = time.perf_counter()
        row = {
            "size_mb": size,
            "archive_bytes": archive.size_bytes,
            "pack_s": packed - t0,
            "upload_s": up - packed,
            "fetch_s": fetched - up,
            "unpack_s": unpacked - fetched,
        }
        assert uploaded
        if size == 1:
            from controller.kube.client import Cluster

            cluster = Cluster(kubeconfig=str(handle.kubeconfig), notice=lambda s: None)
            shipped = shipped_for("wdcost", None, archive)
            t1 = time.perf_counter()
            cluster.create_beside(configmap_manifest(shipped, namespace, archive, {}), None)
            row["configmap_create_s"] = time.perf_counter() - t1
        archive.remove()
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------


def report(rounds: list[dict], costs: list[dict]) -> dict[str, Any]:
    def med(road: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds if r["road"] == road)

    print("road     client_s  to_unpacked  to_trainer_line  trainer_s  total_s")
    for r in rounds:
        print(
            f"{r['road']:8} {r['client_s']:8.1f}  {r.get('to_unpacked_s', float('nan')):11.1f}  "
            f"{r['to_trainer_line_s']:15.1f}  {r['trainer_s']:9.1f}  {r['total_s']:7.1f}"
        )
    images = [r for r in rounds if r["road"] == "image"]
    print(
        f"image road: build {statistics.median(r['build_s'] for r in images):.1f} s, "
        f"load {statistics.median(r['load_s'] for r in images):.1f} s (medians)"
    )
    workdir, image = med("workdir", "total_s"), med("image", "total_s")
    ratio = workdir / image
    print(
        f"to the first training line (median): workdir {workdir:.1f} s, image {image:.1f} s, "
        f"ratio workdir/image {ratio:.2f} (target <= {TARGET_RATIO}; workdir < {TARGET_S:.0f} s)"
    )
    print("size_mb  archive  pack_s  upload_s  fetch_s  unpack_s  configmap_s")
    for c in costs:
        print(
            f"{c['size_mb']:7}  {c['archive_bytes'] / 1e6:6.1f}M  {c['pack_s']:6.2f}  "
            f"{c['upload_s']:8.2f}  {c['fetch_s']:7.2f}  {c['unpack_s']:8.2f}  "
            f"{c.get('configmap_create_s', float('nan')):11.2f}"
        )
    return {"rounds": rounds, "costs": costs, "median_workdir_s": workdir,
            "median_image_s": image, "ratio": ratio}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each road")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    from localkube.handle import start_or_reuse, temporary_namespace

    handle = start_or_reuse()
    try:
        base = handle.trainer_image()
        with (
            temporary_namespace(handle, "wdbench") as namespace,
            tempfile.TemporaryDirectory(prefix="ddpjob-wdbench-") as tmp,
        ):
            node = Node(handle, namespace)
            spec = Path(tmp) / "spec.yaml"
            write_spec(spec, namespace, base)
            project = Path(tmp) / "project"
            rounds = []
            for n in range(args.rounds):
                for road in ("workdir", "image"):
                    mark = f"{road}-{n}-{uuid.uuid4().hex[:6]}"
                    if road == "workdir":
                        rounds.append(round_workdir(handle, node, spec, project, mark))
                    else:
                        rounds.append(round_image(handle, node, spec, project, base, mark, n))
                    node.delete()
            costs = archive_cost(handle, namespace, Path(tmp))
    finally:
        handle.control_plane.release()
        refs = [f"localhost/ddpjob-workdir-bench:{n}" for n in range(args.rounds)]
        subprocess.run(["podman", "rmi", "--ignore", *refs], capture_output=True, check=False)
    out = report(rounds, costs)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    ok = out["ratio"] <= TARGET_RATIO and out["median_workdir_s"] < TARGET_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
