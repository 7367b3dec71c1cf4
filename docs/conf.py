"""Sphinx configuration for uffdkvm's documentation.

Build: pip install '.[docs]' && sphinx-build -W --keep-going -b html docs docs/_build
The pages are Markdown (MyST), so they read the same on a Git host as here;
the API reference comes from the package's docstrings (Google style, napoleon).
"""
import glob
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# autodoc documents the uffdkvm next to docs/ when it is built in place
# (python setup.py build_ext --inplace), else the one installed.
if glob.glob(os.path.join(ROOT, "uffdkvm", "_core*.so")):
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

import uffdkvm  # noqa: E402

project = "uffdkvm"
author = "uffdkvm contributors"
release = uffdkvm.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "columns",  # docs/_ext/columns.py: the docstrings' aligned name/meaning lists
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

# Headings get anchors (#privileges) as on a Git host, so the same links work in both.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"uffdkvm {release}"


# Links from the pages to files outside docs/ that the site carries a copy of:
# the pages keep the path that works on a Git host, the site links its copy.
SITE_COPIES = {"../benchmarks/RESULTS.md": "benchmarks.md"}


def _site_links(app, docname, source):
    for path, page in SITE_COPIES.items():
        source[0] = source[0].replace(f"]({path})", f"]({page})")


def setup(app):
    app.connect("source-read", _site_links)
