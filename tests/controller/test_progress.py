"""Progress: the trainer's JSON events -> state, ETA, a live bar on a TTY, passthrough elsewhere."""

from __future__ import annotations

import io
import json

import pytest

from controller.progress import Eta, Progress, describe, format_duration
from trainer.contract import parse_event


def ev(name, **fields):
    return json.dumps({"event": name, **fields})


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"event": "train", "step": 3}\n', {"event": "train", "step": 3}),
        ('  {"event": "done"}  ', {"event": "done"}),
        ("[rank 0] INFO model: 0.02M parameters", None),
        ('{"step": 3}', None),  # JSON, but not an event
        ('{"event": 3}', None),
        ("{not json}", None),
        ("", None),
    ],
)
def test_parse_event(line, expected):
    assert parse_event(line) == expected


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "--:--"), (-1, "--:--"), (0, "0:00"), (65.4, "1:05"),
                          (3725, "1:02:05")],
)  # fmt: skip
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_not_a_tty_passes_every_line_through_unchanged():
    lines = [
        "[rank 0] INFO starting",
        ev("train", step=10, max_steps=100, loss=1.5, step_time_s=0.5),
        ev("eval", step=10, metrics={"accuracy": 0.5}),
        "completed at step 100/100",
    ]
    out = io.StringIO()
    progress = Progress(out)  # a StringIO is not a terminal
    for line in lines:
        progress.feed(line + "\n")
    progress.close()
    assert out.getvalue() == "".join(line + "\n" for line in lines)
    assert (progress.step, progress.max_steps, progress.loss) == (10, 100, 1.5)


def test_a_batch_of_lines_is_the_same_as_each_line_fed():
    lines = [
        "[rank 0] INFO starting",
        ev("train", step=10, max_steps=100, loss=1.5, step_time_s=0.5),
        "",
        ev("done", step=100, max_steps=100, reason="completed"),
    ]
    one, batch = io.StringIO(), io.StringIO()
    a, b = Progress(one), Progress(batch)
    for line in lines:
        a.feed(line)
    b.feed_lines(lines[:2])
    b.feed_lines(lines[2:])
    assert batch.getvalue() == one.getvalue() == "".join(line + "\n" for line in lines)
    assert (b.step, b.loss, b.done) == (a.step, a.loss, a.done) and b.done is not None


def test_eta_from_the_trainers_step_time_smoothed():
    progress = Progress(io.StringIO())
    progress.feed(ev("train", step=10, max_steps=110, loss=1.0, step_time_s=0.5))
    assert progress.eta_s == pytest.approx(100 * 0.5)
    progress.feed(ev("train", step=20, max_steps=110, loss=0.9, step_time_s=1.5))
    assert progress.eta_s == pytest.approx(90 * 1.0)  # mean of 0.5 and 1.5
    progress.feed(ev("done", step=110, max_steps=110, reason="completed"))
    assert progress.eta_s == 0.0 and progress.done["reason"] == "completed"


def test_eta_from_wall_clock_when_the_event_has_no_step_time():
    now = [100.0]
    eta = Eta(clock=lambda: now[0])
    assert eta.update(10, 100) is None  # one sample: no rate yet
    now[0] += 20.0
    assert eta.update(20, 100) == pytest.approx(80 * 2.0)  # 10 steps in 20 s
    now[0] += 1.0
    assert eta.update(5, 100) is None  # restarted from an earlier checkpoint: start over


def test_live_bar_shows_human_lines_not_raw_train_events():
    out = io.StringIO()
    progress = Progress(out, live=True)
    progress.feed(ev("start", world_size=2, device="cpu", step=0))
    progress.feed(ev("train", step=50, max_steps=100, loss=0.25, samples_per_s=900.0,
                     step_time_s=0.1))  # fmt: skip
    progress.feed(ev("eval", step=50, metrics={"accuracy": 0.875, "loss": 0.3}))
    progress.feed(ev("checkpoint", step=50, path="ckpt/step_50.pt"))
    progress.feed("a plain [bold]line[/bold] stays literal")
    progress.close()
    text = out.getvalue()
    assert "started: world size 2 on cpu" in text
    assert "eval @ step 50: accuracy 0.875, loss 0.3" in text
    assert "checkpoint @ step 50: ckpt/step_50.pt" in text
    assert "a plain [bold]line[/bold] stays literal" in text
    assert "50/100" in text and "loss 0.2500" in text
    assert '"event": "train"' not in text


def test_describe_failure_and_unknown_events():
    assert describe({"event": "done", "step": 7, "max_steps": 10, "reason": "error",
                     "error": "RuntimeError: boom"}) == (
        "stopped (error) at step 7/10: RuntimeError: boom"
    )  # fmt: skip
    assert describe({"event": "custom", "x": 1}) == '{"event": "custom", "x": 1}'
    assert describe({"event": "train", "step": 1}) is None


def test_notes_stay_out_of_the_passthrough_stream(capsys):
    out = io.StringIO()
    progress = Progress(out)
    progress.feed(ev("train", step=1, max_steps=2))
    progress.note("pod restarted (exit 137)")
    assert "restarted" not in out.getvalue()
    assert capsys.readouterr().err == "pod restarted (exit 137)\n"
    live_out = io.StringIO()
    live = Progress(live_out, live=True)
    live.note("pod restarted (exit 137)")
    live.close()
    assert "pod restarted (exit 137)" in live_out.getvalue()
