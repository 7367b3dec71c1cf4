"""Small tables as text, Markdown and HTML: how a Result shows itself
(``str(r)``, and ``_repr_markdown_`` / ``_repr_html_`` in notebooks)."""
from __future__ import annotations

import html as _html
from collections.abc import Sequence
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


def text(tables: Sequence[Table]) -> str:
    """Aligned plain text: numbers right-aligned, a blank line between tables."""
    out = []
    for t in tables:
        rows = [[_cell(v) for v in row] for row in t.rows]
        grid = ([list(t.columns)] if t.header else []) + rows
        if not grid:
            continue
        widths = [max(len(r[i]) for r in grid) for i in range(len(grid[0]))]
        lines = [t.title]
        for r in grid:
            cells = [c.rjust(w) if t.header else c.ljust(w) for c, w in zip(r, widths,
                                                                             strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def markdown(tables: Sequence[Table]) -> str:
    out = []
    for t in tables:
        if not t.rows:
            continue
        columns = list(t.columns) if t.header else ["", ""]
        lines = [f"**{t.title}**", "", "| " + " | ".join(columns) + " |",
                 "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(v).replace("|", "\\|") for v in row) + " |"
                  for row in t.rows]
        out.append("\n".join(lines))
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
