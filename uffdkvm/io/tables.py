"""Small tables as text, Markdown and HTML: how a Result shows itself
(``str(r)``, and ``_repr_markdown_`` / ``_repr_html_`` in notebooks), and
the grids the CLI prints (:func:`aligned` for the run command's per-thread
tables, :func:`markdown_grid` for the sweep's comparison table)."""
from __future__ import annotations

import html as _html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Table:
    """A titled table; ``header=False`` for a two-column list of key, value."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    header: bool = True


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def aligned(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, header: bool = True,
            cell: Callable[[Any], str] = _cell) -> list[str]:
    """A grid as lines of aligned text, columns two spaces apart, each cell
    ``cell(value)`` (None as "-" by default). With a header its columns are
    right-aligned, so numbers line up under it; without one (a list of key,
    value) left-aligned. No line has trailing spaces."""
    grid = ([[str(c) for c in columns]] if header else []) + \
        [[cell(v) for v in row] for row in rows]
    if not grid:
        return []
    widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
    return ["  ".join(c.rjust(w) if header else c.ljust(w)
                      for c, w in zip(r, widths, strict=True)).rstrip() for r in grid]


def markdown_grid(columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                  cell: Callable[[Any], str] = _cell) -> list[str]:
    """A grid as the lines of a Markdown table: the header, its rule, a line
    per row; a "|" in a cell is escaped."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |"
              for row in rows]
    return lines


def text(tables: Sequence[Table]) -> str:
    """Aligned plain text: numbers right-aligned, a blank line between tables."""
    out = []
    for t in tables:
        lines = aligned(t.columns, t.rows, header=t.header)
        if lines:
            out.append("\n".join([t.title, *("  " + line for line in lines)]))
    return "\n\n".join(out)


def markdown(tables: Sequence[Table]) -> str:
    out = []
    for t in tables:
        if not t.rows:
            continue
        columns = list(t.columns) if t.header else ["", ""]
        out.append("\n".join([f"**{t.title}**", "", *markdown_grid(columns, t.rows)]))
    return "\n\n".join(out)


def html(tables: Sequence[Table]) -> str:
    out = []
    for t in tables:
        if not t.rows:
            continue
        parts = [f"<table><caption>{_html.escape(t.title)}</caption>"]
        if t.header:
            parts.append("<tr>" + "".join(f"<th>{_html.escape(c)}</th>" for c in t.columns)
                         + "</tr>")
        for row in t.rows:
            parts.append("<tr>" + "".join(f"<td>{_html.escape(_cell(v))}</td>" for v in row)
                         + "</tr>")
        parts.append("</table>")
        out.append("".join(parts))
    return "\n".join(out)
