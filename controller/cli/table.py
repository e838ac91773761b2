"""Plain text tables, like kubectl's: columns padded to their widest cell."""

from __future__ import annotations


def format_table(rows: list[list[str]]) -> str:
    """``rows`` (the first is the header) as aligned lines, trailing spaces trimmed."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
