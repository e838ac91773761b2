"""Start the real 2-rank gloo trainer many times under CPU load and count how each start ended.

    python bench/stress_starts.py --starts 500 --parallel 2 --burners 6
    python bench/stress_starts.py --python /venvs/torch28/bin/python --python .venv/bin/python
    # in the image, one CPU a pod, as on the real node:
    PREFIX='podman run --rm --network host --user 0 --cpus 1 --entrypoint ""'
    PREFIX="$PREFIX -v {dir}:{dir} -w {dir}"
    CONTAINERS_CONF=tools/containers.conf python bench/stress_starts.py --python python \
        --pythonpath '' --prefix "$PREFIX ghcr.io/ddpjob/trainer:0.1.0" --starts 300

Why: a rank can die of SIGABRT ("terminate called without an active exception") at exit under
the full suite's load, never when started alone (docs/benchmarks.md, "Starting the trainer many
times"). This starts the job in the shapes the suite starts it, many times, ``--parallel`` jobs
at once, beside ``--burners`` busy-looping processes that hold the load where the suite's is (2
cores, load 10+).

A *job* is two ranks of the built-in ``vision`` task (tiny, a few steps, an eval and
checkpoints), launched one of three ways, as the tests and the operators do:

- ``torchrun``: ``torchrun --nproc-per-node 2 -m trainer`` (tests/trainer/test_resume.py);
- ``pods``: two ``python -m trainer`` with RANK/WORLD_SIZE/MASTER_* (a PyTorchJob, one process
  per pod);
- ``trainjob``: two ``python -m trainer`` with only the five ``PET_*`` variables of a Trainer v2
  TrainJob (each takes its node's rank from them, as in the image on the real node).

Each job is started twice in the same checkpoint folder: *fresh*, then *resume*, which loads the
final checkpoint, evaluates and exits at once (what a retried pod of a finished job does). Each
is one *start*. Starts cycle through every ``--python`` x launcher, so several torch versions
(or, as ``PYTHON@PYTHONPATH``, several copies of the trainer) are measured under the same load
in the same run.

A start is an *abort* when a process ended by SIGABRT (-6, or 134 from a shell or the trainer's
torchrun re-launch), torchrun reported a worker's "Signal 6", or "terminate called" is in its
stderr; a *hang* when it ran past ``--timeout-s``; a *failure* when anything else exited
non-zero. Core dumps are on: the kernel's ``core_pattern`` is set to ``core.%p`` (relative: the
crashing process's folder, which works inside a container too) for the run and put back after.
On an abort the script prints the tail of stderr and, when the core can be read here, ``gdb``'s
``thread apply all bt``: the native stack says which C++ thread was left joinable.

``--prefix`` runs every process through a command (``{dir}`` is the start's folder, which the
prefix must mount and use as the working directory), e.g. ``podman run`` of the trainer image
(as root, to write the folder; ``tools/containers.conf`` where podman may not set rlimits);
the job's variables are passed with ``env K=V``. With a prefix, ``--python`` is the
interpreter's name inside it and ``--pythonpath ''`` uses the installed trainer; cores are kept
but not read (the libraries they name are the image's).

The counts are printed per python and shape, with wall time and the load average seen; ``--json``
writes them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAUNCHERS = ("torchrun", "pods", "trainjob")
PHASES = ("fresh", "resume")
# The variables a launcher sets: removed from this process's env before a job gets its own.
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_PREFIXES = ("PET_", "TORCHELASTIC_")
# torchrun's summary of a worker killed by a signal, e.g. "traceback : Signal 6 (SIGABRT)".
_SIGABRT_TEXT = re.compile(r"Signal 6 \(SIGABRT\)|exitcode\s*:\s*-6\b|terminate called")
_CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_args(ckpt_dir: Path, steps: int) -> list[str]:
    """A short run: a few steps, an eval and checkpoints along the way, like the tests'."""
    return [
        "task=vision",
        "task_args.image_size=8",
        "task_args.width=8",
        "task_args.train_size=256",
        "task_args.eval_size=64",
        "device=cpu",
        "backend=gloo",
        f"max_steps={steps}",
        "batch_size=8",
        "log_every=1",
        "eval_every=2",
        "eval_batches=2",
        f"checkpoint.dir={ckpt_dir}",
        "checkpoint.every_steps=2",
        "progress=never",
        "timeout_s=120",
    ]


def job_processes(
    launcher: str, python: str, args: list[str]
) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, the launcher's variables) of each process a launcher starts for a 2-rank job."""
    port = str(free_port())
    if launcher == "torchrun":
        argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        argv += ["--master-addr", "127.0.0.1", "--master-port", port, "-m", "trainer", *args]
        return [(argv, {})]
    if launcher == "pods":
        master = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        return [([python, "-m", "trainer", *args], {**master, "RANK": str(r)}) for r in (0, 1)]
    if launcher == "trainjob":
        pet = {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": port,
        }
        return [
            ([python, "-m", "trainer", *args], {**pet, "PET_NODE_RANK": str(r)}) for r in (0, 1)
        ]
    raise ValueError(launcher)


@dataclass
class Start:
    python: str
    launcher: str
    phase: str
    outcome: str  # ok | abort | hang | fail
    wall_s: float
    rcs: list[int | None]
    detail: str = ""
    cores: list[str] = field(default_factory=list)


class Harness:
    def __init__(self, opts: argparse.Namespace, root: Path):
        self.opts, self.root = opts, root
        self.prefix = shlex.split(opts.prefix) if opts.prefix else []
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)
        }
        self.env |= {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        if opts.pythonpath:
            self.env["PYTHONPATH"] = opts.pythonpath
        if opts.faulthandler:
            # Python's stacks of every thread on SIGABRT (then the default action: the core).
            self.env["PYTHONFAULTHANDLER"] = "1"
        self.starts: list[Start] = []
        self.lock = threading.Lock()
        self.backtraces_left = opts.backtraces
        self.stop = threading.Event()

    # -- one process set ------------------------------------------------------------------------

    def _popen(self, argv: list[str], job_env: dict[str, str], cwd: Path, log: Path):
        if self.prefix:
            extra = {k: self.env[k] for k in ("PYTHONUNBUFFERED", "OMP_NUM_THREADS")}
            extra |= {k: self.env[k] for k in ("PYTHONPATH", "PYTHONFAULTHANDLER") if k in self.env}
            kv = [f"{k}={v}" for k, v in {**extra, **job_env}.items()]
            argv = [a.replace("{dir}", str(cwd)) for a in self.prefix] + ["env", *kv, *argv]
        out = open(log, "w")  # noqa: SIM115 - closed in _run_job
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**self.env, **job_env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: resource.setrlimit(
                resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            ),
        )
        return proc, out

    def _run_job(self, python: str, launcher: str, phase: str, folder: Path) -> Start:
        args = trainer_args(folder / "ckpt", self.opts.steps)
        started = time.monotonic()
        procs = []
        interpreter, _, pythonpath = python.partition("@")
        for i, (argv, job_env) in enumerate(job_processes(launcher, interpreter, args)):
            if pythonpath:
                job_env = {**job_env, "PYTHONPATH": pythonpath}
            log = folder / f"{phase}-{i}.log"
            procs.append((*self._popen(argv, job_env, folder, log), log))
        deadline = started + self.opts.timeout_s
        hung = False
        for proc, _, _ in procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
        if hung:
            for proc, _, _ in procs:
                _kill_tree(proc.pid)
            for proc, _, _ in procs:
                proc.wait()
        for _, out, _ in procs:
            out.close()
        wall = time.monotonic() - started
        rcs = [p.returncode for p, _, _ in procs]
        text = "".join(log.read_text(errors="replace") for _, _, log in procs)
        cores = sorted(str(p) for p in folder.rglob("core*") if p.is_file())
        if hung:
            outcome = "hang"
        elif any(rc in (-6, 134) for rc in rcs) or _SIGABRT_TEXT.search(text) or cores:
            outcome = "abort"
        elif any(rcs):
            outcome = "fail"
        else:
            outcome = "ok"
        detail = "" if outcome == "ok" else _tail(text, self.opts.tail_chars)
        return Start(python, launcher, phase, outcome, round(wall, 2), rcs, detail, cores)

    # -- the loop -------------------------------------------------------------------------------

    def plan(self) -> list[tuple[str, str]]:
        """(python, launcher) of each job, interleaved so every pair sees the same load."""
        pairs = list(itertools.product(self.opts.python, self.opts.launchers))
        jobs_per_pair = -(-self.opts.starts // (len(self.opts.launchers) * len(PHASES)))
        return [pair for _ in range(jobs_per_pair) for pair in pairs]

    def worker(self, queue: collections.deque) -> None:
        while not self.stop.is_set():
            with self.lock:
                if not queue:
                    return
                n, (python, launcher) = queue.popleft()
            folder = self.root / f"job{n:05d}-{launcher}"
            folder.mkdir()
            clean = True
            for phase in PHASES:
                start = self._run_job(python, launcher, phase, folder)
                with self.lock:
                    self.starts.append(start)
                    self._report(start, folder)
                clean = start.outcome == "ok"
                if not clean:
                    break  # a resume needs the fresh run's final checkpoint
            if clean and not self.opts.keep:
                shutil.rmtree(folder, ignore_errors=True)

    def _report(self, start: Start, folder: Path) -> None:
        done = len(self.starts)
        if start.outcome != "ok":
            print(
                f"\n=== start {done}: {start.outcome.upper()} ({start.launcher}, {start.phase}, "
                f"{start.python}) rcs={start.rcs} in {folder}\n{start.detail}",
                flush=True,
            )
            for core in start.cores:
                self._backtrace(start, Path(core))
        if done % self.opts.every == 0:
            print(f"[{time.strftime('%H:%M:%S')}] {summary_line(self.starts)}", flush=True)

    def _backtrace(self, start: Start, core: Path) -> None:
        if self.backtraces_left <= 0 or self.prefix:
            print(f"core kept: {core}", flush=True)
            return
        self.backtraces_left -= 1
        exe = _core_exe(core) or start.python
        cmd = ["gdb", "-batch", "-nx", "-ex", "info threads", "-ex", "thread apply all bt"]
        cmd += [exe, str(core)]
        try:
            bt = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            bt = f"gdb failed: {e}"
        out = core.with_suffix(core.suffix + ".bt.txt")
        out.write_text(bt)
        print(f"--- gdb {exe} {core} (also in {out})\n{bt}\n--- end of backtrace", flush=True)


def summary_line(starts: list[Start]) -> str:
    c = collections.Counter(s.outcome for s in starts)
    return (
        f"{len(starts)} starts: {c['ok']} ok, {c['abort']} aborts, {c['fail']} failures, "
        f"{c['hang']} hangs; load {os.getloadavg()[0]:.1f}"
    )


def _tail(text: str, n: int) -> str:
    return text[-n:] if len(text) > n else text


def _core_exe(core: Path) -> str | None:
    """The executable a core belongs to (``file`` names it), when it exists here."""
    try:
        out = subprocess.run(["file", str(core)], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"execfn: '([^']+)'", out)
    return m.group(1) if m and Path(m.group(1)).exists() else None


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun's workers are in their own sessions)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


class CoreDumps:
    """Core files in the crashing process's folder, named by pid, for this run only."""

    def __init__(self) -> None:
        self.saved: str | None = None

    def __enter__(self) -> CoreDumps:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        try:
            self.saved = _CORE_PATTERN.read_text().strip()
            if self.saved != "core.%p":
                _CORE_PATTERN.write_text("core.%p")
        except OSError as e:
            print(f"core dumps: cannot set {_CORE_PATTERN} ({e}); no backtraces", file=sys.stderr)
            self.saved = None
        return self

    def __exit__(self, *exc) -> None:
        if self.saved is not None and self.saved != "core.%p":
            _CORE_PATTERN.write_text(self.saved)


class Burners:
    """``n`` busy-looping processes: CPU pressure like the full suite's on 2 cores."""

    def __init__(self, n: int):
        self.procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)
        ]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def table(starts: list[Start]) -> list[dict]:
    rows = []
    keys = sorted({(s.python, s.launcher, s.phase) for s in starts})
    for python, launcher, phase in keys:
        mine = [s for s in starts if (s.python, s.launcher, s.phase) == (python, launcher, phase)]
        c = collections.Counter(s.outcome for s in mine)
        rows.append(dict(python=python, launcher=launcher, phase=phase, starts=len(mine), **c))
    return rows


def torch_version(python: str, prefix: list[str], folder: Path) -> str:
    """``torch.__version__`` of ``python`` (through the prefix, if any)."""
    cmd = [a.replace("{dir}", str(folder)) for a in prefix]
    cmd += [python.partition("@")[0], "-c", "import torch; print(torch.__version__)"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=60, help="starts per --python (default 60)")
    p.add_argument("--parallel", type=int, default=2, help="jobs at once (default 2)")
    p.add_argument("--burners", type=int, default=6, help="busy-looping processes (default 6)")
    p.add_argument(
        "--python",
        action="append",
        help="interpreter(s) to start the trainer with, as PYTHON or PYTHON@PYTHONPATH (this "
        "python with that trainer); repeat to compare (default: this one)",
    )
    p.add_argument(
        "--launchers",
        default=",".join(LAUNCHERS),
        help=f"comma-separated, of {', '.join(LAUNCHERS)} (default: all)",
    )
    p.add_argument("--steps", type=int, default=4, help="max_steps of a fresh run (default 4)")
    p.add_argument("--timeout-s", type=float, default=300, help="a start past this is a hang")
    p.add_argument("--prefix", default="", help="run each process through this command ({dir})")
    p.add_argument(
        "--pythonpath", default=str(REPO), help="PYTHONPATH of the trainer (default: this repo)"
    )
    p.add_argument("--no-faulthandler", dest="faulthandler", action="store_false")
    p.add_argument("--backtraces", type=int, default=5, help="gdb at most this many cores")
    p.add_argument("--tail-chars", type=int, default=6000, help="stderr shown per bad start")
    p.add_argument("--every", type=int, default=20, help="print the counts every N starts")
    p.add_argument("--keep", action="store_true", help="keep every start's folder")
    p.add_argument("--root", help="where the starts' folders go (default: a new temp folder)")
    p.add_argument("--json", help="write the counts here")
    opts = p.parse_args(argv)
    opts.python = opts.python or [sys.executable]
    opts.launchers = [x for x in opts.launchers.split(",") if x]
    bad = set(opts.launchers) - set(LAUNCHERS)
    if bad:
        p.error(f"--launchers: unknown {sorted(bad)} (choose from {', '.join(LAUNCHERS)})")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    root = Path(opts.root or tempfile.mkdtemp(prefix="ddpjob-stress-"))
    root.mkdir(parents=True, exist_ok=True)
    versions = {py: torch_version(py, shlex.split(opts.prefix), root) for py in opts.python}
    print(
        f"stress: {opts.starts} starts per python {versions}, {opts.parallel} at once, "
        f"{opts.burners} burners, launchers {opts.launchers}; folders in {root}",
        flush=True,
    )
    harness = Harness(opts, root)
    queue = collections.deque(enumerate(harness.plan()))
    loads: list[float] = []
    started = time.monotonic()
    burners = Burners(opts.burners)
    previous = signal.signal(signal.SIGTERM, lambda *_: harness.stop.set())
    try:
        with CoreDumps():
            threads = [
                threading.Thread(target=harness.worker, args=(queue,), daemon=True)
                for _ in range(opts.parallel)
            ]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                loads.append(os.getloadavg()[0])
                for t in threads:
                    t.join(timeout=5)
    except KeyboardInterrupt:
        harness.stop.set()
        print("interrupted: waiting for the running starts", file=sys.stderr)
        for t in threads:
            t.join()
    finally:
        burners.close()
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - started
    rows = table(harness.starts)
    print(f"\n{summary_line(harness.starts)}; {wall:.0f} s")
    load_mean = sum(loads) / max(len(loads), 1)
    print(f"load average (1 min): mean {load_mean:.1f}, max {max(loads or [0]):.1f}")
    for py in opts.python:
        mine = [s for s in harness.starts if s.python == py]
        c = collections.Counter(s.outcome for s in mine)
        print(
            f"torch {versions[py]} ({py}): {len(mine)} starts, {c['abort']} aborts, "
            f"{c['fail']} other failures, {c['hang']} hangs"
        )
    for r in rows:
        print("  " + ", ".join(f"{k}={v}" for k, v in r.items()))
    if opts.json:
        Path(opts.json).write_text(
            json.dumps(
                dict(
                    versions=versions,
                    options={k: v for k, v in vars(opts).items()},
                    wall_s=round(wall, 1),
                    load_mean=round(load_mean, 2),
                    load_max=max(loads or [0]),
                    rows=rows,
                    bad=[asdict(s) for s in harness.starts if s.outcome != "ok"],
                ),
                indent=1,
            )
        )
    bad = sum(s.outcome != "ok" for s in harness.starts)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
