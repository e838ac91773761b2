"""values_schema: the chart's values schema is the spec's, reshaped by the rules it lists.

helm itself validates with it in tests/packaging/test_chart.py (bad values rejected, every example
and branch spec accepted); here, without helm: what comes from the spec, and the draft.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.render.values import render_values
from controller.render.values_schema import DRAFT, _check_draft7, values_schema
from controller.spec import JobSpec

# The spec's sections whose fields the chart's values carry (TrainConfig arrives as args).
SECTIONS = ("Resources", "SecretKeyRef", "Volume", "Toleration", "Gang", "Elastic")


def _descriptions(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["description"]} if isinstance(schema.get("description"), str) else set()
        return found.union(*(_descriptions(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_descriptions(v) for v in schema))
    return set()


def test_every_spec_description_reaches_the_values_schema():
    spec = JobSpec.model_json_schema()
    wanted = {
        p["description"]
        for key, p in spec["properties"].items()
        # args: the chart's own words (rule 1); workdir_store: folded into workdir (rule 8)
        if key not in ("trainer", "args", "workdir_store")
    }
    for section in SECTIONS:
        model = spec["$defs"][section]
        wanted |= {model["description"], *(p["description"] for p in model["properties"].values())}
    have = _descriptions(values_schema())
    # A reshaped key says more (the values' shape), a section also its model's docstring.
    missing = sorted(w for w in wanted if not any(w in h for h in have))
    assert not missing, missing


def test_unset_keys_take_the_shape_render_values_writes():
    """Rule 2: "" for names, always a list for command/args, null for numbers and sections; the
    defaults are what render_values writes for a spec of defaults (rule 6)."""
    props = values_schema()["properties"]
    written = render_values(JobSpec(name="x", image="x"))
    for key in ("priority_class", "service_account", "queue", "name", "namespace"):
        assert {"const": ""} in props[key]["anyOf"], key
        assert {"type": "null"} not in props[key]["anyOf"], key
    for key in ("command", "args"):
        assert props[key]["type"] == "array" and "anyOf" not in props[key], key
    for key in ("active_deadline_s", "ttl_after_finished_s", "gang", "elastic"):
        assert {"type": "null"} in props[key]["anyOf"], key
        assert written[key] is None
    for key, value in written.items():
        if key not in ("name", "namespace", "image"):
            assert props[key]["default"] == value, key


def test_env_and_secret_env_items_carry_the_spec_key_and_value_rules():
    """Rule 4: the map's key schema becomes `name`, its value schema the other keys."""
    spec = JobSpec.model_json_schema()
    props = values_schema()["properties"]
    for key in ("env", "secret_env"):
        name = props[key]["items"]["properties"]["name"]
        assert {k: name[k] for k in ("pattern", "not")} == spec["properties"][key]["propertyNames"]
    ref = spec["$defs"]["SecretKeyRef"]
    item = props["secret_env"]["items"]
    assert item["required"] == ["name", *ref["required"]]
    for field in ref["properties"]:
        assert item["properties"][field]["pattern"] == ref["properties"][field]["pattern"]
    assert props["env"]["items"]["properties"]["value"]["type"] == "string"


def test_the_schema_is_draft7_and_self_contained():
    schema = values_schema()
    assert schema["$schema"] == DRAFT == "http://json-schema.org/draft-07/schema#"
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text


def test_a_keyword_draft7_does_not_know_is_an_error():
    """2020-12's prefixItems (a tuple field, say) would be skipped by a draft-07 validator."""
    with pytest.raises(ValueError, match=r"\$\.properties\.pair: not draft-07 keywords: prefix"):
        _check_draft7({"type": "object", "properties": {"pair": {"prefixItems": []}}})
    _check_draft7(values_schema())  # and the real one passes
