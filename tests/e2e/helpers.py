"""Helpers for the end-to-end tests: specs, the CLI as a subprocess, rank 0's progress, and
restarting the API server. Pods run in containers of this checkout's image on the real node;
their processes and log files (the ground truth a followed log is compared with) are the local
cluster's: ``localkube.handle.Cluster``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from trainer.contract import is_event, parse_event

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
PY = sys.executable


#: The claim the specs of :func:`write_spec` keep their checkpoints on: a ``local``
#: PersistentVolume on the node (``cluster.local_volume``), made on first use in a namespace, so
#: a retried or re-created pod resumes from what the one before wrote.
CLAIM = "ckpt"
#: Where :func:`write_spec`'s pods mount it.
MOUNT = "/ckpt"


def ensure_claim(cluster, namespace: str) -> Path:
    """The claim :data:`CLAIM` in ``namespace`` (made once); the host folder behind it."""
    from localkube.node import volumes

    if cluster.get_json("pvc", CLAIM, "-n", namespace, missing_ok=True) is None:
        cluster.local_volume(namespace, CLAIM)
    return volumes.host_path(namespace, CLAIM)


def write_spec(
    cluster,
    tmp_path: Path,
    name: str,
    namespace: str,
    *,
    max_steps: int = 40,
    every_steps: int = 10,
    log_every: int = 5,
    **fields: Any,
) -> Path:
    """The quickstart spec, small, as the e2e jobs run on the real node (where every pod runs):
    the image under the name the examples use (the cluster holds this checkout's trainer image
    under it), a quarter CPU per pod (eight fit the node's two CPUs, so three tests at once do
    not leave a job half-scheduled), few steps, checkpoints on the claim :data:`CLAIM` at
    ``/ckpt/<name>`` with resume=auto, so a retried pod continues. ``fields`` override the
    spec's keys (``trainer`` is merged)."""
    cluster.trainer_image()  # built, imported and named as the examples name it
    ensure_claim(cluster, namespace)
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec["name"], spec["namespace"] = name, namespace
    spec["resources"] = {"cpu": "250m", "memory": "1536Mi"}
    spec["volumes"] = [{"name": "ckpt", "claim": CLAIM, "mount_path": MOUNT}]
    trainer = spec["trainer"]
    trainer.update(
        max_steps=max_steps, log_every=log_every, eval_every=0, resume="auto", warmup_steps=0
    )
    trainer["task_args"] = {"image_size": 16, "noise": 2.0}
    trainer["checkpoint"] = {"dir": f"{MOUNT}/{name}", "every_steps": every_steps}
    for key, value in fields.items():
        if key == "trainer":
            trainer.update(value)
        else:
            spec[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def plugin_on_claim(cluster, namespace: str, module: Path) -> dict[str, str]:
    """Put a task plug-in (a Python file) on the namespace's claim, as a user mounts code into
    the image; the ``env`` that makes it importable in :func:`write_spec`'s pods."""
    folder = ensure_claim(cluster, namespace) / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / module.name).write_text(module.read_text())
    for path in (folder, folder / module.name):
        os.chown(path, 1000, 1000)
    return {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{MOUNT}/plugins"}


def paced(cluster, namespace: str, step_s: float) -> dict[str, Any]:
    """:func:`write_spec` fields for the tests' tiny task (tests/trainer/tasks.py, put on the
    claim) sleeping ``step_s`` each step: a job that lasts at least ``max_steps * step_s``
    seconds on any machine, for tests that need it still running after some event (a kill, a
    preemption, an exec). The quickstart's pace is the machine's: the node does not throttle a
    pod to its CPU limit, so an idle machine runs it several times faster than a busy one."""
    env = plugin_on_claim(cluster, namespace, REPO / "tests" / "trainer" / "tasks.py")
    trainer = {"task": "tasks:build", "task_args": {"sleep_s": step_s}, "batch_size": 16}
    return {"env": env, "trainer": trainer}


def paced_spec(
    cluster, tmp_path: Path, name: str, namespace: str, *, max_steps: int, step_s: float, **fields
) -> Path:
    """:func:`write_spec` of a job paced by :func:`paced`."""
    return write_spec(
        cluster,
        tmp_path,
        name,
        namespace,
        max_steps=max_steps,
        **paced(cluster, namespace, step_s),
        **fields,
    )


def s3_checkpoints(
    cluster,
    namespace: str,
    name: str,
    fields: dict[str, Any],
    *,
    every_steps: int = 10,
    secret_key: str | None = None,
) -> dict[str, Any]:
    """:func:`write_spec` ``fields`` that checkpoint to the local cluster's S3 server at
    ``s3://ddpjob/<namespace>/<name>`` instead of the claim: the endpoint in ``env``, the
    credentials from a copy of its Secret in ``namespace`` (``secret_key``: a wrong secret key
    instead of the server's). The claim stays, read-only, for a task plug-in's code alone."""
    import base64

    from localkube.addons import s3

    secret = "s3-wrong" if secret_key is not None else s3.SECRET
    if cluster.get_json("secret", secret, "-n", namespace, missing_ok=True) is None:
        data = cluster.get_json("secret", s3.SECRET, "-n", s3.SECRET_NAMESPACE)["data"]
        creds = {k: base64.b64decode(v).decode() for k, v in data.items()}
        if secret_key is not None:
            creds["AWS_SECRET_ACCESS_KEY"] = secret_key
        literals = [f"--from-literal={k}={v}" for k, v in creds.items()]
        cluster.kubectl("create", "secret", "generic", secret, "-n", namespace, *literals)
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    trainer = dict(fields.get("trainer", {}))
    trainer["checkpoint"] = {"dir": s3_url(namespace, name), "every_steps": every_steps}
    return {
        **fields,
        "env": {**fields.get("env", {}), "AWS_ENDPOINT_URL": s3.ENDPOINT, "AWS_REGION": s3.REGION},
        "secret_env": {k: {"secret": secret, "key": k} for k in keys},
        "volumes": [{"name": "ckpt", "claim": CLAIM, "mount_path": MOUNT, "read_only": True}],
        "trainer": trainer,
    }


def s3_url(namespace: str, name: str) -> str:
    """Where :func:`s3_checkpoints` puts a job's checkpoints."""
    from localkube.addons import s3

    return f"s3://{s3.BUCKET}/{namespace}/{name}"


def s3_objects(cluster, namespace: str, name: str) -> list[str]:
    """The keys under ``s3://ddpjob/<namespace>/<name>/``, read from the server's posix root
    on the host (one file per object), relative to that prefix."""
    from localkube.addons import s3

    root = s3.data_dir(cluster.control_plane.state_dir) / "root" / s3.BUCKET / namespace / name
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def ddpjob(cluster, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m controller ARGS`` against the cluster; never raises on exit code."""
    return subprocess.run(
        [PY, "-m", "controller", *args],
        env=cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: ``--debug``'s last line: ``debug: N API requests (kinds); N re-lists after 410 Gone; ...``.
DEBUG = re.compile(
    r"^debug: (\d+) API requests? \(([^)]*)\); (\d+) re-lists? after 410 Gone; "
    r"\d+ refused by RBAC$",
    re.MULTILINE,
)
#: ``--debug``'s line for each path asked: ``debug:   get /api/v1/namespaces/n/pods (1)``.
DEBUG_READ = re.compile(r"^debug:   (\w+) (\S+) \((\d+)\)$", re.MULTILINE)


def debug_requests(stderr: str) -> tuple[int, str, int]:
    """(requests, their kinds, re-lists) from ``--debug``'s last line."""
    m = DEBUG.search(stderr)
    assert m, f"no request count in: {stderr[-1000:]}"
    return int(m[1]), m[2], int(m[3])


def debug_reads(stderr: str) -> dict[tuple[str, str], int]:
    """(kind, path) -> how often, from ``--debug``'s lines of what the command asked."""
    return {(kind, path): int(n) for kind, path, n in DEBUG_READ.findall(stderr)}


KUEUE_V1BETA2 = "kueue.x-k8s.io/v1beta2"


#: The pods' identity that lets the trainer record a bad node on its job (k8s/rbac.yaml).
TRAINER_ACCOUNT = "ddpjob-trainer"


def trainer_account(cluster, namespace: str) -> str:
    """k8s/rbac.yaml's ServiceAccount, Role and RoleBinding for the pods, as shipped, in
    ``namespace``; the account's name (a spec's ``service_account``)."""
    shipped = yaml.safe_load_all((REPO / "k8s" / "rbac.yaml").read_text())
    objects = [o for o in shipped if o["metadata"]["name"] == TRAINER_ACCOUNT]
    for o in objects:
        o["metadata"]["namespace"] = namespace
        for subject in o.get("subjects", []):
            subject["namespace"] = namespace
    assert {o["kind"] for o in objects} == {"ServiceAccount", "Role", "RoleBinding"}, objects
    apply_objects(cluster, *objects)
    return TRAINER_ACCOUNT


def project(tmp_path: Path, *modules: Path) -> str:
    """A user's project folder beside the specs :func:`write_spec` writes, holding ``modules``:
    the spec's ``workdir`` (relative to the spec's folder)."""
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    for module in modules:
        (folder / module.name).write_text(module.read_text())
    return folder.name


def apply_objects(cluster, *objects: dict) -> None:
    """``kubectl apply`` of ``objects``, as one List."""
    cluster.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                   "items": list(objects)})
    )  # fmt: skip


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict:
    """A Kueue LocalQueue ``namespace/name`` feeding ``cluster_queue``."""
    return {
        "apiVersion": KUEUE_V1BETA2,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


class Background:
    """``python -m controller ARGS`` running in the background, output to files."""

    def __init__(self, cluster, tmp_path: Path, tag: str, *args: str):
        self.out_path = tmp_path / f"{tag}.out"
        self.err_path = tmp_path / f"{tag}.err"
        self._out = open(self.out_path, "w")  # noqa: SIM115 - closed in result()
        self._err = open(self.err_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [PY, "-m", "controller", *args],
            env=cluster.env,
            cwd=REPO,
            stdout=self._out,
            stderr=self._err,
            text=True,
        )

    def result(self, timeout: float = 180) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"{self.proc.args} did not finish in {timeout}s; stderr: "
                f"{self.err_path.read_text()[-2000:]}"
            ) from None
        finally:
            self._out.close()
            self._err.close()
        return code, self.out_path.read_text(), self.err_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()
        self._err.close()


def where_things_stand(cluster, namespace: str) -> str:
    """The namespace's pods with each container's state, and its jobs' conditions: what a test
    that timed out waiting on a job adds to its failure, so the next look starts from there."""
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    lines = [
        f"pod {p['metadata']['name']}: {p['status'].get('phase')}, containers "
        f"{json.dumps([c.get('state') for c in p['status'].get('containerStatuses', [])])}"
        for p in pods
    ]
    for kind in ("pytorchjobs", "trainjobs"):
        for job in cluster.get_json(kind, "-n", namespace)["items"]:
            conditions = [
                (c["type"], c["status"], c.get("reason"))
                for c in job.get("status", {}).get("conditions", [])
            ]
            lines.append(f"{kind[:-1]} {job['metadata']['name']}: {conditions}")
    return "\n".join(lines)


def latest_step(cluster, name: str, namespace: str, pod: str | None = None) -> int:
    """The last step rank 0 reported (its `train` events), 0 while its pod does not exist or its
    container has not started. Any other API failure raises: a check like ``< max_steps`` must
    not pass because the question could not be asked."""
    from kubernetes.client.exceptions import ApiException

    try:
        text = cluster.core_api().read_namespaced_pod_log(
            pod or f"{name}-master-0", namespace, container="pytorch", tail_lines=50
        )
    except ApiException as e:
        if e.status in (400, 404):  # container not started / pod not created yet
            return 0
        raise
    step = 0
    for line in text.splitlines():
        if is_event(line, "train"):
            step = parse_event(line)["step"]
    return step


def restart_apiserver(cluster, down_s: float = 2.0, while_down=None) -> float:
    """Stop kube-apiserver, keep it down ``down_s`` seconds, start it again (the local cluster
    records the new pid, so `make cluster-down` still stops it). ``while_down()``, if given, runs
    once the server has stopped answering, before it starts again.

    Returns the longest time a client probing ``/version`` every 0.1 s got no answer: measured
    from outside, so a restart that did not really stop the server returns about 0."""
    import threading

    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    configuration.retries = False  # one try per probe: an outage is what is being measured
    api = client.VersionApi(client.ApiClient(configuration))
    stop = threading.Event()
    longest = [0.0]
    called: list[BaseException | None] = []

    def probe() -> None:
        failing_since = None
        while not stop.is_set():
            t = time.monotonic()
            try:
                api.get_code(_request_timeout=0.5)
                if failing_since is not None:
                    longest[0] = max(longest[0], t - failing_since)
                failing_since = None
            except Exception:  # refused, reset, timed out: unavailable
                if failing_since is None:
                    failing_since = t
                if while_down is not None and not called:
                    try:
                        while_down()
                        called.append(None)
                    except BaseException as e:  # re-raised in the test's thread
                        called.append(e)
            stop.wait(0.1)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        cluster.control_plane.restart_component("kube-apiserver", down_s=down_s)
        time.sleep(0.3)  # one more probe sees it answer
    finally:
        stop.set()
        thread.join(5)
    if while_down is not None:
        assert called, "the API server never stopped answering: while_down did not run"
        if called[0] is not None:
            raise called[0]
    from localkube.handle import wait_until
    from localkube.node import kubelet

    # The node's next heartbeat after the outage: the tests after this one submit to it.
    wait_until("the node Ready and untainted", lambda: kubelet.node_ready(cluster), 90)
    return longest[0]


def etcd_move_on_and_compact(cluster) -> int:
    """Write a key straight into etcd, so its revision passes every resourceVersion the API
    server has handed out, and compact etcd's history up to there (etcd's v3 JSON API). A watch
    resumed from an older resourceVersion then gets 410 Gone. Returns the compacted revision."""
    import base64
    import urllib.request

    port = cluster.control_plane.read_state()["ports"]["etcd"]

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    key = base64.b64encode(b"/ddpjob-test/compaction").decode()
    put = call("kv/put", {"key": key, "value": base64.b64encode(b"x").decode()})
    revision = int(put["header"]["revision"])
    call("kv/compaction", {"revision": revision, "physical": True})
    return revision


def etcd_compacted(cluster, revision: int) -> bool:
    """True when etcd refuses to read at ``revision``: its history there was compacted."""
    import base64
    import urllib.error
    import urllib.request

    port = cluster.control_plane.read_state()["ports"]["etcd"]
    body = {"key": base64.b64encode(b"/ddpjob-test/compaction").decode(), "revision": revision}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/kv/range",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10):
            return False
    except urllib.error.HTTPError as e:
        return "compacted" in e.read().decode(errors="replace")


def events(text: str, name: str) -> list[dict]:
    """The trainer's JSON events called ``name`` in a log's text."""
    out = []
    for line in text.splitlines():
        if is_event(line, name):
            out.append(parse_event(line))
    return out


def last_step(text: str) -> int:
    """The last step of the `train` events in a log's text (0 before the first)."""
    return max([e["step"] for e in events(text, "train")] or [0])


def assert_same_lines(followed: str, truth: list[str], what: str) -> None:
    """A followed log equals the pod's output: no line lost, none twice, none out of order."""
    got = followed.splitlines()
    pairs = zip(got, truth, strict=False)
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(got), len(truth)))
    assert got == truth, (
        f"{what}: followed {len(got)} lines, the pods printed {len(truth)}; "
        f"first difference at line {first}: {got[first : first + 1]} vs {truth[first : first + 1]}"
    )


class ExitCodes:
    """The exit codes of every run of the training container of the pods matching ``selector``,
    in the order a watch saw them: ``[(pod name, completion index label or "", code), ...]``.

    Watched, not read afterwards: a deleted pod's status goes with it, and once a container that
    was restarted in place has finished, the kubelet may have collected the dead container that
    ``lastState`` was read from (it keeps one per container name)."""

    def __init__(self, cluster, namespace: str, selector: str) -> None:
        import threading

        self.runs: list[tuple[str, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(cluster, namespace, selector), daemon=True
        )
        self._thread.start()

    def _run(self, cluster, namespace: str, selector: str) -> None:
        from kubernetes import watch

        from controller.kubeflow import CONTAINER, LABEL_JOB_COMPLETION_INDEX, TRAINJOB_CONTAINER

        api, seen = cluster.core_api(), set()
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                api.list_namespaced_pod, namespace, label_selector=selector, timeout_seconds=3
            )
            for event in stream:
                pod = event["object"]
                index = (pod.metadata.labels or {}).get(LABEL_JOB_COMPLETION_INDEX, "")
                for status in pod.status.container_statuses or []:
                    if status.name not in (CONTAINER, TRAINJOB_CONTAINER):
                        continue
                    runs = [(status.restart_count - 1, status.last_state)]
                    runs.append((status.restart_count, status.state))
                    for run, state in runs:
                        term = state.terminated if state else None
                        key = (pod.metadata.uid, run)
                        if term is not None and run >= 0 and key not in seen:
                            seen.add(key)
                            self.runs.append((pod.metadata.name, index, term.exit_code))

    def stop(self) -> list[tuple[str, str, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.runs
