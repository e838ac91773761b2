"""Trainer settings -> container args: ``key=value`` strings ``python -m trainer`` reads back.

Shared by every renderer (PyTorchJob, TrainJob, Helm values) and ``run --local``, so a setting
means the same wherever the job runs.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel


def trainer_args(config: BaseModel) -> list[str]:
    """The settings the user set, as sorted ``key=value`` strings with dotted section keys.

    Only fields the spec set are passed (the trainer's defaults stay the trainer's). Each value is
    written so that ``yaml.safe_load`` in ``python -m trainer`` reads back exactly the value the
    spec validated: plain words stay plain, other strings are double-quoted, floats always carry a
    dot (PyYAML reads ``1e-05`` as a string), dicts and lists become YAML flow collections.
    """
    pairs = sorted(_flatten(config, ""))
    return [f"{key}={value}" for key, value in pairs]


def _flatten(model: BaseModel, prefix: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name in model.model_fields_set:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.extend(_flatten(value, f"{prefix}{name}."))
        else:
            out.append((prefix + name, encode_value(value)))
    return out


_PLAIN = re.compile(r"[A-Za-z_/][-A-Za-z0-9_./:@+]*")


def encode_value(value: Any, *, nested: bool = False) -> str:
    """``value`` as YAML text that ``yaml.safe_load`` turns back into ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _encode_float(value)
    if isinstance(value, str):
        if not nested and _PLAIN.fullmatch(value) and _reads_back(value):
            return value
        return quote(value)
    if isinstance(value, dict):
        items = (f"{quote(str(k))}: {encode_value(v, nested=True)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(encode_value(v, nested=True) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as a trainer argument")


# Characters PyYAML reads literally inside double quotes; everything else is escaped. Line
# breaks (\x85, \u2028, \u2029) are printable but would be folded, so they are escaped too.
_YAML_LITERAL = re.compile("[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back to exactly ``text``."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif _YAML_LITERAL.match(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _encode_float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"  # YAML 1.1 floats need a dot: 1e-05 would read back as a string
    return mantissa + e + exponent


def _reads_back(text: str) -> bool:
    import yaml  # already imported by trainer.config; local to keep the module's top light

    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False
