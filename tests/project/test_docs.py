"""The documentation site builds without a warning, documents the whole
public API, and the README's and docs' relative links lead somewhere.

The build is ``sphinx-build -W --keep-going -b html docs <tmp>`` (warnings
are errors: a docstring whose markup breaks, a page missing from the table
of contents, a link to a page that does not exist). It runs in a child
process that imports the uffdkvm under test first (children.ENV, from /),
so it documents the code these tests import.
"""
from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import uffdkvm
from uffdkvm import kernels
from helpers.children import ENV, python

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
BUILD_S = 300  # about 5 s here; a bound for a hang, not a timing test


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(python("-W", "--keep-going", "-q", "-b", "html",
                                 "-d", out / ".doctrees", ROOT / "docs", out, module="sphinx"),
                          capture_output=True, text=True, timeout=BUILD_S, env=ENV)
    return out, done


def test_site_builds_without_warnings(site):
    out, done = site
    assert done.returncode == 0 and not done.stderr.strip(), \
        f"sphinx-build -W failed ({done.returncode}):\n{done.stderr}"
    assert (out / "index.html").exists()


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(v for k, v in attrs if k == "id" and v)


def test_api_page_documents_every_public_name(site):
    out, done = site
    assert (out / "api.html").exists(), done.stderr
    parser = _Ids()
    parser.feed((out / "api.html").read_text())
    missing = [n for n in uffdkvm.__all__ if f"uffdkvm.{n}" not in parser.ids]
    missing += [f"kernels.{n}" for n in kernels.__all__
                if f"uffdkvm.kernels.{n}" not in parser.ids]
    assert not missing, f"docs/api.md does not document {missing}"


def _anchors(page: Path) -> set[str]:
    """Heading anchors as a Git host and MyST (myst_heading_anchors) make them."""
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            found.add(slug)
    return found


def _links(page: Path):
    in_code = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            for target in LINK.findall(line):
                yield n, target


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for n, target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#") and not target[1:]:
            continue  # http:, mailto:, a scheme of its own: not a file
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}:{n}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.name}:{n}: {target}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_checked():
    # the link check covers the README and every page of the site
    assert {p.name for p in PAGES} >= {"README.md", "index.md", "api.md", "guide.md"}
