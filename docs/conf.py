"""Sphinx configuration of the scrapy-hostqueue documentation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import scrapy_hostqueue  # noqa: E402

project = "scrapy-hostqueue"
author = "the scrapy-hostqueue developers"
copyright = "the scrapy-hostqueue developers"
release = scrapy_hostqueue.__version__
version = release

extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"scrapy-hostqueue {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# Signatures without annotations: the annotations name private and third-party
# types that have no page here, and the prose says what each argument is.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options: dict[str, Any] = {}

nitpicky = True
nitpick_ignore = [
    # StartRequestsMiddleware's docstring names the length of its time slice.
    ("py:data", "SLICE"),
    # HostQueueScheduler's docstring names Scrapy's scheduler method, which
    # Scrapy's own documentation describes.
    ("py:meth", "next_request"),
]


def setup(app: Any) -> None:
    # ``.. setting:: NAME`` declares a setting, ``:setting:`NAME``` links to it,
    # and each declaration goes into the index.
    app.add_crossref_type("setting", "setting", indextemplate="pair: %s; setting")
