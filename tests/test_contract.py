"""The trainer and the controller read one contract (``trainer/contract.py``): what a real trainer
run prints, the controller's readers understand, however the JSON is spelled.

A real run of ``python -m trainer`` (one process, CPU) writes its events; they go through every
reader the controller has for a log (the live progress of ``run --local`` and ``--follow``,
``status``'s progress, ``plot``, the elastic follower's rank-0 test), first as printed and then
rewritten with the keys in another order and other spacing. Both must read the same.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.jobs.read.loglines import start_hostname as _start_hostname
from controller.jobs.read.trainer_events import latest_progress
from controller.plot import train_series
from controller.progress import Progress
from trainer import contract
from trainer.contract import CHECKPOINT, DONE, START, TRAIN, is_event, parse_event

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> list[str]:
    """The stdout lines of a real 12-step run that checkpoints at step 6."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    env = contract.without_launcher(dict(os.environ)) | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "task=tests.trainer.tasks:build",
            "max_steps=12",
            "log_every=4",
            "checkpoint.every_steps=6",
            f"checkpoint.dir={ckpt}",
            "device=cpu",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == contract.EXIT_OK, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def _respelled(line: str) -> str:
    """``line``'s event with its keys reversed and no spaces; other lines unchanged."""
    event = parse_event(line)
    if event is None:
        return line
    return json.dumps(dict(reversed(list(event.items()))), separators=(",", ":"))


def _what_the_controller_reads(lines: list[str]) -> dict:
    progress = Progress(io.StringIO(), live=False)
    progress.feed_lines(lines)
    starts = [line for line in lines if is_event(line, START)]
    return {
        "events": [parse_event(line)["event"] for line in lines if parse_event(line)],
        "progress": (progress.step, progress.max_steps, progress.loss, progress.done["reason"]),
        "latest": {k: v for k, v in latest_progress(lines).items() if k != "eta_s"},
        "plot": train_series(lines),
        "rank0_hostname": [_start_hostname(line) for line in starts],
    }


@pytest.mark.slow
def test_the_controller_reads_what_a_real_trainer_prints(printed):
    read = _what_the_controller_reads(printed)
    assert read["events"][0] == START and read["events"][-1] == DONE
    assert read["events"].count(TRAIN) == 3  # steps 4, 8, 12
    assert read["events"].count(CHECKPOINT) == 2  # steps 6 and 12
    step, max_steps, loss, reason = read["progress"]
    assert (step, max_steps, reason) == (12, 12, contract.COMPLETED)
    assert loss is not None and loss > 0
    assert read["latest"]["event"] == DONE and read["latest"]["step"] == 12
    assert read["plot"]["step"] == [4.0, 8.0, 12.0]
    assert read["rank0_hostname"] and read["rank0_hostname"][0]  # the start event names its pod


def test_key_order_and_spacing_do_not_matter(printed):
    respelled = [_respelled(line) for line in printed]
    assert respelled != printed  # the rewrite changed every event line
    assert not any(line.startswith('{"event"') for line in respelled if parse_event(line))
    assert _what_the_controller_reads(respelled) == _what_the_controller_reads(printed)


def test_lines_named_by_their_rank_read_the_same(printed):
    """Under torchrun each process's line reaches the log after its rank (``[rank 0] ``)."""
    named = [contract.RANK_PREFIX.format(rank=0) + line for line in printed]
    assert all(parse_event(a) == parse_event(b) for a, b in zip(named, printed, strict=True))
    assert _what_the_controller_reads(named) == _what_the_controller_reads(printed)


#: torchrun's tee'd stream as an unbuffered print of two ranks makes it: each piece after its
#: rank, the pieces of the two ranks' lines interleaved, a line of torchrun's own between them,
#: a line the trainer named itself, and a last line that never ended.
TEED = (
    b"\x1e2\x1fUSERSCRIPT\x1e3\x1fUSERSCRIPT\x1e2\x1f 2 4\x1e3\x1f 3 4 10.0 1\n"
    b"\x1e2\x1f 10.0 0\nW1128 torchrun's own line\n\x1e0\x1f[rank 0] INFO named already\n"
    b'\x1e1\x1f{"event": "stuck"\x1e1\x1f, "rank": 1}\n\x1e3\x1fno newline'
)
WHOLE = [
    b"[rank 3] USERSCRIPT 3 4 10.0 1\n",
    b"[rank 2] USERSCRIPT 2 4 10.0 0\n",
    b"W1128 torchrun's own line\n",
    b"[rank 0] INFO named already\n",
    b'[rank 1] {"event": "stuck", "rank": 1}\n',
    b"[rank 3] no newline\n",
]


@pytest.mark.parametrize("read", [1, 5, len(TEED)])
def test_pieces_of_several_processes_become_whole_lines_named_by_rank(read):
    """However the reads cut the stream (a byte at a time, or all at once)."""
    lines = contract.RankLines()
    out = []
    for at in range(0, len(TEED), read):
        out += lines.feed(TEED[at : at + read])
    assert out + lines.close() == WHOLE
    assert parse_event(WHOLE[4].decode()) == {"event": "stuck", "rank": 1}


#: What torch 2.15 printed on node 1 after a run that succeeded (cut short): node 0's torchrun,
#: which held the store, had exited as node 1's agent waited in the exit barrier.
AGENT = "E1128 03:46:15.249000 8435 torch/distributed/elastic/agent/server/api.py:1007] "
EXIT_RACE = [
    "[W1128 03:46:15.564418628 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on "
    "SocketImpl(fd=3): Failed to recv, got 0 bytes. Connection was likely closed.",
    "Exception raised from recvBytes at torch/csrc/distributed/c10d/Utils.hpp:786:",
    "frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f3f25d5c13d in libc10.so)",
    "<omitting python frames>",
    "frame #31: _start + 0x21 (0x5651da1cc081 in python)",
    "",
    AGENT + "Error waiting on exit barrier. Elapsed: 0.027295351028442383 seconds",
    AGENT + "Traceback (most recent call last):",
    AGENT + '  File "torch/distributed/elastic/utils/store.py", line 201, in barrier',
    AGENT + "    store.wait([last_member_key])",
    AGENT + "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.",
]


def _through(lines: list[str]) -> list[str]:
    race = contract.ExitBarrierRace()
    out = race.feed([(line + "\n").encode() for line in lines]) + race.close()
    return [line.decode().rstrip("\n") for line in out]


def test_the_exit_barriers_race_is_said_in_one_line_and_nothing_else_is_touched():
    before, after = "[rank 1] last line of the run", "W1128 torchrun's next line"
    assert _through([before, *EXIT_RACE, after]) == [
        before,
        contract.EXIT_RACE_NOTE.rstrip("\n"),
        after,
    ]
    # Without the agent's exit barrier error, torch's warning is another story: kept whole.
    assert _through([*EXIT_RACE[:6], after]) == [*EXIT_RACE[:6], after]
    assert _through(EXIT_RACE[:8]) == EXIT_RACE[:8]  # cut off before its end: kept as it was


def test_a_line_that_only_looks_like_an_event_is_not_one():
    assert parse_event('{"event": "start"') is None  # cut off
    assert parse_event('{"event": 3}') is None
    assert parse_event("[rank 1] joined") is None
    assert not is_event('{"step": 1, "event": "train"}', START)
    assert is_event(' {"step": 1,"event":"start"} ', START)


def test_exit_codes_mean_the_same_to_both_halves():
    """The controller's meanings and the operator's retry set are the trainer's own codes."""
    from controller.jobs.read import explain, history

    assert explain.EXIT_MEANINGS is contract.EXIT_MEANINGS
    assert history.RETRYABLE_EXIT_CODES is contract.RETRYABLE_EXIT_CODES
    assert contract.EXIT_PEER_LOST in contract.RETRYABLE_EXIT_CODES
    assert contract.EXIT_PREEMPTED in contract.RETRYABLE_EXIT_CODES
    assert contract.EXIT_CONFIG not in contract.RETRYABLE_EXIT_CODES
    assert contract.EXIT_FAILED not in contract.RETRYABLE_EXIT_CODES
