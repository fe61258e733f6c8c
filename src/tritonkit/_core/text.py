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


def parse_case_tokens(tokens: list[str]) -> dict:
    """One ``--case`` of the CLI: KEY=VALUE tokens, each VALUE an integer, a float, true or false, integers joined
    by 'x' (a shape, e.g. shape=16384x4096), or else a word (kv=int8). Which keys a kernel takes, and of which
    type, is its case type's to say (``Case.parse`` names a value of the wrong type)."""
    case = {}
    for token in tokens:
        key, sep, text = token.partition("=")
        if not sep or not key or not text:
            raise ValueError(f"--case expects KEY=VALUE tokens, got {token!r}")
        case[key] = _case_value(text)
    return case


def _case_value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        if "x" in text:
            return tuple(int(part) for part in text.split("x"))
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text
