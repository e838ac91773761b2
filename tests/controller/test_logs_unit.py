"""Log re-attachment without a cluster: timestamps parse in time order, and re-reading a run's
log after a broken stream prints every line exactly once."""

from __future__ import annotations

import pytest

from controller.jobs.follow import LineCursor, split_timestamp


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


def _feed(cursor: LineCursor, raw: list[str]) -> list[str]:
    cursor.restart_pass()
    printed = []
    for line in raw:
        ts, text = split_timestamp(line)
        if cursor.accept(ts):
            printed.append(text)
    return printed


def test_reread_after_break_prints_only_new_lines():
    cursor = LineCursor()
    first = _feed(cursor, _lines(5))
    again = _feed(cursor, _lines(8))  # the stream re-opened from the start, 3 more lines
    assert first == [f"line {i}" for i in range(5)]
    assert again == ["line 5", "line 6", "line 7"]
    assert cursor.count == 8


def test_lines_sharing_one_timestamp_are_counted():
    cursor = LineCursor()
    assert _feed(cursor, _lines(3, same_ts=True)) == ["line 0", "line 1", "line 2"]
    assert _feed(cursor, _lines(5, same_ts=True)) == ["line 3", "line 4"]


def test_rotated_log_reread_skips_by_time_not_by_count():
    cursor = LineCursor()
    _feed(cursor, _lines(10))
    # After a log rotation the re-read starts at line 6: counting lines would drop 7..11.
    assert _feed(cursor, _lines(6, start=6)) == ["line 10", "line 11"]


def test_without_timestamps_falls_back_to_counting():
    cursor = LineCursor()
    assert _feed(cursor, ["a", "b"]) == ["a", "b"]
    assert _feed(cursor, ["a", "b", "c"]) == ["c"]


def test_a_new_run_starts_from_its_first_line():
    old, new = LineCursor(), LineCursor()
    _feed(old, _lines(5))
    assert _feed(new, _lines(2, start=0)) == ["line 0", "line 1"]


def _take(cursor: LineCursor, raw: list[str], batch: int = 4) -> list[str]:
    """Feed ``raw`` as one pass in batches of ``batch`` lines, the way a stream delivers it."""
    cursor.restart_pass()
    printed = []
    for i in range(0, len(raw), batch):
        printed.extend(cursor.take(raw[i : i + batch]))
    return printed


@pytest.mark.parametrize("batch", [1, 3, 100])
def test_take_in_batches_prints_each_line_once_across_rereads(batch):
    cursor = LineCursor()
    assert _take(cursor, _lines(5), batch) == [f"line {i}" for i in range(5)]
    assert _take(cursor, _lines(9), batch) == [f"line {i}" for i in range(5, 9)]
    assert _take(cursor, _lines(4, start=5), batch) == []  # a re-read from `since`: nothing new
    assert _take(cursor, _lines(3, start=8), batch) == ["line 9", "line 10"]
    assert cursor.count == 11


@pytest.mark.parametrize("batch", [1, 2, 100])
def test_take_counts_lines_sharing_a_timestamp_in_the_fast_path(batch):
    cursor = LineCursor()
    assert _take(cursor, _lines(3, same_ts=True), batch) == ["line 0", "line 1", "line 2"]
    assert _take(cursor, _lines(5, same_ts=True), batch) == ["line 3", "line 4"]
    assert cursor.at_last_ts == 5


def test_take_falls_back_to_counting_without_timestamps():
    cursor = LineCursor()
    assert _take(cursor, ["a b", "c d"]) == ["a b", "c d"]
    assert _take(cursor, ["a b", "c d", "e f"]) == ["e f"]


def test_since_is_the_second_of_the_last_line_printed():
    cursor = LineCursor()
    assert cursor.since() is None
    _take(cursor, _lines(12))
    assert cursor.since() == "2026-01-02T03:04:11Z"
