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
