"""The API module without a cluster: errors become one plain line naming the fix, the CLI never
prints a traceback for them, and the cluster commands import neither kubernetes nor torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from controller import errors
from controller.cli.advice import error_lines
from controller.kube.client import Cluster, translate
from controller.kube.watch import resync as _resync

PY = sys.executable


SERVER = "https://127.0.0.1:6443"


def bare_cluster() -> Cluster:
    c = Cluster.__new__(Cluster)
    c.server = SERVER
    return c


def api_error(status: int, message: str, details: dict | None = None):
    from controller.kube.transport import ApiError

    body = json.dumps({"kind": "Status", "message": message, "details": details or {}})
    return ApiError(status, "x", body.encode())


@pytest.mark.parametrize(
    ("status", "message", "details", "what", "cls", "words"),
    [
        (
            409,
            'pytorchjobs.kubeflow.org "q" already exists',
            {"name": "q"},
            "PyTorchJob default/q",
            errors.Conflict,
            "--replace",
        ),
        (
            404,
            "the server could not find the requested resource",
            {},
            "PyTorchJob default/q",
            errors.NotFound,
            "Install the Kubeflow training operator",
        ),
        (
            404,
            'pytorchjobs.kubeflow.org "q" not found',
            {"name": "q"},
            "PyTorchJob default/q",
            errors.NotFound,
            "not found",
        ),
        (
            403,
            'User "bob" cannot create resource "pytorchjobs" in API group "kubeflow.org"',
            {},
            "PyTorchJob default/q",
            errors.Forbidden,
            'cannot create resource "pytorchjobs"',
        ),
        (
            403,
            'admission webhook "validator.pytorchjob" denied the request: must be 1',
            {},
            "PyTorchJob default/q",
            errors.UserError,
            "must be 1",
        ),
        (
            403,
            'configmaps "q-workdir" is forbidden: exceeded quota: cm, requested: '
            "count/configmaps=1, used: count/configmaps=1, limited: count/configmaps=1",
            {},
            "ConfigMap default/q-workdir",
            errors.Refused,
            "the namespace's quota refused ConfigMap default/q-workdir (configmaps",
        ),
        (
            500,
            'Internal error: failed calling webhook "validator": connection refused',
            {},
            "PyTorchJob default/q",
            errors.ClusterError,
            "Is the operator running?",
        ),
        (503, "etcd unavailable", {}, "x", errors.ClusterError, "503 etcd unavailable"),
        (
            404,
            'namespaces "nope" not found',
            {"name": "nope", "kind": "namespaces"},
            "PyTorchJob nope/q",
            errors.NotFound,
            "`kubectl create namespace nope`",
        ),
    ],
)
def test_api_errors_translate(status, message, details, what, cls, words):
    """The API layer's one translation gives the error class (and data); the CLI's line adds the
    fix: between them, the words a user reads."""
    err = translate(api_error(status, message, details), "submit", what, SERVER)
    assert type(err) is cls or (cls is errors.UserError and isinstance(err, errors.UserError))
    assert getattr(err, "status", status) == status
    line = "\n".join(error_lines(err))
    assert line.startswith("error: submit: ") and words in line


def test_api_layer_errors_carry_data_not_advice():
    """Advice is the CLI's: the translated error says what happened and carries the status and
    a reason code; the hint appears only in the CLI's rendering."""
    err = translate(
        api_error(409, 'pytorchjobs.kubeflow.org "q" already exists', {"name": "q"}),
        "submit",
        "PyTorchJob default/q",
        SERVER,
    )
    assert (err.status, err.reason, err.kind, err.namespace, err.name) == (
        409,
        "AlreadyExists",
        "PyTorchJob",
        "default",
        "q",
    )
    assert "--replace" not in str(err)
    assert "--replace" in error_lines(err)[0]


def test_connection_refused_says_what_to_do():
    import urllib3

    cause = ConnectionRefusedError(111, "Connection refused")
    exc = urllib3.exceptions.MaxRetryError(None, "/version", reason=cause)
    err = translate(exc, "status", "", SERVER)
    assert isinstance(err, errors.Unreachable)
    line = error_lines(err)[0]
    assert "(got connection refused)" in line and "make cluster-up" in line


def test_resync_reports_vanished_objects_as_deleted():
    known = {"a": {"metadata": {"uid": "a"}}, "b": {"metadata": {"uid": "b"}}}
    events = list(_resync(known, [{"metadata": {"uid": "b"}}, {"metadata": {"uid": "c"}}]))
    assert [(t, o["metadata"]["uid"]) for t, o in events] == [
        ("DELETED", "a"),
        ("MODIFIED", "b"),
        ("ADDED", "c"),
    ]
    assert set(known) == {"b", "c"}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [PY, "-m", "controller", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_no_kubeconfig_is_one_line_naming_it_exit_2(tmp_path):
    """Bad input, not a cluster failure: exit 2, the file named, the fix."""
    missing = tmp_path / "missing"
    r = _cli("status", "q", env={"KUBECONFIG": str(missing), "HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"kubeconfig: cannot load {missing} (got no such file" in r.stderr, r.stderr
    assert "export KUBECONFIG=" in r.stderr


def test_unreachable_api_server_is_one_line_exit_1(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
        users: [{name: u, user: {token: t}}]
        contexts: [{name: x, context: {cluster: c, user: u}}]
        current-context: x
    """)
    )
    r = _cli("wait", "q", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 1, r.stderr
    assert "does not answer (got connection refused)" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("--debug", "wait", "q", "--kubeconfig", str(kubeconfig))
    assert "Traceback" in r.stderr


def test_cluster_commands_import_without_kubernetes_and_torch():
    code = textwrap.dedent("""\
        import sys
        for mod in ("kubernetes", "torch", "matplotlib"):
            sys.modules[mod] = None
        import controller.cli.submit_commands, controller.cli.status_commands
        import controller.cli.log_commands, controller.kube.client, controller.kube.watch
        import controller.kube.logstream, controller.jobs.follow, controller.jobs.doctor
        import controller.jobs.wait, controller.jobs.read.explain, controller.jobs.status
        import controller.plot
        from controller.cli.main import build_parser
        build_parser().parse_args(["submit", "x.yaml", "--wait", "--follow"])
        print("ok")
    """)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_subcommand_debug_flag_keeps_the_global_one():
    from controller.cli.main import build_parser

    assert build_parser().parse_args(["--debug", "status", "q"]).debug is True
    assert build_parser().parse_args(["status", "q", "--debug"]).debug is True
    assert build_parser().parse_args(["status", "q"]).debug is False


def test_plot_writes_a_png(tmp_path):
    from controller.plot import plot_curves, train_series

    lines = [
        json.dumps(
            {
                "event": "train",
                "step": s,
                "max_steps": 30,
                "loss": 3.0 / s,
                "samples_per_s": 100.0 + s,
            }
        )
        for s in (10, 20, 30)
    ]
    lines.insert(2, json.dumps({"event": "train", "step": 20, "loss": 9.9, "samples_per_s": 1}))
    assert train_series(lines)["step"] == [10.0, 20.0, 30.0]
    out = tmp_path / "curves.png"
    assert plot_curves(lines, str(out)) == 3
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(errors.UserError):
        plot_curves(["no events"], str(out))
