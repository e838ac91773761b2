"""The Helm chart's ``values.schema.json``, derived from the job spec's JSON Schema.

Pure, like ``render_values`` beside it: the spec's model in, a JSON Schema dict out
(``make generate`` writes it to charts/ddpjob/values.schema.json). Descriptions, types, enums,
bounds, patterns and the nested objects (Resources, Volume, Toleration, Gang, Elastic,
SecretKeyRef) are the spec's own (``JobSpec.model_json_schema()``), so a rule added to the spec
reaches the chart. Where the values differ from the spec (values.py says how and why), these
rules reshape the spec's schema, in this order:

1. ``trainer`` goes: it arrives as ``args``, already a list of ``key=value`` strings, and as
   ``metrics_port`` (the port its metrics are served on, 0 for none), added last.
2. A key that is ``X | null`` in the spec takes the shape ``render_values`` gives it: a string
   (``priority_class``, ``service_account``, ``queue``) is ``""`` when unset, not null; a list
   (``command``, ``args``) is always written, so null goes; a number or a section
   (``active_deadline_s``, ``ttl_after_finished_s``, ``gang``, ``elastic``) stays null when unset.
3. ``name`` and ``namespace`` may also be ``""``: the chart then uses the release's full name and
   namespace.
4. ``env`` and ``secret_env`` are lists, not maps: each item is ``{name, ...}``, where ``name`` is
   the map's key schema (``propertyNames``) and the rest its value schema. ``env`` values are
   strings: the spec turns numbers and booleans into strings before anything is rendered.
5. Required: at the top and in ``resources``, every key whose chart default is a value (not
   null, "" or empty): Helm merges it in from values.yaml, so it is missing only when a user
   writes null to take it away, and the templates need it; ``image`` too. Not ``name`` and
   ``namespace`` (empty means the release's). In ``gang`` and ``elastic``, whose chart default is
   null, a field the spec defaults must be written (``elastic.max_restarts``): there is no
   default to merge and the templates do not repeat the spec's. List items (volumes,
   tolerations) require what the spec requires: the templates apply the spec's defaults there
   (``operator | default "Equal"``, ``if .read_only``).
6. The top-level defaults are the values ``render_values`` writes for a spec of defaults (what
   values.yaml holds; a test checks), ``""`` for name and namespace; image has none.
7. Helm's ``global`` is allowed: Helm hands it to every chart.
8. ``workdir`` is what was packed, not the folder: null, or ``{digest, config_map, url,
   git_commit, git_dirty, archive}`` (``render --values`` writes it); ``workdir_store`` goes,
   folded into ``workdir.url``.

Every object stays strict (``additionalProperties: false``), as in the spec. The spec's ``$defs``
are inlined (each is used once), and the schema is draft-07: Helm 3.18 validates with
santhosh-tekuri/jsonschema, which reads the draft that ``$schema`` names (04 up to 2020-12), and
Helm before 3.18 with gojsonschema, which reads up to draft-07. A keyword draft-07 does not know
(which a validator would silently ignore) is an error here.
"""

from __future__ import annotations

import copy
from typing import Any

from controller.render.values import render_values
from controller.spec import JobSpec

DRAFT = "http://json-schema.org/draft-07/schema#"

# Every keyword of draft-07 (json-schema.org/draft-07/schema).
DRAFT7_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$ref", "$comment", "title", "description", "default", "readOnly",
        "writeOnly", "examples", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "additionalItems", "items",
        "maxItems", "minItems", "uniqueItems", "contains", "maxProperties", "minProperties",
        "required", "additionalProperties", "definitions", "properties", "patternProperties",
        "dependencies", "propertyNames", "const", "enum", "type", "format", "contentMediaType",
        "contentEncoding", "if", "then", "else", "allOf", "anyOf", "oneOf", "not",
    }
)  # fmt: skip

# What an empty name or namespace means to the chart (rule 3).
_EMPTY_MEANS = {
    "name": "Empty: the release's full name.",
    "namespace": "Empty: the release's namespace (`helm install -n ...`).",
}
_ARGS_DESCRIPTION = (
    "Container args: the spec's trainer settings as sorted `key=value` strings (what "
    "`render --values` writes), or your own args. Empty: the trainer's defaults."
)
_GLOBAL = {"description": "Helm's values shared with parent charts; unused here.", "type": "object"}
_METRICS_PORT = {
    "description": (
        "The port the trainer serves its Prometheus metrics on (the spec's "
        "trainer.prometheus.port; what `render --values` writes): the pods' prometheus.io "
        "annotations and the PodMonitor name it. 0: the trainer serves none "
        "(trainer.prometheus.serve: off)."
    ),
    "type": "integer",
    "minimum": 0,
    "maximum": 65535,
}


def values_schema() -> dict[str, Any]:
    """The JSON Schema of the chart's values (draft-07), from ``JobSpec``'s."""
    spec = JobSpec.model_json_schema()
    defs = spec.get("$defs", {})
    defaults = render_values(JobSpec(name="x", image="x")) | {"name": "", "namespace": ""}

    properties: dict[str, Any] = {"global": _GLOBAL}
    for key, field in spec["properties"].items():
        if key in ("trainer", "workdir_store"):  # rules 1 and 8
            continue
        prop = _unset_as_rendered(_inline(field, defs))  # rule 2
        if key in _EMPTY_MEANS:  # rule 3
            prop = _or_empty(prop, _EMPTY_MEANS[key])
        if key in ("env", "secret_env"):  # rule 4
            prop = _map_as_list(key, prop)
        if key == "args":  # rule 1: the trainer's settings arrive here
            prop["description"] = _ARGS_DESCRIPTION
        if key == "workdir":  # rule 8
            prop = _workdir(prop)
        prop = _defaults_required(prop)  # rule 5, in a section (resources, gang, elastic)
        prop.pop("default", None)
        if key != "image":  # rule 6
            prop["default"] = defaults[key]
        properties[key] = prop

    properties["metrics_port"] = {**_METRICS_PORT, "default": defaults["metrics_port"]}  # rule 1

    required = ["image"] + [  # rule 5, at the top
        k for k, v in defaults.items() if k not in ("name", "namespace") and _is_a_value(v)
    ]
    schema = {
        "$schema": DRAFT,
        "title": "ddpjob chart values",
        "description": (
            "One ddpjob training job (a Kubeflow PyTorchJob). Mirrors the ddpjob job spec "
            "(controller/spec.py); `python -m controller render SPEC --values` writes these "
            "values."
        ),
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": [k for k in properties if k in required],
    }
    _check_draft7(schema)
    return schema


# --------------------------------------------------------------------------------------------
# The rules


def _unset_as_rendered(prop: dict[str, Any]) -> dict[str, Any]:
    """Rule 2: ``X | null`` as render_values writes it (strings "", lists always, else null)."""
    branches = prop.get("anyOf", [])
    if {"type": "null"} not in branches or len(branches) != 2:
        return prop
    (value,) = [b for b in branches if b != {"type": "null"}]
    rest = {k: v for k, v in prop.items() if k != "anyOf"}
    if value.get("type") == "string":
        rest["description"] = f"{rest.get('description', '')} Empty: not set.".strip()
        return {**rest, "anyOf": [{"const": ""}, value]}
    if value.get("type") == "array":
        return {**rest, **value}
    return prop


#: The object ``render --values`` writes for a shipped workdir (values.py's workdir_values).
_WORKDIR_FIELDS = {
    "digest": ("sha256:<hex> of the archive's tar stream.", {"pattern": "^sha256:[0-9a-f]{64}$"}),
    "config_map": ("The ConfigMap the chart creates with the archive; empty with a url.", {}),
    "url": ("Where the pods fetch the archive (s3://...); empty with a config_map.", {}),
    "git_commit": ("The commit of the packed folder's repository; empty outside git.", {}),
    "git_dirty": (
        'Whether the packed files differed from it: "true", "false", or empty outside git.',
        {"enum": ["", "true", "false"]},
    ),
    "archive": ("The archive (.tar.gz), base64, for the chart's ConfigMap; empty with a url.", {}),
}


def _workdir(prop: dict[str, Any]) -> dict[str, Any]:
    """Rule 8: null, or what ``render --values`` packed (the chart cannot read a folder)."""
    shape = {
        "description": "What render --values packed and where the pods fetch it.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            k: {"description": d, "type": "string", **extra}
            for k, (d, extra) in _WORKDIR_FIELDS.items()
        },
        "required": list(_WORKDIR_FIELDS),
    }
    return {"description": prop["description"], "anyOf": [{"type": "null"}, shape]}


def _or_empty(prop: dict[str, Any], meaning: str) -> dict[str, Any]:
    """Rule 3: ``""`` or the spec's string; the description says what empty means."""
    outer = {k: prop.pop(k) for k in ("description", "default") if k in prop}
    outer["description"] = f"{outer.get('description', '')} {meaning}".strip()
    return {**outer, "anyOf": [{"const": ""}, prop]}


def _map_as_list(key: str, prop: dict[str, Any]) -> dict[str, Any]:
    """Rule 4: a map of ``name -> value`` as a list of ``{name, ...}`` (its order is kept)."""
    name = {"description": "Variable name.", "type": "string", **prop["propertyNames"]}
    value = prop["additionalProperties"]
    if key == "env":
        # The spec accepts numbers and booleans and turns them into strings.
        item = {
            "properties": {
                "name": name,
                "value": {"description": "Its value (a string).", "type": "string"},
            },
            "required": ["name", "value"],
        }
        shape = "{name, value}"
    else:
        item = {
            "description": value.get("description", ""),
            "properties": {"name": name, **value["properties"]},
            "required": ["name", *value.get("required", [])],
        }
        shape = "{name, " + ", ".join(value["properties"]) + "}"
    return {
        "description": f"{prop['description']} A list of {shape}.",
        "type": "array",
        "items": {"type": "object", "additionalProperties": False, **item},
    }


def _defaults_required(prop: dict[str, Any]) -> dict[str, Any]:
    """Rule 5 in a section (or the section branch of ``section | null``): a field with a
    value default is required too. Anything else (a list, a map) is left as it is."""
    for obj in [prop, *prop.get("anyOf", [])]:
        if obj.get("type") == "object" and "properties" in obj:
            defaulted = [k for k, p in obj["properties"].items() if _is_a_value(p.get("default"))]
            needed = set(obj.get("required", [])) | set(defaulted)
            if needed:
                obj["required"] = [k for k in obj["properties"] if k in needed]
    return prop


def _is_a_value(v: Any) -> bool:
    return v is not None and v not in ("", [], {})


# --------------------------------------------------------------------------------------------
# Plumbing: inline the spec's $defs, drop pydantic's generated titles, check the draft


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with every ``$ref`` to ``#/$defs/X`` replaced by X (the referring schema's own
    keywords win; a field's description comes first, then its model's) and pydantic's titles
    dropped."""
    if isinstance(schema, list):
        return [_inline(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = copy.deepcopy(defs[schema["$ref"].removeprefix("#/$defs/")])
        own = {k: v for k, v in schema.items() if k != "$ref"}
        if "description" in own and "description" in target:
            own["description"] = f"{own['description']} {target['description']}"
        schema = {**target, **own}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key == "properties":  # a map of names, not a schema: its keys are field names
            out[key] = {name: _inline(s, defs) for name, s in value.items()}
        else:
            out[key] = _inline(value, defs)
    return _description_first(out)


def _description_first(schema: dict[str, Any]) -> dict[str, Any]:
    """Readers look for what a key means, then its type (pydantic sorts keys alphabetically)."""
    first = [k for k in ("description", "type") if k in schema]
    return {k: schema[k] for k in [*first, *(k for k in schema if k not in first)]}


_SUBSCHEMA = ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else")


def _check_draft7(schema: Any, where: str = "$") -> None:
    """Raise ValueError on a keyword draft-07 does not know: validators skip those silently."""
    if not isinstance(schema, dict):
        return
    unknown = sorted(set(schema) - DRAFT7_KEYWORDS)
    if unknown:
        raise ValueError(f"{where}: not draft-07 keywords: {', '.join(unknown)}")
    for name, sub in schema.get("properties", {}).items():
        _check_draft7(sub, f"{where}.properties.{name}")
    for key in _SUBSCHEMA:
        _check_draft7(schema.get(key), f"{where}.{key}")
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(schema.get(key, [])):
            _check_draft7(sub, f"{where}.{key}[{i}]")
