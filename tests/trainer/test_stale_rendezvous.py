"""A TrainJob node restarted in place while rank 0's last group still holds the store, with real
processes: each pod's container is ``python -m trainer`` with a TrainJob's five variables; the
test plays the kubelet (a container that ends is started again in the same pod) and forces the
one ordering that makes the restarted node meet the last group's store, rather than leaving it
to chance.

Through torchrun (``numProcPerNode: auto`` on a pod of one CPU: one worker, as on a pod of one
GPU; ``trainer.distributed._join_watchdog``):

1. the master's worker is stopped (SIGSTOP), so it cannot notice its lost peer and its agent goes
   on serving the store;
2. the other pod is killed whole (-9) and started again: its new agent meets that store, reads
   the ranks the master's agent wrote for the last group and starts its worker;
3. that worker is held where the case wants it: before it touches anything (the store it will
   reach is the master's next one), or connected to the old store (which then goes away under
   it);
4. the master's worker goes on, loses its peer, exits 138; its container is started again and
   its new agent serves a new store; the held worker is let go.

The restarted pod must then join the master's new agent without its container ending again:
its workers see that the rendezvous they were started from is over, and its launcher starts
torchrun again at once.

Without torchrun (one process per pod; ``_wait_while_the_store_holds_a_formed_group``): the
master's trainer, which serves the store itself, is held in its main thread (its store goes on
answering) while the other pod is killed and started again; the restarted trainer must wait for
the master's next store instead of joining the last group's, with no third run.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.trainer.conftest import REPO, common_args, parse_events, trainer_cmd, trainjob_envs
from trainer.contract import EXIT_PEER_LOST, EXIT_STALE_RENDEZVOUS, JOIN_TIMEOUT_ENV

MAX_STEPS = 60

# Holds a torchrun worker (LOCAL_RANK is set only there) at interpreter start until GATE exists.
GATE_SITECUSTOMIZE = """\
import os, time
if "LOCAL_RANK" in os.environ:
    while not os.path.exists(os.environ["TEST_GATE"]):
        time.sleep(0.05)
"""
# On SIGUSR2, holds the process's main thread (its other threads, the store's among them, go on)
# until TEST_HOLD_GATE exists, having said so in TEST_HOLD_GATE.held.
HOLD_SITECUSTOMIZE = """\
import os, signal, time
def hold(signum, frame):
    gate = os.environ["TEST_HOLD_GATE"]
    open(gate + ".held", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.05)
if "TEST_HOLD_GATE" in os.environ:
    signal.signal(signal.SIGUSR2, hold)
"""


class Pod:
    """One pod's container, run after run: the launcher and everything it starts. torchrun puts
    its workers in sessions of their own, so a kill ends the whole tree, as a container's PID
    namespace ends."""

    def __init__(
        self, name: str, env: dict[str, str], args: list[str], logs: Path, cpus: set[int] | None
    ):
        self.name, self.env, self.args, self.logs, self.cpus = name, env, args, logs, cpus
        self.runs: list[subprocess.Popen] = []

    @property
    def proc(self) -> subprocess.Popen:
        return self.runs[-1]

    def start(self, **env: str) -> None:
        n = len(self.runs)
        with (
            open(self.logs / f"{self.name}.{n}.out", "w") as out,
            open(self.logs / f"{self.name}.{n}.err", "w") as err,
        ):
            self.runs.append(
                subprocess.Popen(
                    trainer_cmd(*self.args),
                    cwd=REPO,
                    env=self.env | env,
                    stdout=out,
                    stderr=err,
                    preexec_fn=(lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None,
                )
            )

    def out(self, run: int) -> str:
        return (self.logs / f"{self.name}.{run}.out").read_text()

    def events(self, run: int) -> list[dict]:
        return parse_events(self.out(run))

    def err(self, run: int) -> str:
        return (self.logs / f"{self.name}.{run}.err").read_text()

    def tree(self) -> list[psutil.Process]:
        try:
            launcher = psutil.Process(self.proc.pid)
            return [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def worker(self) -> psutil.Process | None:
        """The agent's worker, once the agent has started it. The agent has another child
        before it: importing torch runs ``/sbin/ldconfig -p`` (``ctypes.util.find_library``,
        from ``cuda.pathfinder``), so a child counts only by its command line."""
        agents = [p for p in self.tree() if "torch.distributed.run" in _cmdline(p)]
        children = agents[0].children() if agents else []
        workers = [c for c in children if _runs_trainer(_cmdline(c))]
        return workers[0] if workers else None

    def wait(self, timeout: float) -> int:
        """The current run's exit code; a run still going after ``timeout`` fails the test with
        what it printed."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run = len(self.runs) - 1
            pytest.fail(
                f"{self.name}'s run {run} still going after {timeout} s:\n{self.err(run)[-5000:]}"
            )

    def kill(self) -> None:
        procs = self.tree()
        for p in procs:
            p.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        psutil.wait_procs(procs, timeout=60)


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.NoSuchProcess:
        return []


def _runs_trainer(argv: list[str]) -> bool:
    return any(a == "-m" and b == "trainer" for a, b in itertools.pairwise(argv))


def _until(what: str, pred, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _connected(proc: psutil.Process, port: int, *, gone: bool = False) -> bool:
    """Has ``proc`` a connection to ``port``; ``gone``: what to say of a process that has
    already exited."""
    try:
        return any(c.raddr and c.raddr.port == port for c in proc.net_connections())
    except psutil.NoSuchProcess:
        return gone


def _second_runs_end_well(master: Pod, node: Pod) -> None:
    """Each pod's second run ends well, and no pod runs a third time: the master's (its first
    lost its peer) resumed from a checkpoint and trained to the end."""
    assert node.wait(600) == 0, node.err(1)[-5000:]
    assert master.wait(600) == 0, master.err(1)[-5000:]
    assert [p.returncode for p in master.runs] == [EXIT_PEER_LOST, 0]
    assert [p.returncode for p in node.runs] == [-signal.SIGKILL, 0]
    events = master.events(1)
    (resumed,) = [e for e in events if e["event"] == "resume"]
    assert 10 <= resumed["step"] < MAX_STEPS
    done = [e for e in events if e["event"] == "done"]
    assert [(d["reason"], d["step"]) for d in done] == [("completed", MAX_STEPS)]


def _kill_what_runs(*pods: Pod) -> None:
    for pod in pods:
        if pod.runs and pod.proc.poll() is None:
            pod.kill()


def _paced_args(tmp_path: Path) -> list[str]:
    """A run of MAX_STEPS paced steps, checkpointed every 10."""
    return common_args(
        tmp_path,
        max_steps=MAX_STEPS,
        log_every=5,
        **{"task_args.sleep_s": 0.1, "checkpoint.every_steps": 10},
    )


def _site(tmp_path: Path, sitecustomize: str) -> Path:
    """A folder for PYTHONPATH holding ``sitecustomize``; the gate file it waits for."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(sitecustomize)
    return tmp_path / "gate"


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("held", ["before the store", "on the old store"])
def test_a_node_restarted_while_the_master_agent_exits_joins_without_another_restart(
    tmp_path: Path, held: str
) -> None:
    envs = trainjob_envs(2, "auto")
    port = int(envs[0]["PET_MASTER_PORT"])
    for env in envs:
        # Far above what the rejoin takes here: a worker rescued by the watchdog exits 138.
        env[JOIN_TIMEOUT_ENV] = "120"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU pod even on a GPU host, where auto counts GPUs
    args, gate = _paced_args(tmp_path), _site(tmp_path, GATE_SITECUSTOMIZE)
    # One CPU each (the first and the last this test may use): auto is one worker per pod.
    cpus = sorted(os.sched_getaffinity(0))
    master = Pod("master", envs[0], args, tmp_path, {cpus[0]})
    node = Pod("node", envs[1], args, tmp_path, {cpus[-1]})
    try:
        master.start()
        node.start()
        _until("a checkpoint", lambda: "checkpoint" in [e["event"] for e in master.events(0)])
        old_worker = master.worker()
        old_worker.suspend()
        node.kill()
        node.start(PYTHONPATH=str(tmp_path / "site"), TEST_GATE=str(gate))
        held_worker = _until("the restarted node's worker", node.worker)
        # Its agent started it, so it read this node's ranks from the old store.
        if held == "on the old store":
            gate.touch()
            # A worker quick to find the round over may have left the old store already: the
            # node's second run's stderr, asserted below, says it met it.
            _until("the worker on the old store", lambda: _connected(held_worker, port, gone=True))
        old_worker.resume()
        assert master.wait(120) == EXIT_PEER_LOST, master.err(0)[-3000:]
        master.start()  # the kubelet restarts the master's container in place
        _until("the master's new store", lambda: _listening(port))
        if held == "before the store":
            assert not _connected(held_worker, port)
            gate.touch()
        _second_runs_end_well(master, node)
    finally:
        _kill_what_runs(master, node)

    stderr = node.err(1)
    assert stderr.count("placed by a rendezvous that is over") == 1, stderr[-5000:]
    assert stderr.count("starting torchrun again (attempt 2 of 5)") == 1, stderr[-5000:]
    assert "did not form within" not in stderr


@pytest.mark.slow
def test_a_node_restarted_while_rank_0_holds_the_last_groups_store_waits_for_the_next(
    tmp_path: Path,
) -> None:
    envs = trainjob_envs(2, "1")
    args, gate = _paced_args(tmp_path), _site(tmp_path, HOLD_SITECUSTOMIZE)
    hold = {"PYTHONPATH": str(tmp_path / "site"), "TEST_HOLD_GATE": str(gate)}
    master = Pod("master", envs[0], args, tmp_path, None)
    node = Pod("node", envs[1], args, tmp_path, None)
    try:
        master.start(**hold)
        node.start()
        _until("a checkpoint", lambda: "checkpoint" in [e["event"] for e in master.events(0)])
        # No torchrun: each pod's trainer is its node's rank, and the master's serves the store.
        pods = master.tree() + node.tree()
        assert not [p for p in pods if "torch.distributed.run" in _cmdline(p)], pods
        master.proc.send_signal(signal.SIGUSR2)
        _until("the master held", (tmp_path / "gate.held").exists)
        node.kill()
        node.start()
        _until(
            "the restarted node at the last group's store",
            lambda: "belongs to a group that formed before" in node.err(1),
        )
        gate.touch()
        assert master.wait(120) == EXIT_PEER_LOST, master.err(0)[-3000:]
        master.start()  # the kubelet restarts the master's container in place
        _second_runs_end_well(master, node)
    finally:
        _kill_what_runs(master, node)

    assert node.err(1).count("belongs to a group that formed before") == 1
    assert "no new group started" not in node.err(1)


def test_a_rendezvous_still_stale_after_the_last_attempt_is_a_lost_peer_to_the_operator() -> None:
    from trainer.launch import relaunch_exit_code, rendezvous_was_stale

    assert rendezvous_was_stale([EXIT_STALE_RENDEZVOUS, EXIT_STALE_RENDEZVOUS])
    assert not rendezvous_was_stale([EXIT_STALE_RENDEZVOUS, EXIT_PEER_LOST])
    assert not rendezvous_was_stale([])
    assert relaunch_exit_code(1, [EXIT_STALE_RENDEZVOUS]) == EXIT_PEER_LOST
    assert relaunch_exit_code(1, [EXIT_STALE_RENDEZVOUS, 1]) == 1
