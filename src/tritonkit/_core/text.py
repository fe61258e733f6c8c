"""Plain-text tables for the terminal (the CLI's listings and reports)."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces, a rule under the header."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells):
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])
