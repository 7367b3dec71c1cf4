"""Render uffdkvm's plain-text docstrings as reStructuredText.

uffdkvm's docstrings are written to read well in ``help()``: a field or
argument list is two aligned columns, a name and its meaning, continued on
lines indented to the meaning's column::

    vcpus            vCPUs, each in its own host thread
    mem_per_vcpu     bytes each vCPU demand-pages: an int, or "64M", "1G"
                     (continued here)

reStructuredText reads that as broken indentation. This hook, run on each
docstring after napoleon (which handles Google-style sections, if any),
turns each such block into a definition list, and an indented example after
a paragraph into a literal block. Everything else passes through untouched,
so genuine markup errors in a docstring still fail the build.
"""
from __future__ import annotations

import re
from typing import Any

# A column-0 line "name   meaning": a name (or "a, b"), two or more spaces, text.
ITEM = re.compile(r"^(?P<name>[A-Za-z_][\w.\[\]]*(?:, ?[A-Za-z_][\w.\[\]]*)*)"
                  r"(?P<gap> {2,})(?P<text>\S.*)$")


def _name(name: str) -> str:
    return ", ".join(f"``{n.strip()}``" for n in name.split(","))


def convert(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = ITEM.match(line)
        if m:
            if out and out[-1].strip():
                out.append("")
            while m:
                col = len(m["name"]) + len(m["gap"])
                out += [_name(m["name"]), "   " + m["text"]]
                i += 1
                while i < len(lines) and lines[i].startswith(" " * col) and lines[i].strip():
                    out.append("   " + lines[i].strip())
                    i += 1
                m = ITEM.match(lines[i]) if i < len(lines) else None
            out.append("")
            continue
        prev = out[-1] if out else ""
        before = next((x for x in reversed(out) if x.strip()), "")
        if (line.startswith(" ") and line.strip() and not prev.strip() and before
                and not before.startswith((" ", "..", ":")) and not before.endswith("::")):
            out += ["::", ""]  # a literal block: an indented example after a paragraph
        out.append(line)
        i += 1
    return out


def _process(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = convert(lines)


def setup(app: Any) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.napoleon")
    app.connect("autodoc-process-docstring", _process, priority=600)  # after napoleon (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
