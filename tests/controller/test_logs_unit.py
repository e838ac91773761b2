"""Log re-attachment without a cluster: timestamps parse in time order, and re-reading a run's
log after a broken stream prints every line exactly once."""

from __future__ import annotations

import random

import pytest

from controller.jobs.read.loglines import LineCursor, split_timestamp


def test_split_timestamp_orders_any_fraction_width():
    a, text = split_timestamp("2026-01-02T03:04:05.1Z hello world")
    b, _ = split_timestamp("2026-01-02T03:04:05.12Z x")
    c, _ = split_timestamp("2026-01-02T03:04:05.123456789Z x")
    d, _ = split_timestamp("2026-01-02T03:04:06Z x")
    assert text == "hello world"
    assert a == ("2026-01-02T03:04:05", 100_000_000)
    assert a < b < c < d


def test_split_timestamp_leaves_plain_lines_alone():
    assert split_timestamp("step 3 loss 2.1") == (None, "step 3 loss 2.1")
    assert split_timestamp("") == (None, "")
    assert split_timestamp('{"event": "train"}') == (None, '{"event": "train"}')


def _lines(n: int, start: int = 0, same_ts: bool = False) -> list[str]:
    out = []
    for i in range(start, start + n):
        ts = "2026-01-02T03:04:05.000000001Z" if same_ts else f"2026-01-02T03:04:{i:02d}.5Z"
        out.append(f"{ts} line {i}")
    return out


def _take(cursor: LineCursor, raw: list[str], batch: int = 4, end: bool = True) -> list[str]:
    """Feed ``raw`` as one pass in batches of ``batch`` lines, the way a stream delivers it;
    ``end``: a read that is not followed, which ends with the log."""
    cursor.restart_pass()
    printed = []
    for i in range(0, len(raw), batch):
        printed.extend(cursor.take(raw[i : i + batch]))
    if end:
        printed.extend(cursor.end_pass())
    return printed


def _served(log: list[str], since: str | None) -> list[str]:
    """What the kubelet sends of ``log`` from ``since`` on: each line stamped at or after that
    second, in file order (kuberuntime/logs: a line ``Before(since)`` is skipped)."""
    return [x for x in log if since is None or x[:19] >= since.removesuffix("Z")]


@pytest.mark.parametrize("batch", [1, 3, 100])
def test_take_in_batches_prints_each_line_once_across_rereads(batch):
    cursor = LineCursor()
    assert _take(cursor, _lines(5), batch) == [f"line {i}" for i in range(5)]
    assert _take(cursor, _lines(9), batch) == [f"line {i}" for i in range(5, 9)]
    assert _take(cursor, _lines(5, start=4), batch) == []  # a re-read from `since`: nothing new
    assert _take(cursor, _lines(4, start=7), batch) == ["line 9", "line 10"]
    assert cursor.count == 11


@pytest.mark.parametrize("batch", [1, 2, 100])
def test_lines_sharing_one_timestamp_are_told_apart(batch):
    cursor = LineCursor()
    assert _take(cursor, _lines(3, same_ts=True), batch) == ["line 0", "line 1", "line 2"]
    assert _take(cursor, _lines(5, same_ts=True), batch) == ["line 3", "line 4"]


@pytest.mark.parametrize("batch", [1, 2, 100])
def test_a_line_printed_twice_in_a_row_is_skipped_twice(batch):
    same = "2026-01-02T03:04:05.000000001Z "
    cursor = LineCursor()
    assert _take(cursor, [same + "x", same, same], batch) == ["x", "", ""]
    assert _take(cursor, [same + "x", same, same, same + "y"], batch) == ["y"]
    assert cursor.last_run == 1


def test_rotated_log_reread_resumes_after_the_last_line_printed():
    cursor = LineCursor()
    _take(cursor, _lines(10))
    # After a log rotation the re-read starts at line 6: counting lines would drop 7..11.
    assert _take(cursor, _lines(6, start=6)) == ["line 10", "line 11"]


def test_a_log_rotated_past_the_last_line_printed_is_all_new():
    cursor = LineCursor()
    _take(cursor, _lines(10))  # the last line printed is stamped :09.5
    # The kubelet serves the current file only: lines 10.. after a rotation. A followed
    # stream learns that the last line printed will not come at a line stamped 2 s after it
    # (:11 on); what it held until then is printed with it, in order.
    cursor.restart_pass()
    assert cursor.take(_lines(1, start=10)) == []
    assert cursor.take(_lines(2, start=11)) == ["line 10", "line 11", "line 12"]
    assert cursor.take(_lines(1, start=13)) == ["line 13"]
    # A read that is not followed learns it at its end (a rotation soon after line 13).
    assert _take(cursor, _lines(1, start=14)) == ["line 14"]
    assert cursor.count == 15


def test_lines_without_timestamps_are_matched_by_text():
    cursor = LineCursor()
    assert _take(cursor, ["a b", "c d"]) == ["a b", "c d"]
    assert cursor.since() is None  # nothing to resume from but the beginning
    assert _take(cursor, ["a b", "c d", "e f"]) == ["e f"]


def test_an_ended_run_read_without_timestamps_skips_by_count():
    cursor = LineCursor(timestamps=False)
    assert _take(cursor, ["a", "b"]) == ["a", "b"]
    assert _take(cursor, ["a", "b", "c"]) == ["c"]


def test_since_is_the_second_before_the_last_line_printed():
    cursor = LineCursor()
    assert cursor.since() is None
    _take(cursor, _lines(12))
    assert cursor.since() == "2026-01-02T03:04:10Z"
    _take(cursor, ["2026-01-01T00:00:00.5Z happy new year"])
    assert cursor.since() == "2025-12-31T23:59:59Z"


# containerd stamps a container's stdout and stderr lines in two goroutines and writes them to
# one file, so the file's order is not the timestamps' order: here the trainer's stderr block
# about a lost peer is written before its stdout `done` event but stamped after it.
RUN = [
    "2026-11-22T21:50:00.5Z train 45",
    "2026-11-22T21:50:01.2Z [rank 0] lost a peer",  # stderr
    "2026-11-22T21:50:01.25Z   rank 2 exited",  # stderr
    '2026-11-22T21:50:01.1Z {"event": "done", "reason": "peer_lost"}',  # stdout
]
TEXTS = [line.partition(" ")[2] for line in RUN]


@pytest.mark.parametrize("batch", [1, 2, 100])
@pytest.mark.parametrize("live", range(len(RUN) + 1))
def test_a_final_read_after_out_of_order_stamps_prints_each_line_once(batch, live):
    """The stream delivered the first ``live`` lines, then the run ended and its log was read
    once more from ``since()``: every line exactly once (this printed the stderr block and the
    `done` event twice when the cursor compared timestamps)."""
    cursor = LineCursor()
    printed = _take(cursor, RUN[:live], batch, end=False)
    printed += _take(cursor, _served(RUN, cursor.since()), batch)
    assert printed == TEXTS


def test_a_new_line_stamped_before_the_last_one_printed_is_not_lost():
    """Re-attached just after a stderr line stamped at 01.0001, the next line in the file (from
    stdout) is stamped 00.9999, a second earlier: ``since`` reaches back to it."""
    log = [
        "2026-11-22T21:50:00.5Z a",
        "2026-11-22T21:50:01.0001Z b",
        "2026-11-22T21:50:00.9999Z c",
        "2026-11-22T21:50:01.5Z d",
    ]
    cursor = LineCursor()
    assert _take(cursor, log[:2], end=False) == ["a", "b"]
    assert _take(cursor, _served(log, cursor.since()), end=False) == ["c", "d"]


@pytest.mark.parametrize("seed", range(40))
def test_any_cut_of_a_log_with_out_of_order_stamps_prints_it_exactly_once(seed):
    """A log written in order, stamped up to 0.9 s before it was written (stderr and stdout
    interleaved), with repeated texts and lines repeated verbatim; read live in pieces cut
    anywhere, each re-read from ``since()`` served as the kubelet does, the last not followed:
    the lines printed are the log, once each, in file order."""
    rnd = random.Random(seed)
    log, wrote_ns = [], 10**9
    for i in range(rnd.randrange(20, 120)):
        wrote_ns += rnd.choice([10**6, 10**7, 2 * 10**8, 7 * 10**8])
        stamp_ns = wrote_ns - rnd.choice([0, 0, 3 * 10**8, 9 * 10**8]) + i  # unique stamps
        sec, ns = divmod(stamp_ns, 10**9)
        text = rnd.choice(["step", "loss 2.1", "", '{"event": "train"}', f"line {i}"])
        line = f"2026-11-22T21:{50 + sec // 60:02d}:{sec % 60:02d}.{ns:09d}Z {text}"
        log.extend([line] * rnd.choice([1, 1, 1, 2]))
    cuts = sorted(rnd.sample(range(1, len(log)), rnd.randrange(1, 6)))
    cursor = LineCursor()
    printed: list[str] = []
    for cut in cuts:  # each pass: the stream delivered the log up to `cut`, then broke
        printed += _take(
            cursor, _served(log[:cut], cursor.since()), rnd.choice([1, 3, 50]), end=False
        )
    printed += _take(cursor, _served(log, cursor.since()), rnd.choice([1, 3, 50]))
    assert printed == [line.partition(" ")[2] for line in log]
