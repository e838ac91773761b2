"""The CLI: exit codes 0/2, one `error:` line per problem, no traceback, and a cheap start."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import yaml

from controller.cli.main import main
from controller.errors import UserError
from controller.render.pytorchjob import render_pytorchjob
from controller.spec import json_schema, load_spec
from tests.controller.conftest import PYTHON, REPO, minimal

QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


def test_validate_ok(capsys):
    assert main(["validate", QUICKSTART]) == 0
    assert "quickstart.yaml: ok (quickstart: 2 node(s)" in capsys.readouterr().out


def test_validate_reports_each_problem_and_exits_2(write_spec, capsys):
    path = write_spec(minimal(trainer={"max_steps": -5}, nprocs=2))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "error: trainer.max_steps: Input should be greater than 0 (got -5)" in err
    assert "error: nprocs: unknown key (got 2). Did you mean nproc_per_node?" in err
    assert len(err) == 2


def test_yaml_syntax_error_has_line_and_column(write_spec, capsys):
    path = write_spec("name: job\nimage: x\ntrainer:\n  max_steps: [1\n  lr: 2\n")
    assert main(["validate", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}:5:")
    assert "YAML syntax error" in line


def test_missing_file_said_plainly(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    expected = f"error: {tmp_path / 'nope.yaml'}: no such file. Check the path.\n"
    assert capsys.readouterr().err == expected


def test_a_binary_spec_exits_2_with_one_line_naming_the_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"\x80\x02}q\x00(X\x05\x00\x00\x00model" + bytes(range(256)))
    r = _run("submit", str(path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"error: {path}: not a UTF-8 text file (got byte 0x80 at offset 0). "
        "Pass the YAML file itself, saved as UTF-8"
    ]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "name: a\nimage: x\nnodes: 2\nname: b\n",
            "4: duplicate key name (got it on lines 1 and 4)",
        ),
        (
            "name: a\nimage: x\nnodes: 2\ntrainer:\n  max_steps: 5\nnodes: 3\n",
            "6: duplicate key nodes (got it on lines 3 and 6)",
        ),
        (
            "name: a\nimage: x\ntrainer:\n  checkpoint:\n    dir: /a\n    dir: /b\n",
            "6: duplicate key trainer.checkpoint.dir (got it on lines 5 and 6)",
        ),
        (
            "name: a\nimage: x\nenv: {A: '1', B: '2', A: '3'}\n",
            "3: duplicate key env.A (got it twice on line 3)",
        ),
    ],
    ids=["name", "nodes", "nested", "flow"],
)
def test_a_duplicate_key_in_a_spec_is_an_error(write_spec, capsys, text, line):
    path = write_spec(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}:{line}. Keep one: YAML would silently use the last\n"


def test_set_overrides_a_spec_field(write_spec, capsys):
    path = write_spec(minimal())
    assert main(["validate", str(path), "--set", "trainer.max_steps=0"]) == 2
    assert "trainer.max_steps: Input should be greater than 0 (got 0)" in capsys.readouterr().err
    spec = load_spec(str(path), ["nodes=3", "trainer.lr=1e-4"])
    assert (spec.nodes, spec.trainer.lr) == (3, 1e-4)


def test_load_spec_raises_user_error(write_spec):
    with pytest.raises(UserError) as info:
        load_spec(str(write_spec("- a list\n")))
    assert info.value.problems == ["(top level): expected a mapping of keys (got list)"]


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_render_prints_the_manifest(fmt, capsys):
    assert main(["render", QUICKSTART, "-o", fmt]) == 0
    out = capsys.readouterr().out
    got = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert got == render_pytorchjob(load_spec(QUICKSTART))
    if fmt == "yaml":
        # The golden file is this output under its generated-file comment lines.
        golden = (REPO / "tests/controller/golden/quickstart.yaml").read_text()
        assert golden.endswith(out)
        assert all(line.startswith("# ") for line in golden[: -len(out)].splitlines())


def test_render_values_hands_the_spec_to_the_chart_values(capsys):
    assert main(["render", QUICKSTART, "--values", "-o", "json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["name"] == "quickstart" and values["nodes"] == 2


def test_run_needs_local(capsys):
    assert main(["run", QUICKSTART]) == 2
    assert "only --local is supported" in capsys.readouterr().err


def test_schema_command_prints_it(capsys):
    """The schema `make generate` writes to controller/spec.schema.json (with its mark)."""
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["title"] == "ddpjob job spec"
    assert printed == json_schema()


def test_examples_point_editors_at_the_schema():
    for example in sorted((REPO / "examples").glob("*.yaml")):
        first = example.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../controller/spec.schema.json", example


# Put first on sys.meta_path: any import of torch or the kubernetes client fails loudly.
BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "kubernetes", "kubeflow"):
                raise ImportError(f"blocked import of {name}")
    sys.meta_path.insert(0, Block())
""")
RUN_CONTROLLER = (
    "import runpy, sys\n"
    "sys.argv = ['controller', *sys.argv[1:]]\n"
    "runpy.run_module('controller', run_name='__main__', alter_sys=True)\n"
)


def _run(*args: str, blocker: bool = False) -> subprocess.CompletedProcess:
    code = (BLOCKER if blocker else "") + RUN_CONTROLLER
    return subprocess.run(
        [PYTHON, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_user_mistake_prints_no_traceback_but_debug_does(write_spec):
    path = str(write_spec(minimal(nodes=0)))
    plain = _run("validate", path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("error: nodes: Input should be greater than or equal to 1")
    debug = _run("--debug", "validate", path)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("validate", QUICKSTART),
        ("render", QUICKSTART),
        ("render", "-o", "json", QUICKSTART),
        ("schema",),
    ],
    ids=["help", "validate", "render", "render-json", "schema"],
)
def test_cli_works_with_torch_and_kubernetes_blocked(args):
    result = _run(*args, blocker=True)
    assert result.returncode == 0, result.stderr
    assert "blocked import" not in result.stderr
    assert result.stdout


def test_the_blocker_really_blocks():
    # If the blocker were broken, the test above would prove nothing.
    for module in ("torch", "kubernetes"):
        result = subprocess.run(
            [PYTHON, "-c", BLOCKER + f"import {module}"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode != 0 and f"blocked import of {module}" in result.stderr


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("validate", "render", "schema", "run"):
        assert command in out


def test_hints_after_submit_name_only_pods_that_exist():
    from controller.cli.advice import kubectl_hints
    from controller.jobs.read.explain import is_elastic, max_pods

    fixed = render_pytorchjob(load_spec(QUICKSTART))
    elastic = render_pytorchjob(
        load_spec(QUICKSTART, ["nodes=3", "elastic.min_nodes=2", "elastic.max_nodes=4"])
    )
    assert (is_elastic(fixed), is_elastic(elastic), max_pods(elastic)) == (False, True, 4)
    assert "kubectl logs -f quickstart-master-0 -c pytorch -n default" in kubectl_hints(
        "quickstart", "default"
    )
    text = kubectl_hints("quickstart", "default", elastic=True, max_pods=max_pods(elastic))
    assert "master" not in text
    assert (
        "kubectl logs -f -l training.kubeflow.org/job-name=quickstart -c pytorch -n default "
        "--prefix --max-log-requests 4"
    ) in text
    assert "python -m controller logs -f quickstart -n default" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--since", "10 minutes"], "error: --since: not a duration (got '10 minutes')"),
        (["--since", "5"], "error: --since: not a duration (got '5')"),
        (["--tail", "-3"], "error: --tail: must be 0 or more (got -3)"),
    ],
)
def test_logs_refuses_a_bad_since_or_tail_before_asking_the_cluster(args, said, capsys):
    # No kubeconfig is read: the mistake is the user's, said in one line, exit 2.
    assert main(["logs", "job", "--kubeconfig", "/nonexistent", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and "Traceback" not in err


def test_since_is_a_go_duration_as_kubectl_takes_it():
    from datetime import datetime, timedelta, timezone

    from controller.cli.log_commands import _since_time

    for text, seconds in (("30s", 30), ("5m", 300), ("1h30m", 5400), ("1.5h", 5400)):
        got = datetime.strptime(_since_time(text), "%Y-%m-%dT%H:%M:%SZ")
        want = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=seconds)
        assert abs((got - want).total_seconds()) < 5, (text, got, want)
    assert _since_time(None) is None


@pytest.mark.parametrize("command", ["goodput", "status"])
@pytest.mark.parametrize("price", ["-1", "nan"])
def test_a_price_below_zero_is_refused_before_asking_the_cluster(command, price, capsys):
    code = main([command, "job", "--kubeconfig", "/nonexistent", "--price-per-gpu-hour", price])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --price-per-gpu-hour: must be 0 or more (got {float(price)})")
    assert "Traceback" not in err


def test_validate_says_each_rank_s_model_state_and_warns_when_it_cannot_fit(write_spec, capsys):
    lm = {"task": "lm", "task_args": {"n_layer": 32, "n_embd": 4096, "n_head": 32}}
    spec = minimal(trainer=lm, resources={"gpus": 8, "gpu_memory": "80Gi"}, nproc_per_node=8)
    path = write_spec(spec)
    assert main(["validate", str(path)]) == 0  # a warning: what else a run needs is estimated
    out, err = capsys.readouterr()
    assert err == (
        f"{path}: warning: model state per rank: 96 GiB (6.4B parameters x 16 bytes on every "
        "rank, strategy ddp): more than 80% of a 80 GiB GPU (64 GiB). Use strategy fsdp over "
        "at least 2 GPUs, or a smaller model\n"
    )
    assert main(["validate", str(path), "--set", "trainer.strategy=fsdp"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[1] == (
        f"{path}: model state per rank: 12 GiB (6.4B parameters x 16 bytes/8 ranks, strategy "
        "fsdp): fits in 80% of a 80 GiB GPU (64 GiB)"
    )
