"""Kubernetes resource quantities (``500m``, ``16Gi``, ``1e3``) as numbers: what the spec
validates and what ``doctor``, ``status`` and the queue reading add up. A module of its own so
that reading a cluster's objects does not import the spec's pydantic models."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# ASCII digits only: Kubernetes reads no others (Python's \d would take any Unicode digit).
QUANTITY = re.compile(
    r"(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][-+]?[0-9]+)?"
)
_SUFFIX_FACTOR = {
    None: Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}  # fmt: skip


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity (``500m``, ``16Gi``, ``1e3``) as a number; ValueError if not."""
    m = QUANTITY.fullmatch(text)
    if not m:
        raise ValueError("must be a Kubernetes quantity such as 500m, 2, 512Mi or 16Gi")
    suffix = m["suffix"]
    try:
        if suffix and suffix[0] in "eE":
            return Decimal(m["num"] + suffix)
        return Decimal(m["num"]) * _SUFFIX_FACTOR[suffix]
    except InvalidOperation:  # pragma: no cover - the regex admits only valid numbers
        raise ValueError("not a number") from None


def format_bytes(n: float) -> str:
    """``n`` bytes for a person: ``512 B``, ``9.8 KiB``, ``1.4 MiB`` (binary units)."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"
