"""Plain text for the terminal: the CLI's tables and `show` fields."""

from __future__ import annotations

import textwrap


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces, a rule under the header."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells):
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def format_fields(fields: list[tuple[str, str]], width: int = 88) -> str:
    """``key: value`` lines for a `show` command, values wrapped under their column ("-" when empty)."""
    lines = []
    for key, value in fields:
        wrapped = textwrap.fill(value, width=width, subsequent_indent=" " * 14) if value else "-"
        lines.append(f"{key + ':':<13} {wrapped}")
    return "\n".join(lines)
