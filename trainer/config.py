"""The one schema of a training run: ``TrainConfig``.

Imports pydantic and PyYAML only (never torch): the controller embeds this model in its job
spec, so a bad trainer setting fails on the laptop, before submission, with the same message
the pod would print.

Precedence: ``key=value`` overrides on the command line > the ``--config`` YAML file > the
defaults written on the fields below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(Exception):
    """A user's configuration mistake: one line per problem, ``<key>: <what> (got <x>)``."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def other_model(path: str | None, detail: str) -> ConfigError:
    """A resume refused: the checkpoint at ``path`` holds another model (``detail``: what did
    not match)."""
    detail = detail if len(detail) <= 100 else detail[:97] + "..."
    return ConfigError(
        [
            f"resume: {path} holds a model of another shape or version (got {detail}). Resume "
            "with the task_args it was written with, or start fresh: resume=never or another "
            "checkpoint.dir"
        ]
    )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CheckpointConfig(_Section):
    """Where and how often rank 0 writes full training state."""

    dir: str = Field(
        "checkpoints",
        description=(
            "Where checkpoints go: a directory, created if missing (on a cluster a volume, needed"
            " only where rank 0 runs), or `s3://bucket/prefix` (S3 or an S3-compatible server:"
            " credentials, region and endpoint from the AWS_* variables; no volume)."
        ),
    )
    every_steps: int = Field(
        100, ge=0, description="Write a checkpoint every N optimizer steps; 0 = only at the end."
    )
    keep: int = Field(3, ge=1, description="Keep the newest N checkpoints, delete older ones.")
    max_attempts: int = Field(
        8,
        ge=1,
        description=(
            "Attempts per S3 request before a save counts as failed, the first included: "
            "boto3's own retries, with exponential backoff (throttling, 5xx answers, timeouts, "
            "refused connections)."
        ),
    )
    retry_mode: Literal["standard", "adaptive"] = Field(
        "standard",
        description=(
            "boto3's retry mode for S3: `standard`, or `adaptive` (also slows its own request "
            "rate while the server throttles)."
        ),
    )
    max_failed_saves: int = Field(
        3,
        ge=0,
        description=(
            "Saves in a row whose write may fail (after the retries) before the job restarts "
            "(exit 138) to resume from its last complete checkpoint; each failure is a "
            "`checkpoint_failed` event, and training goes on. 0 = never restart for it."
        ),
    )

    @field_validator("dir")
    @classmethod
    def _dir_form(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep:
            if not v.strip():
                raise ValueError("must be a directory or `s3://bucket/prefix`")
            return v
        if scheme != "s3":
            raise ValueError("must be a directory or `s3://bucket/prefix` (no other scheme)")
        # S3's bucket naming rules: 3-63 of a-z 0-9 . -, starting and ending alphanumeric.
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", rest.partition("/")[0]):
            raise ValueError("must name a bucket: `s3://bucket/prefix`, bucket 3-63 of a-z 0-9 . -")
        return v


class DDPConfig(_Section):
    """Knobs passed straight to torch.nn.parallel.DistributedDataParallel."""

    bucket_cap_mb: float = Field(25.0, gt=0, description="Gradient bucket size in MiB.")
    find_unused_parameters: bool = Field(
        False, description="Allow parameters that get no gradient in a step (slower)."
    )
    gradient_as_bucket_view: bool = Field(
        True, description="Gradients alias the all-reduce buckets: saves one copy of the grads."
    )
    static_graph: bool = Field(
        False, description="Promise the graph and unused parameters never change between steps."
    )
    broadcast_buffers: bool = Field(
        True,
        description=(
            "Keep every rank's buffers equal to rank 0's: broadcast every forward, as DDP does."
            " A model whose only buffers are BatchNorm statistics (which no training forward"
            " reads) has them broadcast before each evaluation instead."
        ),
    )


class FSDPConfig(_Section):
    """Options of strategy fsdp (torch.distributed.fsdp.fully_shard, FSDP2)."""

    reshard_after_forward: bool = Field(
        True,
        description=(
            "Free each block's gathered parameters after its forward and gather them again for "
            "its backward: the least memory, one more all-gather per block and step. false "
            "keeps them from forward to backward."
        ),
    )
    reduce_each_micro_batch: bool = Field(
        False,
        description=(
            "With grad_accum > 1: reduce-scatter each micro-batch's gradients, so that a rank "
            "keeps only its shard of the gradients between micro-batches (1/world_size of their "
            "memory), at one reduce-scatter per micro-batch. false reduces once per step, in "
            "the last micro-batch's backward, and every rank holds the whole fp32 gradients "
            "until then (4 bytes per parameter)."
        ),
    )


#: What strategy fsdp does not take, and why: ``(field, is_set, why)`` of each, read by
#: TrainConfig's check across fields.
_NOT_UNDER_FSDP = (
    (
        "precision",
        lambda c: c.precision == "fp16",
        "fp16 needs a loss scaler over sharded gradients, whose skipped steps fused AdamW does not "
        "take. Use precision=bf16 (no loss scaling)",
    ),
    (
        "sync_batchnorm",
        lambda c: c.sync_batchnorm,
        "SyncBatchNorm is strategy ddp's. Use strategy=ddp, or a model without BatchNorm",
    ),
    (
        "ddp",
        lambda c: bool(c.ddp.model_fields_set),
        "these are the DDP wrapper's options. Remove them",
    ),
)


class WatchdogConfig(_Section):
    """A rank that hangs, named with where it is, and the job restarted from its last
    checkpoint when the hang lasts; a rank that lags, flagged; a node that failed the job
    twice, left behind."""

    stuck_after_s: float = Field(
        20.0,
        ge=0,
        description=(
            "A rank whose step made no progress this long (or `stuck_step_times` times its "
            "slowest recent step, if longer) prints a `stuck` event with its stack, and rank 0 "
            "names the rank the others wait for. Never during the first step, compiling, "
            "evaluating or checkpointing. 0 = off."
        ),
    )
    stuck_step_times: float = Field(
        10.0, ge=1, description="How many of its slowest recent steps a rank may take to be stuck."
    )
    restart_after_s: float = Field(
        120.0,
        ge=0,
        description=(
            "How long rank 0's verdict on a stuck job may stand before the job restarts itself: "
            "every rank exits 138 (retried by the operator), naming the stuck rank, its node "
            "and frame, and the job resumes from its last complete checkpoint. Set it below "
            "`timeout_s`, which otherwise fails the job first. 0 = never: the job waits for "
            "`timeout_s`."
        ),
    )
    avoid_node_after: int = Field(
        2,
        ge=0,
        description=(
            "A node that hosted a stuck, lost or pre-flight-slow rank of this job this many "
            "times is avoided by the job's next pods (a preferred node anti-affinity on the "
            "job, which the pods' service account must be allowed to patch: k8s/rbac.yaml's "
            "ddpjob-trainer). 0 = never."
        ),
    )
    straggler_factor: float = Field(
        1.5,
        ge=0,
        description=(
            "A rank busy this many times as long per step as the median of the other ranks "
            "(its forward and backward, not waiting for peers), for `straggler_windows` log "
            "windows in a row, is named in a `straggler` event. 0 = off."
        ),
    )
    straggler_windows: int = Field(
        3, ge=1, description="Log windows in a row a rank must be slow to be a straggler."
    )

    @field_validator("straggler_factor")
    @classmethod
    def _factor_above_one(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("must be 0 (off) or above 1")
        return v


class PrometheusConfig(_Section):
    """Prometheus metrics from every rank (trainer/telemetry/metrics.py)."""

    serve: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Serve every rank's metrics at http://<pod>:<port>/metrics: true, false, or auto = "
            "in a Kubernetes pod only (KUBERNETES_SERVICE_HOST is set), not for `python -m "
            "trainer` on a laptop. YAML's on/off mean true/false."
        ),
    )
    port: int = Field(
        9464,
        ge=1,
        le=65535,
        description=(
            "The port the metrics are served on; the pods' prometheus.io/port annotation names it."
        ),
    )


class PreflightConfig(_Section):
    """Before the first step, each rank times a short matmul and a fixed-size message from its
    neighbour, and the job one all-reduce: a rank or a link far slower than the job's median is
    named in a `preflight` event, with its node."""

    enabled: Literal["auto"] | bool = Field(
        "auto", description="true, false, or auto = true when training on GPUs (CUDA)."
    )
    factor: float = Field(
        2.0,
        gt=1,
        description="A rank or link this many times slower than the other ranks' median is named.",
    )
    fail: bool = Field(
        False,
        description=(
            "A slow rank or link restarts the job (exit 138) instead of training slowly, and "
            "counts as a fault of its node (`watchdog.avoid_node_after`)."
        ),
    )


class MlflowConfig(_Section):
    """Experiment tracking in MLflow (trainer/telemetry/tracker.py): one run per job."""

    tracking_uri: str | None = Field(
        None,
        description=(
            "The MLflow tracking server, http(s)://host:port; unset = MLFLOW_TRACKING_URI from "
            "the environment (a spec's env or secret_env), and neither = no tracking."
        ),
    )
    experiment: str | None = Field(
        None,
        description="The experiment; unset = MLFLOW_EXPERIMENT_NAME, else the job's name.",
    )
    max_points: int = Field(
        100_000,
        ge=1,
        description=(
            "Metric points kept while the server does not answer (the oldest go first; the "
            "`done` event counts what never reached it)."
        ),
    )

    @field_validator("tracking_uri")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"https?://[^/]", v):
            raise ValueError("must be an MLflow tracking server's http(s)://host[:port] URL")
        return v


class TrainConfig(_Section):
    """A training run. Every field can be set as ``key=value`` (dotted for sections)."""

    task: str = Field(
        "vision",
        description=(
            "Built-in task (`vision`, `lm`) or your own as `package.module:factory`, where "
            "factory(**task_args) returns a Task."
        ),
    )
    task_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the task factory."
    )
    max_steps: int = Field(200, gt=0, description="Optimizer steps to train for.")
    batch_size: int = Field(32, gt=0, description="Samples per rank per micro-batch.")
    grad_accum: int = Field(
        1, ge=1, description="Micro-batches per optimizer step (one all-reduce per step)."
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="fp32, bf16 autocast, or fp16 autocast with a GradScaler."
    )
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (AdamW).")
    scale_lr: bool = Field(False, description="Multiply lr by world size (linear scaling rule).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps before cosine decay.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Cosine decays to lr * min_lr_ratio at max_steps."
    )
    grad_clip: float = Field(
        1.0, ge=0, description="Clip the global gradient norm to this value; 0 disables."
    )
    sync_batchnorm: bool = Field(False, description="Convert BatchNorm layers to SyncBatchNorm.")
    ema_decay: float | None = Field(
        None, gt=0, lt=1, description="Keep an EMA of the weights with this decay (e.g. 0.999)."
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description=(
            "How the ranks share the model. ddp: every rank holds all of the weights, gradients "
            "and optimizer state, and the gradients are all-reduced (DistributedDataParallel). "
            "fsdp: the three are sharded over the ranks, each rank holding 1/world_size of them "
            "(FSDP2's fully_shard per block and at the root); every rank writes its shard of a "
            "checkpoint, and checkpoint.dir must be one place for all ranks (s3:// or a shared "
            "volume). A checkpoint resumes only under the strategy that wrote it."
        ),
    )
    ddp: DDPConfig = Field(default_factory=DDPConfig, description="DDP wrapper options.")
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig, description="Options of strategy fsdp.")
    activation_checkpointing: bool = Field(
        False,
        description=(
            "Recompute each block's activations in backward instead of keeping them from the "
            "forward: less memory, about one more forward of compute. The blocks are the task's "
            "(a task's `blocks(model)`, else the modules of the model's largest ModuleList)."
        ),
    )
    eval_every: int = Field(
        0, ge=0, description="Evaluate every N steps (metrics reduced across ranks); 0 = at end."
    )
    eval_batches: int = Field(8, ge=1, description="Batches per rank in one evaluation.")
    log_every: int = Field(10, ge=1, description="Print a `train` event every N steps.")
    seed: int = Field(0, ge=0, description="Base seed; each rank seeds with seed + rank.")
    compile: bool = Field(False, description="torch.compile the model.")
    compile_mode: Literal[
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = Field(
        "default",
        description=(
            "torch.compile's mode with compile=true: reduce-overhead replays the steps as CUDA "
            "graphs, the max-autotune modes time GEMM and kernel variants while compiling "
            "(minutes at a GPU-filling size)."
        ),
    )
    attention: Literal["auto", "flash", "cudnn", "efficient", "math"] = Field(
        "auto",
        description=(
            "Which kernel scaled_dot_product_attention runs in every forward: auto = torch's own "
            "choice (flash where it takes the inputs); any other runs only that kernel, and an "
            "input or device it cannot take fails at the first step (cudnn needs a CUDA GPU)."
        ),
    )
    fused_clip: bool = Field(
        False,
        description=(
            "Fold gradient clipping into fused AdamW's step: the global norm is computed as "
            "before, and the step divides each gradient by the clip factor as it reads it, "
            "instead of a pass that scales the gradients first. The same update; fp16 (its "
            "GradScaler owns that factor) clips the usual way."
        ),
    )
    tf32: bool = Field(True, description="Allow TF32 matmuls/convolutions on Ampere+ GPUs.")
    deterministic: bool = Field(
        False, description="Deterministic algorithms (slower; bitwise-reproducible on GPU)."
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="auto = CUDA when available, else CPU."
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Process-group backend; auto = nccl with CUDA, gloo without."
    )
    timeout_s: int = Field(
        600, gt=0, description="Process-group timeout: a collective stuck this long fails."
    )
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpointing."
    )
    resume: str = Field(
        "auto",
        description=(
            "`auto` = continue from the newest valid checkpoint in checkpoint.dir if any; "
            "`never` = start fresh; or a path to a checkpoint file."
        ),
    )
    max_nonfinite_skips: int = Field(
        0,
        ge=0,
        description="Skip up to N steps with a NaN/inf loss before stopping (exit 1); 0 = stop.",
    )
    watchdog: WatchdogConfig = Field(
        default_factory=WatchdogConfig,
        description="Stuck ranks (and the job's restart), stragglers, bad nodes.",
    )
    preflight: PreflightConfig = Field(
        default_factory=PreflightConfig, description="The ranks' check before step 1."
    )
    tensorboard_dir: str | None = Field(
        None, description="Also write scalars for TensorBoard here (rank 0)."
    )
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig, description="Prometheus metrics from every rank."
    )
    mlflow: MlflowConfig = Field(
        default_factory=MlflowConfig, description="Experiment tracking in MLflow (rank 0)."
    )
    progress: Literal["auto", "always", "never"] = Field(
        "auto", description="tqdm bar on rank 0: auto = only when stdout is a TTY."
    )

    @field_validator("task")
    @classmethod
    def _task_form(cls, v: str) -> str:
        if v in ("vision", "lm") or re.fullmatch(r"[\w.]+:\w+", v):
            return v
        raise ValueError("must be `vision`, `lm` or `package.module:factory`")

    @field_validator("resume")
    @classmethod
    def _resume_form(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be `auto`, `never` or a checkpoint path")
        return v

    @model_validator(mode="after")
    def _cross(self) -> TrainConfig:
        if self.warmup_steps >= self.max_steps and self.warmup_steps > 0:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) < max_steps ({self.max_steps}) does not hold"
            )
        if self.strategy == "fsdp":
            for name, is_set, why in _NOT_UNDER_FSDP:
                if is_set(self):
                    value = getattr(self, name)
                    got = value.model_dump(exclude_unset=True) if name == "ddp" else value
                    raise ValueError(f"{name}: not with strategy fsdp (got {got}): {why}")
        return self


# ---------------------------------------------------------------------------------------------
# Errors and loading


def format_errors(err: ValidationError, prefix: str = "") -> list[str]:
    """Render pydantic errors as ``<dotted.key>: <what> (got <x>)`` lines."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        where = loc or "(top level)"
        if e["type"] == "value_error" and isinstance(e.get("input"), dict):
            # A rule across fields: its message names them; the input is the whole mapping.
            lines.append(msg if not loc else f"{loc}: {msg}")
        elif e["type"] in ("missing", "model_type") or "input" not in e:
            lines.append(f"{where}: {msg}")
        else:
            lines.append(f"{where}: {msg} (got {_short(e['input'])})")
    return lines


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "lr=3e-4"]`` into ``{"a": {"b": 1}, "lr": 0.0003}``.

    Values are parsed as YAML scalars (``true``, ``3e-4``, ``[1, 2]``), so the command line
    and the file agree on types.
    """
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
            problems.append(f"{item}: expected key=value with a dotted key (got {item!r})")
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        # YAML reads a plain 1e-3 as a string (no dot); a number is what users mean. A quoted
        # "1e5" stays the string it was written as (a directory may be called that).
        if (
            isinstance(value, str)
            and raw.lstrip()[:1] not in ("'", '"')
            and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value)
        ):
            value = float(value)
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                problems.append(f"{key}: {p} is not a section")
                break
        else:
            node[leaf] = value
    if problems:
        raise ConfigError(problems)
    return out


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested dicts merge, other values replace."""
    merged = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; a missing or unreadable file, text that is not UTF-8, a syntax error
    or a duplicate key becomes a ConfigError naming the file (and the line)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{p}: no such file. Check the path."]) from None
    except OSError as e:
        raise ConfigError([f"{p}: cannot read ({e.strerror})"]) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            [
                f"{p}: not a UTF-8 text file (got byte 0x{raw[e.start]:02x} at offset {e.start}). "
                "Pass the YAML file itself, saved as UTF-8"
            ]
        ) from None
    return parse_yaml(text, str(p))


def parse_yaml(text: str, where: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, except that a key written twice in one
    mapping is an error (PyYAML keeps the last value silently). ``where`` names the source."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters here, before parsing
        node = loader.get_single_node()
        if node is None:
            return None
        problems = _duplicate_keys(loader, node, where)
        if problems:
            raise ConfigError(problems)
        return loader.construct_document(node)
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise ConfigError(
            [
                f"{where}:{line}: not YAML text (got the special character #x{e.character:04x}). "
                "Pass the YAML file itself"
            ]
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{at}: YAML syntax error: {problem}"]) from None
    finally:
        if loader is not None:
            loader.dispose()


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node, where: str) -> list[str]:
    """One line per key written twice in the same mapping, at any depth, in file order. Merge
    keys (``<<: *defaults``) may be overridden: that is what they are for."""
    found: list[tuple[int, str]] = []
    seen_nodes: set[int] = set()  # an alias points at a node already walked
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, path = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend((item, _join(path, i)) for i, item in enumerate(node.value))
        if not isinstance(node, yaml.MappingNode):
            continue
        first: dict[Any, int] = {}  # key -> line of its first occurrence
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                todo.append((value_node, path))
                continue
            key: Any = key_node.value
            if isinstance(key_node, yaml.ScalarNode):
                key = loader.construct_object(key_node)  # `yes`/`true`, `1`/`0x1`: one key
            line = key_node.start_mark.line + 1
            name = _join(path, key_node.value if isinstance(key_node, yaml.ScalarNode) else key)
            todo.append((value_node, name))
            try:
                before = first.get(key)
            except TypeError:  # an unhashable (complex) key: the constructor refuses it anyway
                continue
            if before is None:
                first[key] = line
                continue
            lines = f"twice on line {line}" if before == line else f"on lines {before} and {line}"
            found.append(
                (
                    line,
                    f"{where}:{line}: duplicate key {name} (got it {lines}). "
                    "Keep one: YAML would silently use the last",
                )
            )
    return [text for _, text in sorted(found)]


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def build_config(data: dict[str, Any] | None, overrides: list[str] | None = None) -> TrainConfig:
    """Validate a mapping (plus ``key=value`` overrides) into a TrainConfig or raise ConfigError."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError([f"(top level): expected a mapping of keys (got {_short(data)})"])
    merged = deep_merge(data or {}, parse_overrides(overrides or []))
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Load ``--config FILE`` (optional) and apply overrides; raise ConfigError on any mistake."""
    data = read_yaml(path) if path else None
    return build_config(data, overrides)
