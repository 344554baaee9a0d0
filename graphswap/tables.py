"""Plain-text tables for reports: left-aligned columns, a dashed rule under the header."""

from __future__ import annotations


def format_table(headers, rows, row_suffixes=None) -> list[str]:
    """Lines of a table; `row_suffixes` (one string per row) are appended after the last column."""
    headers = [str(h) for h in headers]
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    lines = [line(headers), line("-" * w for w in widths)]
    suffixes = row_suffixes or [""] * len(rows)
    lines += [line(row) + suffix for row, suffix in zip(rows, suffixes)]
    return lines
