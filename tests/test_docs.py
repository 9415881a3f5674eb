"""The README is valid reStructuredText and documents every setting the package reads."""

from __future__ import annotations

import re
from pathlib import Path

import docutils.core
import docutils.utils

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_valid_restructuredtext() -> None:
    source = (ROOT / "README.rst").read_text()
    problems: list[str] = []

    class Collect:
        def write(self, text: str) -> None:
            problems.append(text)

    docutils.core.publish_doctree(
        source,
        settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": Collect()},
    )
    assert not "".join(problems)


def test_every_setting_read_by_the_package_is_documented() -> None:
    readme = (ROOT / "README.rst").read_text()
    names = set()
    for path in (ROOT / "scrapy_hostqueue").rglob("*.py"):
        names.update(re.findall(r"HOSTQUEUE_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert "HOSTQUEUE_MAX_ACTIVE_HOSTS" in names
    missing = sorted(name for name in names if name not in readme)
    assert not missing
