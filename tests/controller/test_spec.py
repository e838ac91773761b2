"""The spec catches every mistake before anything is rendered: location + message, one line each."""

from __future__ import annotations

import re

import pytest

from controller import spec as spec_module
from controller.errors import UserError
from controller.spec import JobSpec, json_pattern, json_schema, parse_quantity, validate_spec
from tests.controller.conftest import minimal

VALID = [
    ("minimal", minimal()),
    ("cpu as int", minimal(resources={"cpu": 4, "memory": "8Gi"})),
    ("cpu millicores", minimal(resources={"cpu": "500m"})),
    ("env int and bool become strings", minimal(env={"OMP_NUM_THREADS": 4, "FLAG": True})),
    ("elastic within range", minimal(nodes=3, elastic={"min_nodes": 2, "max_nodes": 4})),
    ("gang min_available <= nodes", minimal(nodes=4, gang={"min_available": 4})),
    ("gpus with nproc", minimal(nproc_per_node=8, resources={"gpus": 8, "memory": "64Gi"})),
    ("longest name that fits 2 nodes", minimal(name="a" * 54, nodes=2)),  # a...a-worker-0 = 63
    ("custom task", minimal(trainer={"task": "my_pkg.tasks:build", "task_args": {"n": 1}})),
    ("args without trainer", minimal(args=["--foo"])),
    (
        "toleration Exists without key",
        minimal(tolerations=[{"operator": "Exists"}]),
    ),
    (
        "pvc volume",
        minimal(volumes=[{"name": "ckpt", "claim": "ckpt-pvc", "mount_path": "/ckpt"}]),
    ),
]

INVALID = [
    # (case id, spec, expected line: exact location + message)
    ("negative max_steps", minimal(trainer={"max_steps": -5}),
     "trainer.max_steps: Input should be greater than 0 (got -5)"),
    ("trainer typo with hint", minimal(trainer={"max_step": 3}),
     "trainer.max_step: unknown key (got 3). Did you mean max_steps?"),
    ("top-level typo with hint", minimal(nprocs=2),
     "nprocs: unknown key (got 2). Did you mean nproc_per_node?"),
    ("nested typo with hint", minimal(resources={"gpu": 1}),
     "resources.gpu: unknown key (got 1). Did you mean gpus?"),
    ("missing image", {"name": "job"}, "image: Field required"),
    ("missing name", {"image": "x"}, "name: Field required"),
    ("uppercase name", minimal(name="Demo"),
     "name: must be a DNS-1035 label: lowercase letters, digits and -, starting with a letter "
     "and ending with a letter or digit (got Demo)"),
    ("name starts with digit", minimal(name="1job"), "name: must be a DNS-1035 label"),
    ("name too long for one pod", minimal(name="a" * 64),
     "name: must be at most 63 characters (a DNS-1035 label)"),
    ("name too long for worker pods", minimal(name="a" * 55, nodes=2),
     f"name: '{'a' * 55}-worker-0' is 64 characters; pod and service names hold 63. "
     "Shorten name to at most 54 characters"),
    ("zero nodes", minimal(nodes=0), "nodes: Input should be greater than or equal to 1 (got 0)"),
    ("bad cpu", minimal(resources={"cpu": "lots"}),
     "resources.cpu: must be a Kubernetes quantity such as 500m, 2, 512Mi or 16Gi (got lots)"),
    ("negative memory", minimal(resources={"memory": "-1Gi"}),
     "resources.memory: must be a Kubernetes quantity"),
    ("elastic out of range", minimal(nodes=2, elastic={"min_nodes": 3, "max_nodes": 4}),
     "elastic: min_nodes (3) <= nodes (2) <= max_nodes (4) does not hold"),
    ("elastic with clean_pod_policy Running",
     minimal(nodes=2, elastic={"min_nodes": 2, "max_nodes": 2}, clean_pod_policy="Running"),
     "clean_pod_policy: Running deletes the pods still running when the job ends, and the "
     "operator ends an elastic job as soon as any worker succeeds: rank 0 and its log may go "
     "with them (got Running with elastic). Remove clean_pod_policy"),
    ("gang bigger than job", minimal(nodes=2, gang={"min_available": 3}),
     "gang.min_available: min_available (3) <= nodes (2) does not hold"),
    ("more procs than gpus", minimal(nproc_per_node=8, resources={"gpus": 4, "memory": "8Gi"}),
     "nproc_per_node: nproc_per_node (8) <= resources.gpus (4) does not hold; "
     "one process drives one GPU"),
    ("cuda without gpus", minimal(trainer={"device": "cuda"}),
     "trainer.device: cuda needs resources.gpus > 0 (got 0)"),
    ("shm larger than memory", minimal(shm_size="4Gi", resources={"memory": "2Gi"}),
     "shm_size: shm_size (4Gi) <= resources.memory (2Gi) does not hold"),
    ("operator env", minimal(env={"RANK": "0"}),
     "env: RANK is set by the training operator; remove it"),
    ("PET_ env", minimal(env={"PET_NNODES": "2"}),
     "env: PET_NNODES is set by the training operator"),
    ("env and secret_env clash",
     minimal(env={"TOKEN": "a"}, secret_env={"TOKEN": {"secret": "s", "key": "k"}}),
     "secret_env: TOKEN also set in env; keep one"),
    ("secret without key", minimal(secret_env={"TOKEN": {"secret": "s"}}),
     "secret_env.TOKEN.key: Field required"),
    ("relative mount", minimal(volumes=[{"name": "d", "claim": "c", "mount_path": "data"}]),
     "volumes.0.mount_path: must be an absolute path (got data)"),
    ("reserved mount", minimal(volumes=[{"name": "d", "claim": "c", "mount_path": "/dev/shm"}]),
     "volumes.0.mount_path: is mounted by ddpjob itself"),
    ("reserved volume name", minimal(volumes=[{"name": "dshm", "claim": "c", "mount_path": "/d"}]),
     "volumes.0.name: is used by ddpjob itself"),
    ("duplicate mount path", minimal(volumes=[
        {"name": "a", "claim": "c", "mount_path": "/d"},
        {"name": "b", "claim": "c", "mount_path": "/d/"},
    ]), "volumes: mount_path /d is used twice"),
    ("bad label key", minimal(labels={"bad key": "x"}), "labels: bad key: key name"),
    ("reserved label", minimal(labels={"app.kubernetes.io/name": "x"}),
     "labels: app.kubernetes.io/name is set by ddpjob or the operator; remove it"),
    ("bad restart policy", minimal(restart_policy="Sometimes"),
     "restart_policy: Input should be 'ExitCode', 'OnFailure', 'Never' or 'Always' "
     "(got Sometimes)"),
    ("exists with value", minimal(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
     "tolerations.0: operator Exists takes no value; remove value or use Equal"),
    ("args and trainer", minimal(args=["x"], trainer={"max_steps": 3}),
     "args: set either args or trainer, not both"),
    ("warmup >= max_steps (trainer's own rule)", minimal(trainer={"max_steps": 10,
                                                                  "warmup_steps": 10}),
     "trainer: warmup_steps (10) < max_steps (10) does not hold"),
    ("empty command", minimal(command=[]), "command: must not be empty"),
    ("queue not a name", minimal(queue="Team A"), "queue: must be a Kubernetes"),
]  # fmt: skip


@pytest.mark.parametrize("data", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_specs_validate(data):
    spec = validate_spec(data)
    assert spec.name == data["name"]


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_specs_name_location_and_message(data, expected):
    with pytest.raises(UserError) as info:
        validate_spec(data)
    problems = info.value.problems
    assert any(p.startswith(expected) for p in problems), problems
    assert info.value.exit_code == 2


def test_every_problem_is_reported_once_per_line():
    data = minimal(name="Bad", nodes=0, trainer={"max_steps": -1, "lr": "abc"})
    with pytest.raises(UserError) as info:
        validate_spec(data)
    locations = sorted(p.split(":")[0] for p in info.value.problems)
    assert locations == ["name", "nodes", "trainer.lr", "trainer.max_steps"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [(None, "(top level): the spec is empty"), ([1, 2], "(top level): expected a mapping")],
)
def test_non_mapping_documents(data, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        validate_spec(data)


def test_env_values_are_strings_in_user_order():
    spec = validate_spec(minimal(env={"B": 2, "A": True, "C": "x"}))
    assert list(spec.env.items()) == [("B", "2"), ("A", "true"), ("C", "x")]


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2", "2"), ("1Ki", "1024"), ("1.5Gi", str(1.5 * 2**30)), ("1e3", "1E+3")],
)
def test_parse_quantity(text, value):
    from decimal import Decimal

    assert parse_quantity(text) == Decimal(value)


def test_every_field_has_a_description():
    schema = json_schema()
    missing = []
    for model_name, model in [("JobSpec", schema), *schema.get("$defs", {}).items()]:
        for field, prop in model.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{model_name}.{field}")
    assert not missing, missing


def test_every_model_forbids_unknown_keys():
    schema = json_schema()
    models = [schema, *schema["$defs"].values()]
    objects = [m for m in models if m.get("type") == "object" and "properties" in m]
    assert objects and all(m.get("additionalProperties") is False for m in objects)


@pytest.mark.parametrize(
    "rx",
    ["DNS1035_LABEL", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "LABEL_NAME", "LABEL_KEY",
     "ENV_NAME", "SECRET_KEY", "QUANTITY"],
)  # fmt: skip
def test_schema_patterns_match_what_the_validators_match(rx):
    """The spec's JSON Schema (and through it the chart's) carries each validator regex as a
    pattern that JSON Schema searches: it must accept exactly the strings the regex fullmatches.
    (No newlines among the samples: Python's `$` also matches before a final newline, Go's not.)
    """
    regex = getattr(spec_module, rx)
    pattern = re.compile(json_pattern(regex))
    samples = [
        "", "a", "job", "a-b", "-a", "a-", "1a", "A", "Ab_c.d", "a.b", "a..b", ".a", "a b",
        "example.com/x", "Example.com/x", "example.com/", "/x", "a/b/c", "x" * 63, "x" * 64,
        "a" * 62 + "-", "500m", "1.5Gi", ".5", "1e3", "2E-3", "-1", "1.", "16Gi", "1Gb", "lots",
        "\u0661", "OMP_NUM_THREADS", "_x", "x.y-z", "9abc",
    ]  # fmt: skip
    wrong = [s for s in samples if bool(pattern.search(s)) != bool(regex.fullmatch(s))]
    assert not wrong, (rx, pattern.pattern, wrong)


def test_worker_replicas_and_world_size():
    plain = JobSpec.model_validate(
        minimal(nodes=4, nproc_per_node=2, resources={"gpus": 2, "memory": "4Gi"})
    )
    elastic = JobSpec.model_validate(minimal(nodes=3, elastic={"min_nodes": 1, "max_nodes": 4}))
    assert (plain.worker_replicas, plain.world_size) == (3, 8)
    assert (elastic.worker_replicas, elastic.world_size) == (3, 3)
