"""Rank 0's progress posted to Kubeflow Trainer's progress API
(trainer/telemetry/progress_api.py), against a stand-in of the controller's status server: HTTPS
with a certificate from a throw-away CA, a bearer token read from a file, the request upstream's
server parses (pkg/statusserver, v2.3.0).
The real server, on the local cluster's real node: tests/e2e/test_trainjob_progress.py."""

from __future__ import annotations

import http.client
import http.server
import itertools
import json
import logging
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from localkube.controlplane.pki import PKI
from tests.trainer.conftest import REPO, common_args, run_pods, trainer_cmd, trainjob_envs
from trainer.contract import is_event, parse_event
from trainer.telemetry.progress_api import (
    ENV_CA_CERT,
    ENV_TOKEN,
    ENV_URL,
    MIN_INTERVAL_S,
    ProgressPoster,
    may_pass,
    trainer_status,
)

PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/tj/status"


class StatusServer:
    """An HTTPS server on 127.0.0.1 recording each POST: (monotonic time, headers, body)."""

    def __init__(self, tmp: Path, answer: int = 200) -> None:
        pki = PKI(tmp / "pki")
        crt, key = pki.issue("status", "status", server=True, dns=("localhost",))
        self.ca = str(pki.path("ca.crt"))
        self.answer = answer
        self.first_answers: list[int] = []  # answers for the first requests, then `answer`
        self.posts: list[tuple[float, dict[str, str], dict[str, Any]]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()  # answer at once unless a test holds it
        self.hold_first_only = False  # hold the first request alone, answer the others at once
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.posts.append((time.monotonic(), dict(self.headers), body))
                server.entered.set()
                if not (server.hold_first_only and len(server.posts) > 1):
                    server.release.wait()
                answer = server.first_answers.pop(0) if server.first_answers else server.answer
                if answer == 200:
                    data = json.dumps(body).encode()
                else:
                    status = {"status": "Failure", "message": "Forbidden", "code": answer}
                    data = json.dumps(status).encode()
                self.send_response(answer)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(crt, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://localhost:{self.httpd.server_address[1]}{PATH}"
        self.token = tmp / "token"
        self.token.write_text("token-1\n")
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        return {ENV_URL: self.url, ENV_CA_CERT: self.ca, ENV_TOKEN: str(self.token)}

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()


def _wait_for(condition, timeout_s: float = 60) -> None:
    """Until ``condition()`` holds; the limit only keeps a broken poster from hanging the test."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the poster never got there"
        time.sleep(0.01)


@pytest.fixture
def server(tmp_path):
    s = StatusServer(tmp_path)
    yield s
    s.close()


def test_the_status_is_the_one_upstreams_server_reads():
    train = {"step": 30, "max_steps": 120, "loss": 0.23471, "lr": 3e-4, "step_time_s": 0.5}
    train |= {"samples_per_s": 128.04, "tokens_per_s": float("nan"), "gpus": [{}]}
    status = trainer_status("train", train, {"loss": 0.3})
    assert status == {
        "progressPercentage": 25,
        "estimatedRemainingSeconds": 45,
        "metrics": [
            {"name": "step", "value": "30"},
            {"name": "loss", "value": "0.23471"},
            {"name": "lr", "value": "0.0003"},
            {"name": "samples_per_s", "value": "128.04"},  # a NaN is left out
            {"name": "eval_loss", "value": "0.3"},
        ],
    }
    done = trainer_status("done", {"step": 120, "max_steps": 120, "reason": "completed"})
    assert done is not None
    assert (done["progressPercentage"], done["estimatedRemainingSeconds"]) == (100, 0)
    preempted = trainer_status("done", {"step": 60, "max_steps": 120, "reason": "preempted"})
    assert preempted is not None and preempted["progressPercentage"] == 50
    # A failure before any step is known posts nothing: what was posted last stays.
    assert trainer_status("done", {"step": None, "max_steps": 120, "reason": "error"}) is None
    assert trainer_status("checkpoint", {"step": 10}) is None


def test_without_the_controllers_variables_nothing_is_posted():
    assert ProgressPoster.from_env({}) is None
    assert ProgressPoster.from_env({ENV_URL: "https://x", ENV_TOKEN: "/t"}) is None


def _timed_sends(poster: ProgressPoster) -> list[float]:
    """When ``poster`` decided to send each post (its own clock reading, the one its rate limit
    and back-off count from), filled as it posts. Not when the post started or reached the
    server: a loaded machine delays those by any amount, and the gaps between them with it."""
    sent: list[float] = []
    post = poster._post
    poster._post = lambda status: (sent.append(poster._last_post), post(status))[1]
    return sent


def test_the_newest_state_is_posted_with_a_fresh_token_at_most_once_per_interval(server):
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.5)
    sent = _timed_sends(poster)
    start = time.monotonic()
    for step in range(1, 51):
        poster.event("train", {"step": step, "max_steps": 50, "loss": 1.0 / step})
        if step == 25:
            server.token.write_text("token-2\n")  # the kubelet rotated it
        time.sleep(0.03)
    poster.event("done", {"step": 50, "max_steps": 50, "reason": "completed"})
    events_s = time.monotonic() - start  # 1.5 s of sleeps, more on a loaded machine
    poster.close()
    assert poster.failed is None
    assert len(sent) == len(server.posts)
    assert all(b - a >= 0.5 - 1e-6 for a, b in itertools.pairwise(sent)), sent
    # One post per interval while the events came (however long they took), and the last:
    # not one per step.
    assert 2 <= len(server.posts) <= events_s / 0.5 + 2, (len(server.posts), events_s)
    tokens = [h["Authorization"] for _, h, _ in server.posts]
    assert tokens[0] == "Bearer token-1" and tokens[-1] == "Bearer token-2"
    last = server.posts[-1][2]["trainerStatus"]
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0
    assert last["lastUpdatedTime"].endswith("Z")


def test_a_refused_post_is_logged_once_and_posting_stops(tmp_path, caplog):
    server = StatusServer(tmp_path, answer=403)
    try:
        poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.1)
        with caplog.at_level(logging.WARNING, logger="trainer.telemetry.progress_api"):
            for step in range(1, 21):
                poster.event("train", {"step": step, "max_steps": 20})
                time.sleep(0.05)
            poster.close()
    finally:
        server.close()
    assert len(server.posts) == 1
    assert poster.failed == "HTTP 403 Forbidden: Forbidden"
    (record,) = caplog.records
    assert "cannot post to the TrainJob's status" in record.getMessage()


def test_a_server_that_fails_for_a_while_still_gets_the_end(server, caplog):
    """503s (a status server whose API server is slow) are tried again, logged once, at a
    growing interval; the run's 100% still reaches the server."""
    server.first_answers = [503, 503, 503]
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.1)
    sent = _timed_sends(poster)
    with caplog.at_level(logging.WARNING, logger="trainer.telemetry.progress_api"):
        # Until the server has answered once (closing would cut a back-off short).
        for step in range(1, 10_000):
            poster.event("train", {"step": step, "max_steps": 10_000})
            if poster.posted:
                break
            time.sleep(0.04)
        poster.event("done", {"step": 10_000, "max_steps": 10_000, "reason": "completed"})
        poster.close(timeout_s=10)
    assert poster.failed is None and poster.retried == 3 and poster.posted >= 1
    (record,) = caplog.records
    assert "failed (got HTTP 503" in record.getMessage() and "tries again" in record.getMessage()
    assert len(sent) == len(server.posts)
    gaps = [b - a for a, b in itertools.pairwise(sent[:4])]
    # Backing off, not hammering a failing server: the waits after 1, 2 and 3 failures are at
    # least 0.2, 0.4 and 0.8 s. Without back-off each is 0.1 s.
    assert gaps[0] >= 0.2 - 1e-6 and gaps[1] >= 0.4 - 1e-6 and gaps[2] >= 0.8 - 1e-6, gaps
    assert server.posts[-1][2]["trainerStatus"]["progressPercentage"] == 100


def test_a_post_that_times_out_is_tried_again(server):
    """The flake this rule came from: a first post that outlived its timeout stopped every later
    one, and the TrainJob completed with no trainerStatus."""
    server.hold_first_only = True
    server.release.clear()  # the first request hangs past the client's timeout
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.1, timeout_s=2)
    poster.event("train", {"step": 1, "max_steps": 2})
    assert server.entered.wait(10)
    _wait_for(lambda: poster.retried == 1)  # the client gave up on it
    poster.event("done", {"step": 2, "max_steps": 2, "reason": "completed"})
    poster.close(timeout_s=10)
    server.release.set()
    assert poster.failed is None and poster.retried == 1 and poster.posted >= 1
    assert server.posts[-1][2]["trainerStatus"]["progressPercentage"] == 100


def test_a_last_post_still_under_way_when_the_run_ends_is_said(server, caplog):
    """The run ends; its last state's post has not come back within the close budget: the
    trainer exits anyway (it never waits long for the server), and says so in one line."""
    server.release.clear()  # the server takes the request and holds it until the end
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.0, timeout_s=600)
    with caplog.at_level(logging.WARNING, logger="trainer.telemetry.progress_api"):
        poster.event("done", {"step": 10, "max_steps": 10, "reason": "completed"})
        assert server.entered.wait(10)
        poster.close(timeout_s=0.5)  # returns, though the post can only end with the server
        assert poster._writer._thread.is_alive() and poster._writer.writing is not None
    server.release.set()
    (record,) = caplog.records
    assert "last state (100%) was not posted within 0 s" in record.getMessage()
    assert "a post was still under way: waiting for the server's answer" in record.getMessage()


def test_the_name_is_looked_up_once_and_again_only_after_a_connection_fails(server, monkeypatch):
    """Every socket operation of a post has the request timeout; a name lookup (glibc's,
    through the pod's search domains) has none of its own and can outlast a whole run. So the
    address found for the first post is kept, and looked up again only when a connection to
    it fails."""
    real = socket.getaddrinfo
    with socket.socket() as s:  # a port nothing listens on: the address has gone stale
        s.bind(("127.0.0.1", 0))
        stale = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", s.getsockname()[1]))]
    lookups: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        lookups.append(host)
        return stale if len(lookups) == 2 else real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.05)
    for step in range(1, 5):
        poster.event("train", {"step": step, "max_steps": 10})
        _wait_for(lambda step=step: poster.posted == step)
    assert poster.posted == 4 and lookups == ["localhost"]
    poster._addresses = None  # as after a failed connection: the next post looks it up again
    poster.event("train", {"step": 5, "max_steps": 10})  # the lookup finds the stale address
    poster.event("done", {"step": 10, "max_steps": 10, "reason": "completed"})
    poster.close(timeout_s=10)
    assert poster.failed is None and poster.retried == 1
    assert lookups == ["localhost"] * 3  # refused at the stale one: looked up once more
    assert server.posts[-1][2]["trainerStatus"]["progressPercentage"] == 100


@pytest.mark.parametrize(
    ("error", "again"),
    [
        (urllib.error.HTTPError("u", 503, "Service Unavailable", None, None), True),
        (urllib.error.HTTPError("u", 429, "Too Many Requests", None, None), True),
        (urllib.error.HTTPError("u", 403, "Forbidden", None, None), False),
        (urllib.error.HTTPError("u", 404, "Not Found", None, None), False),
        (urllib.error.HTTPError("u", 422, "Unprocessable", None, None), False),
        (TimeoutError("timed out"), True),
        (urllib.error.URLError(ConnectionRefusedError(111, "refused")), True),
        (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), True),
        (http.client.RemoteDisconnected("closed"), True),
        (urllib.error.URLError(ssl.SSLCertVerificationError(1, "unknown ca")), False),
        (FileNotFoundError(2, "no such file", "/var/run/token"), False),
        (urllib.error.URLError("unknown url type: htps"), False),
        (ValueError("a bug of ours"), False),
    ],
)
def test_which_failures_are_tried_again(error, again):
    assert may_pass(error) is again


def test_training_never_waits_for_a_server_that_does_not_answer(server):
    server.release.clear()  # the server takes the request and holds it
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.0)
    poster.event("train", {"step": 1, "max_steps": 1000})
    assert server.entered.wait(10)
    # Were event() to wait for the network, this loop would not end before the server answers,
    # and the server answers only after it.
    for step in range(2, 1001):
        poster.event("train", {"step": step, "max_steps": 1000})
    assert poster.failed is None and poster.posted == 0
    server.release.set()
    poster.close(timeout_s=10)
    assert poster.posted == 2  # the held one, then the newest: step 1000
    assert server.posts[-1][2]["trainerStatus"]["progressPercentage"] == 100


@pytest.mark.slow
def test_a_trainjob_run_posts_from_rank_0_only_at_upstreams_rate_and_100_at_the_end(
    server, tmp_path
):
    envs = [env | server.env() for env in trainjob_envs(2, "1")]  # every pod gets them
    # 6 s of training at least: a few intervals.
    args = common_args(tmp_path, max_steps=30, log_every=1, **{"task_args.sleep_s": 0.2})
    started = time.monotonic()
    results = run_pods(envs, args)
    took = time.monotonic() - started
    assert [r.rc for r in results] == [0, 0], results[0].stderr[-2000:]
    # One process a pod, each its node's rank (no torchrun): one group of two, and
    # only rank 0's pod prints events.
    (start,) = results[0].of("start")
    assert start["world_size"] == 2 and results[1].events == []
    said = [line for line in results[0].stderr.splitlines() if "progress:" in line]
    # No error logged; one line at the end says what the TrainJob's status was left at.
    assert len(said) == 1 and "posts to the TrainJob's status, the last at 100%" in said[0], said
    # Rank 0 only, at most once per 5 s of however long the run took (a post every step of
    # either rank would be 60). The gaps between posts are pinned by the rate-limit test above:
    # here, at the server, a loaded machine could bunch them.
    assert 2 <= len(server.posts) <= took / MIN_INTERVAL_S + 2, (len(server.posts), took)
    final = server.posts[-1][2]["trainerStatus"]
    assert final["progressPercentage"] == 100
    assert {m["name"] for m in final["metrics"]} >= {"loss", "samples_per_s", "step"}
    assert any(0 < p[2]["trainerStatus"]["progressPercentage"] < 100 for p in server.posts)


def _two_paced_ranks_past_step_5(server, tmp_path) -> list[subprocess.Popen]:
    """A 2-pod TrainJob run (paced steps, more than it will live for) with the status server
    holding every post (a post hangs until the client's timeout; rank 0's last one gets its
    2 s), once rank 0 has trained 5 steps. The caller kills what is left."""
    server.release.clear()
    envs = [env | server.env() for env in trainjob_envs(2, "1")]
    args = common_args(tmp_path, max_steps=10_000, log_every=1, **{"task_args.sleep_s": 0.05})
    procs = [
        subprocess.Popen(
            trainer_cmd(*args), cwd=REPO, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for env in envs
    ]  # fmt: skip
    try:
        for line in procs[0].stdout:  # rank 0's events, until it has trained a few steps
            if is_event(line, "train") and parse_event(line)["step"] >= 5:
                break
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs


@pytest.mark.slow
def test_a_preempted_trainjob_run_does_not_wait_for_a_slow_status_server(server, tmp_path):
    """The pod of rank 1 is deleted (SIGTERM) while the status server holds every post: both
    ranks checkpoint and exit 143. Rank 0 gives the progress API a moment (2 s), not its full
    wait (30 s, as long as the pod's whole grace period): rank 1 waits in the barrier for rank
    0, inside its own pod's grace period. The line rank 0 says names the wait it gave."""
    procs = _two_paced_ranks_past_step_5(server, tmp_path)
    try:
        assert server.entered.wait(30), "rank 0 never posted"
        procs[1].send_signal(signal.SIGTERM)  # what the kubelet does to the deleted pod
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [143, 143], [err[-2000:] for _, err in results]
    said = [line for line in results[0][1].splitlines() if "progress:" in line]
    assert any("was not posted within 2 s" in line for line in said), said


@pytest.mark.slow
def test_a_rank_signalled_after_the_run_stopped_waits_for_the_others_in_the_barrier(
    server, tmp_path
):
    """Kueue preempts a TrainJob, and the kubelet signals rank 0's pod a moment before rank
    1's. The run stops at once on both ranks; rank 1 is past ``fit``, waiting in the last
    barrier for rank 0 (writing its checkpoint, then giving the progress API its moment), when
    its own SIGTERM comes. Rank 1 keeps the trainer's handler until it has left the group (the
    default action would kill it there, and rank 0 would lose its peer in the barrier), and
    both leave as preempted, once."""
    procs = _two_paced_ranks_past_step_5(server, tmp_path)
    events: list[dict[str, Any]] = []
    try:
        assert server.entered.wait(30), "rank 0 never posted"
        procs[0].send_signal(signal.SIGTERM)  # rank 0's pod first
        for line in procs[0].stdout:
            if (event := parse_event(line)) is not None:
                events.append(event)
            if events and events[-1]["event"] == "done":
                break
        # Rank 0 has said done: rank 1 is past the run's last checkpoint, on its way to the
        # last barrier or in it, and rank 0 joins it there only after its 2 s for the last
        # post: rank 1's pod is signalled now, well inside that window.
        procs[1].send_signal(signal.SIGTERM)
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    events += [e for line in results[0][0].splitlines() if (e := parse_event(line)) is not None]
    errs = [err[-2000:] for _, err in results]
    assert [p.returncode for p in procs] == [143, 143], errs
    assert [e["reason"] for e in events if e["event"] == "done"] == ["preempted"], errs
    assert not any("lost a peer" in err for err in errs), errs


def test_a_lookup_that_does_not_answer_is_given_up_and_tried_afresh(server, monkeypatch):
    """A lookup of the status server's name can outlast the run and its 30 s at the end: it
    has the request timeout like every other step of a post, and the next try starts a new
    one."""
    real = socket.getaddrinfo
    release = threading.Event()
    calls: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        calls.append(host)
        if len(calls) == 1:
            release.wait(30)  # the first never answers while the run lasts
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    poster = ProgressPoster(server.url, server.ca, str(server.token), interval_s=0.05, timeout_s=2)
    poster.event("done", {"step": 10, "max_steps": 10, "reason": "completed"})
    poster.close(timeout_s=10)
    release.set()
    assert poster.failed is None and poster.retried == 1 and len(calls) == 2
    assert server.posts[-1][2]["trainerStatus"]["progressPercentage"] == 100
