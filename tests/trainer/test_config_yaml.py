"""A trainer config file that is not what it should be: a binary file passed by mistake, a key
written twice. Exit 2 with one line naming the file (and the lines), no traceback, no events."""

from __future__ import annotations

import pytest

from tests.trainer.conftest import run, trainer_cmd
from trainer.config import ConfigError, load_config, read_yaml


def test_a_binary_config_file_exits_2_naming_the_file(tmp_path) -> None:
    cfg = tmp_path / "model.pt"
    cfg.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xb7\xfa\x00\xff" * 64)
    r = run(trainer_cmd("--config", str(cfg)))
    assert r.rc == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"{cfg}: not a UTF-8 text file (got byte 0xb7 at offset 10). "
        "Pass the YAML file itself, saved as UTF-8"
    ]
    assert r.stdout == ""


def test_undecodable_bytes_name_their_offset(tmp_path) -> None:
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("max_steps: 10\ntask: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        read_yaml(cfg)
    assert info.value.problems == [
        f"{cfg}: not a UTF-8 text file (got byte 0xe9 at offset 23). "
        "Pass the YAML file itself, saved as UTF-8"
    ]


def test_control_characters_name_their_line(tmp_path) -> None:
    cfg = tmp_path / "nul.yaml"
    cfg.write_bytes(b"max_steps: 10\nlr: 0.1\x00\n")
    with pytest.raises(ConfigError) as info:
        read_yaml(cfg)
    assert info.value.problems == [
        f"{cfg}:2: not YAML text (got the special character #x0000). Pass the YAML file itself"
    ]


def test_a_utf8_bom_is_fine(tmp_path) -> None:
    cfg = tmp_path / "bom.yaml"
    cfg.write_bytes(b"\xef\xbb\xbfmax_steps: 7\n")
    assert load_config(cfg).max_steps == 7


def test_a_duplicate_key_exits_2_naming_the_key_and_both_lines(tmp_path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_steps: 10\nlr: 0.1\nmax_steps: 20\n")
    r = run(trainer_cmd("--config", str(cfg)))
    assert r.rc == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"{cfg}:3: duplicate key max_steps (got it on lines 1 and 3). "
        "Keep one: YAML would silently use the last"
    ]
    assert r.stdout == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "checkpoint:\n  dir: a\n  every_steps: 5\n  dir: b\n",
            ["4: duplicate key checkpoint.dir (got it on lines 2 and 4)"],
        ),
        ("ddp: {static_graph: true, static_graph: false}\n", ["1: duplicate key ddp.static_graph"]),
        ("task_args:\n  yes: 1\n  true: 2\n", ["3: duplicate key task_args.true"]),
        (
            "lr: 1\nbetas: [0.9, 0.99]\nlr: 2\ncheckpoint:\n  keep: 1\n  keep: 2\n",
            ["3: duplicate key lr", "6: duplicate key checkpoint.keep"],
        ),
    ],
    ids=["nested", "flow", "same-value-different-spelling", "two-at-once"],
)
def test_duplicates_at_any_depth_are_each_reported(tmp_path, text, expected) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(cfg)
    assert len(info.value.problems) == len(expected)
    for line, want in zip(info.value.problems, expected, strict=True):
        assert line.startswith(f"{cfg}:{want}"), line


def test_a_merge_key_may_be_overridden(tmp_path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("defaults: &d {every_steps: 5, keep: 2}\ncheckpoint:\n  <<: *d\n  keep: 4\n")
    assert read_yaml(cfg)["checkpoint"] == {"every_steps": 5, "keep": 4}
