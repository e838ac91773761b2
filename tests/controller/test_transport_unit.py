"""The HTTP layer without a cluster: kubeconfig files merged and read as kubectl reads them, and
requests, errors, log streams and watches against a small HTTP server of canned answers (a real
socket and real HTTP, only the server is not an API server)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from controller import errors
from controller.kube import tally, transport
from controller.kube.client import Cluster
from controller.kube.transport import ApiError, ConfigError

PY = sys.executable


# --------------------------------------------------------------------------------------------
# A server of canned answers


class FakeAPI:
    """Answers ``(method, path) -> handler(query, handler_self)``; records every request."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], object] = {}
        self.seen: list[tuple[str, str, dict[str, list[str]], dict[str, str], bytes]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _any(self) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                query = parse_qs(url.query)
                api.seen.append((self.command, url.path, query, dict(self.headers), body))
                route = api.routes.get((self.command, url.path))
                if route is None:
                    self.reply(404, {"kind": "Status", "message": f"no route {url.path}"})
                else:
                    route(query, self)

            do_GET = do_POST = do_DELETE = _any

            def reply(self, status: int, obj: object) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def chunks(self, parts: list[bytes]) -> None:
                """A chunked 200 whose chunks are ``parts`` exactly (a read may end anywhere)."""
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in parts:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def cluster(self) -> Cluster:
        """A ``Cluster`` on a token transport to this server."""
        c = Cluster.__new__(Cluster)
        c.transport = transport.Transport(
            self.url,
            transport._tls_context(True, ca=None, cert=None, key=None),
            auth=lambda: "Bearer t",
        )
        c.server, c.notice, c.kubeconfig, c.context = self.url, lambda s: None, None, None
        return c


@pytest.fixture
def api():
    fake = FakeAPI()
    yield fake
    fake.server.shutdown()


@pytest.fixture(autouse=True)
def fresh_tally(monkeypatch):
    monkeypatch.setattr(tally, "_counts", type(tally._counts)())
    monkeypatch.setattr(tally, "_paths", type(tally._paths)())


def status(message: str, **details) -> dict:
    return {"kind": "Status", "message": message, "details": details}


PODS = "/api/v1/namespaces/n/pods"
JOBS = "/apis/kubeflow.org/v1/namespaces/n/pytorchjobs"


def test_requests_carry_the_token_and_are_counted_and_refusals_classified(api):
    api.routes[("GET", PODS)] = lambda q, h: h.reply(200, {"items": [{"metadata": {"name": "p"}}]})
    api.routes[("GET", "/api/v1/namespaces/n/secrets")] = lambda q, h: h.reply(
        403, status('secrets is forbidden: User "u" cannot list resource "secrets"')
    )
    api.routes[("POST", JOBS)] = lambda q, h: h.reply(
        403, status('admission webhook "v" denied the request: no')
    )
    c = api.cluster()
    assert [p["metadata"]["name"] for p in c.list_pods("n", "a=b")] == ["p"]
    method, path, query, headers, _ = api.seen[-1]
    assert (method, path, query) == ("GET", PODS, {"labelSelector": ["a=b"]})
    assert headers["Authorization"] == "Bearer t"
    with pytest.raises(ApiError) as refused:
        c.transport.request("GET", "/api/v1/namespaces/n/secrets", timeout=(5, 5))
    assert refused.value.status == 403 and b"cannot list" in refused.value.body
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"}}
    job["metadata"]["namespace"] = "n"
    with pytest.raises(errors.Refused, match="admission webhook"):
        c.create_job(job)
    assert json.loads(api.seen[-1][4]) == job  # the manifest went as the JSON body
    assert tally.summary() == (
        "3 API requests (get 2, post 1); 0 re-lists after 410 Gone; 1 refused by RBAC"
    )
    # What each read: the path, without its query.
    assert tally.requests() == [
        f"get {PODS} (1)",
        "get /api/v1/namespaces/n/secrets (1)",
        f"post {JOBS} (1)",
    ]


def test_http_errors_become_the_projects_errors(api):
    api.routes[("GET", f"{JOBS}/q")] = lambda q, h: h.reply(
        404, status('pytorchjobs.kubeflow.org "q" not found', name="q")
    )
    api.routes[("DELETE", f"{JOBS}/q")] = lambda q, h: h.reply(200, {"kind": "Status"})
    c = api.cluster()
    with pytest.raises(errors.NotFound, match="PyTorchJob n/q not found"):
        c.get_job("q", "n")
    c.delete_job("q", "n")
    assert api.seen[-1][2] == {"propagationPolicy": ["Foreground"]}
    with pytest.raises(errors.NotFound, match="pod n/a/b not found"):
        c.get_pod("a/b", "n")  # a slash in a name stays inside its path segment
    assert api.seen[-1][1] == f"{PODS}/a%2Fb"


def test_a_trainjob_is_deleted_in_the_background(api):
    """Kubeflow Trainer creates a TrainJob's JobSet again while it sees the TrainJob being
    deleted: the TrainJob goes at once (background), and wait_deleted waits for the pods."""
    from controller.kubeflow import TRAINJOB

    path = f"/apis/{TRAINJOB.group}/{TRAINJOB.version}/namespaces/n/{TRAINJOB.plural}/t"
    api.routes[("DELETE", path)] = lambda q, h: h.reply(200, {"kind": "Status"})
    api.cluster().delete_job("t", "n", api=TRAINJOB)
    assert api.seen[-1][1:3] == (path, {"propagationPolicy": ["Background"]})


def test_a_log_not_there_yet_is_not_found_and_a_log_streams_in_lines(api):
    """400 from the log endpoint (container not started, no previous run) is transient for a
    follower: NotFound (NoLogYet), which it waits out, not a refusal that ends `logs -f`."""
    waiting = status('container "pytorch" in pod "j-worker-0" is waiting to start')
    api.routes[("GET", f"{PODS}/j-worker-0/log")] = lambda q, h: h.reply(400, waiting)
    api.routes[("GET", f"{PODS}/j-master-0/log")] = lambda q, h: h.chunks(
        [b"one\ntw", b"o\n", b"thr", b"ee\nno newline"]
    )
    c = api.cluster()
    for read in (c.read_log, c.stream_log):
        with pytest.raises(errors.NotFound, match="no log for pod n/j-worker-0 yet") as e:
            read("j-worker-0", "n", container="pytorch")
        assert e.value.reason == "NoLogYet"
    stream = c.stream_log("j-master-0", "n", container="pytorch", since_time="2026-01-01T00:00:00Z")
    assert list(stream) == ["one", "two", "three", "no newline"] and stream.ended
    assert api.seen[-1][2] == {
        "container": ["pytorch"],
        "follow": ["true"],
        "previous": ["false"],
        "timestamps": ["true"],
        "sinceTime": ["2026-01-01T00:00:00Z"],
    }
    # Not followed (a finished run): read in blocks, the same lines.
    stream = c.stream_log("j-master-0", "n", container="pytorch", follow=False, timestamps=False)
    assert list(stream) == ["one", "two", "three", "no newline"] and stream.ended
    assert api.seen[-1][2]["follow"] == ["false"] and api.seen[-1][2]["timestamps"] == ["false"]
    assert c.read_log("j-master-0", "n", container="pytorch") == "one\ntwo\nthree\nno newline"


def _pod(uid: str, rv: str) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": rv}}


def _event(etype: str, obj: dict) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode() + b"\n"


STOP = {"metadata": {"uid": "stop", "resourceVersion": "11"}}


def test_a_watch_resumes_from_the_last_version_and_relists_after_410(api):
    """List, watch (events cut across reads), resume from the last resourceVersion when the
    server ends the watch, re-list on 410 Gone and report what vanished as DELETED."""
    lists = iter(
        [
            {"metadata": {"resourceVersion": "1"}, "items": [_pod("a", "1")]},
            {"metadata": {"resourceVersion": "9"}, "items": [_pod("b", "3")]},
        ]
    )
    first = _event("MODIFIED", _pod("a", "2")) + _event("ADDED", _pod("b", "3"))
    watches = iter(
        [
            lambda h: h.chunks([first[:7], first[7:50], first[50:]]),  # then the server ends it
            lambda h: h.chunks([_event("ERROR", {"code": 410, "message": "too old"})]),
            # a bookmark, then the object that tells the test to stop reading
            lambda h: h.chunks([_event("BOOKMARK", _pod("", "10")), _event("ADDED", STOP)]),
        ]
    )
    api.routes[("GET", PODS)] = lambda q, h: (
        next(watches)(h) if "watch" in q else h.reply(200, next(lists))
    )
    c = api.cluster()
    got = []
    for t, o in c.watch("pod", "n", selector="x=y"):
        if o.get("metadata", {}).get("uid") == STOP["metadata"]["uid"]:
            break  # the third watch is open: everything the test reads has come
        got.append((t, o.get("metadata", {}).get("uid", o.get("count"))))
    assert got == [
        ("ADDED", "a"),
        ("RESYNC", 1),
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),  # gone from the re-list
        ("MODIFIED", "b"),
        ("RESYNC", 1),
    ]
    versions = [s[2].get("resourceVersion", ["(list)"])[0] for s in api.seen]
    assert versions == ["(list)", "1", "3", "(list)", "9"]
    assert all(s[2]["labelSelector"] == ["x=y"] for s in api.seen)
    assert "1 re-list after 410 Gone" in tally.summary()


def test_a_watch_past_its_deadline_asks_nothing(api):
    c = api.cluster()
    assert list(c.watch("pod", "n", deadline=time.monotonic() - 1)) == []
    assert api.seen == []


# --------------------------------------------------------------------------------------------
# Kubeconfig


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_list_merges_as_kubectl_does(tmp_path, monkeypatch):
    """KUBECONFIG=missing:a:b: a missing file is skipped, the first file to name a cluster,
    user or context wins it, the first current-context wins, and a relative path resolves
    against the folder of the file that holds it."""
    a = _write(
        tmp_path / "a" / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://a.example:1"}}],
            "users": [{"name": "u", "user": {"token": "from-a"}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        },
    )
    (tmp_path / "b" / "tok").parent.mkdir()
    (tmp_path / "b" / "tok").write_text("from-b-file\n")
    b = _write(
        tmp_path / "b" / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://b.example:1"}}],
            "users": [
                {"name": "u", "user": {"token": "shadowed"}},
                {"name": "u2", "user": {"tokenFile": "tok"}},
            ],
            "contexts": [
                {"name": "other", "context": {"cluster": "c", "user": "u2", "namespace": "ml"}}
            ],
            "current-context": "other",
        },
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{a}:{b}")
    t = transport.connect()
    assert (t.host, t._auth(), t.namespace) == ("http://a.example:1", "Bearer from-a", None)
    t = transport.connect(context="other")
    assert (t.host, t._auth(), t.namespace) == ("http://a.example:1", "Bearer from-b-file", "ml")
    with pytest.raises(ConfigError, match="context 'nope' is not in it"):
        transport.connect(context="nope")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no such file"):
        transport.connect()


def test_a_token_file_is_read_again_as_it_rotates(tmp_path, monkeypatch):
    tok = tmp_path / "token"
    tok.write_text("one")
    auth = transport._TokenFile(tok)
    assert auth() == "Bearer one"
    tok.write_text("two")
    assert auth() == "Bearer one"  # not re-read on every request
    monkeypatch.setattr(transport, "TOKEN_REREAD_S", 0.0)
    assert auth() == "Bearer two"


def _status_refused(kubeconfig: Path) -> subprocess.CompletedProcess:
    """``status`` with ``kubeconfig``: exit 2 (bad input), no traceback (the caller checks the
    line)."""
    r = subprocess.run(
        [PY, "-m", "controller", "status", "q", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    return r


@pytest.mark.parametrize(
    ("user", "words"),
    [
        (
            {"client-certificate-data": "bm90IHBlbQ=="},
            "a client-certificate or a client-key, not both",
        ),
        ({"client-certificate-data": "%%%", "client-key-data": "%%%"}, "not base64"),
        ({"client-certificate": "nothere.crt", "client-key": "k"}, "client-certificate"),
        (
            {"client-certificate-data": "bm90IHBlbQ==", "client-key-data": "bm90IHBlbQ=="},
            "not a PEM pair",
        ),
    ],
)
def test_bad_credentials_in_a_kubeconfig_say_which(tmp_path, user, words):
    path = _write(
        tmp_path / "config",
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    with pytest.raises(ConfigError, match=words):
        transport.connect(str(path))
    r = _status_refused(path)
    assert r.stderr.startswith(f"error: kubeconfig: cannot load {path} (got "), r.stderr
    assert r.stderr.count("\n") == 1 and "Fix the kubeconfig" in r.stderr, r.stderr


def test_a_bad_kubeconfig_on_the_kubernetes_clients_path_says_which(tmp_path):
    """An exec user is loaded by the kubernetes client's loader: what it refuses (here the
    cluster's CA file is missing) is the same one line as on ddpjob's own path."""
    path = _write(
        tmp_path / "config",
        {
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": "https://127.0.0.1:1",
                        "certificate-authority": "nothere.crt",
                    },
                }
            ],
            "users": [{"name": "u", "user": {"exec": {"command": "echo", "args": ["{}"]}}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    r = _status_refused(path)
    assert f"error: kubeconfig: cannot load {path} (got " in r.stderr, r.stderr
    assert "nothere.crt" in r.stderr and "Fix the kubeconfig" in r.stderr, r.stderr


def test_a_plain_kubeconfig_never_imports_the_kubernetes_client(tmp_path):
    """The point of transport.py: a token or certificate kubeconfig costs no import of the
    ~800-module generated client; a kubeconfig that runs a credential program does load it."""
    plain = _write(
        tmp_path / "plain",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    execs = _write(
        tmp_path / "exec",
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [
                {
                    "name": "u",
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1",
                            "command": "echo",
                            "args": [
                                json.dumps(
                                    {
                                        "apiVersion": "client.authentication.k8s.io/v1",
                                        "kind": "ExecCredential",
                                        "status": {"token": "from-exec"},
                                    }
                                )
                            ],
                            "interactiveMode": "Never",
                        }
                    },
                }
            ],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
    )
    code = textwrap.dedent("""\
        import sys
        from controller.kube.client import Cluster
        c = Cluster(kubeconfig=sys.argv[1])
        print(c.transport._auth(), "kubernetes" in sys.modules)
    """)
    for path, expect in ((plain, "Bearer t False"), (execs, "Bearer from-exec True")):
        r = subprocess.run([PY, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == expect.split()
