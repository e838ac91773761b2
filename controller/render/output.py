"""YAML output that means the same to Go (kubectl, helm) as to Python."""

from __future__ import annotations

import re
from typing import Any

# Plain scalars that YAML readers other than PyYAML take for something other than a string: Go's
# yaml (kubectl, helm) reads y/n as booleans and 1e-05, 0o17, 0b1, 1_000 as numbers. PyYAML
# would write them unquoted, so quote them ourselves.
_GO_NON_STRING = re.compile(
    r"""^(?:[yYnN]|[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"""
    r"""|[-+]?0[xX][0-9a-fA-F_]+|[-+]?0[oO][0-7_]+|[-+]?0[bB][01_]+|[-+]?\.(?:inf|Inf|INF)"""
    r"""|\.(?:nan|NaN|NAN)|~|null|Null|NULL|true|True|TRUE|false|False|FALSE"""
    r"""|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"""
)


def to_yaml(obj: Any) -> str:
    """Block-style YAML with the dict's own key order (what ``render -o yaml`` prints).

    Strings that Go's YAML would read as booleans or numbers are double-quoted, so
    ``render | kubectl apply -f -`` and ``render --values`` mean the same to Go as to Python.
    """
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = '"' if _GO_NON_STRING.match(data) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, str_representer)
    return yaml.dump(obj, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def dump(obj: Any, fmt: str) -> str:
    """``obj`` as ``fmt`` text: "yaml" (:func:`to_yaml`) or "json" (indented)."""
    if fmt == "json":
        import json

        return json.dumps(obj, indent=2) + "\n"
    return to_yaml(obj)
