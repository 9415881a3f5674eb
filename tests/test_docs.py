"""The README, the settings reference and the user docs hold what they should.

The README is valid reStructuredText whose links work off the checkout, the settings
reference documents every setting the package reads exactly once, and the user docs name
no commit or run.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import docutils.core
import docutils.nodes
import docutils.utils
import pytest

from tests.helpers import ROOT

SETTINGS_PAGE = ROOT / "docs" / "settings.rst"

#: A setting name as the package reads it: a quoted string literal.
_READ = re.compile(r"""["'](HOSTQUEUE_[A-Z0-9_]*[A-Z0-9])["']""")
#: A setting's entry in the reference: the ``setting`` directive docs/conf.py defines.
_ENTRY = re.compile(r"^\.\. setting:: (HOSTQUEUE_\S+)\s*$", re.MULTILINE)
#: What a commit hash or a benchmark run id looks like.
_HISTORY = re.compile(r"[0-9a-f]{7,40}\b|2026[0-9]{4}-[0-9]{6}")


def settings_read_by_the_package() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "scrapy_hostqueue").rglob("*.py"):
        names.update(_READ.findall(path.read_text()))
    return names


def settings_reference_problems(read: set[str], page: str) -> list[str]:
    """Say what is wrong between the settings the package reads and their entries."""
    entries = Counter(_ENTRY.findall(page))
    problems = [f"{name}: no '.. setting::' entry" for name in sorted(read - set(entries))]
    problems += [f"{name}: {count} entries" for name, count in sorted(entries.items()) if count > 1]
    problems += [
        f"{name}: documented but not read by the package" for name in sorted(set(entries) - read)
    ]
    return problems


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


def relative_links(source: str) -> list[str]:
    """List the link and image targets of *source* that name no scheme.

    README.rst is also the package's long description (setup.cfg), shown where
    ``docs/...`` leads nowhere: each of its targets must be an absolute URL.
    """
    silent = {"report_level": 5, "halt_level": 5}
    tree = docutils.core.publish_doctree(source, settings_overrides=silent)
    found: dict[str, None] = {}
    for node in tree.findall(docutils.nodes.Element):
        for attribute in ("refuri", "uri"):
            target = node.get(attribute)
            if target is not None and not urlsplit(target).scheme:
                found[target] = None
    return list(found)


def test_readme_has_no_relative_link() -> None:
    assert relative_links((ROOT / "README.rst").read_text()) == []


def test_the_link_check_finds_relative_links_and_images() -> None:
    source = (
        "See `settings <docs/settings.rst>`__, `Scrapy <https://scrapy.org>`_, and\n"
        "changes_.\n\n.. _changes: CHANGES.rst\n\n"
        ".. image:: docs/benchmark.png\n\n.. image:: https://example.com/chart.png\n"
    )
    assert relative_links(source) == ["docs/settings.rst", "CHANGES.rst", "docs/benchmark.png"]


def test_every_setting_read_by_the_package_has_one_entry() -> None:
    read = settings_read_by_the_package()
    assert "HOSTQUEUE_MAX_ACTIVE_HOSTS" in read
    assert len(read) > 20
    assert settings_reference_problems(read, SETTINGS_PAGE.read_text()) == []


def test_the_settings_check_finds_missing_duplicate_and_stale_entries() -> None:
    page = (
        ".. setting:: HOSTQUEUE_A\n\nHOSTQUEUE_A\n~~~~~~~~~~~\n\n"
        ".. setting:: HOSTQUEUE_B\n\n.. setting:: HOSTQUEUE_B\n\n"
        ".. setting:: HOSTQUEUE_OLD\n"
    )
    assert settings_reference_problems({"HOSTQUEUE_A", "HOSTQUEUE_B", "HOSTQUEUE_C"}, page) == [
        "HOSTQUEUE_C: no '.. setting::' entry",
        "HOSTQUEUE_B: 2 entries",
        "HOSTQUEUE_OLD: documented but not read by the package",
    ]


@pytest.mark.parametrize(
    "path",
    [ROOT / "README.rst", ROOT / "CHANGES.rst", *sorted((ROOT / "docs").glob("*.rst"))],
    ids=lambda path: path.name,
)
def test_user_docs_name_no_commit_or_run(path: Path) -> None:
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _HISTORY.search(line)
    ]
    assert not found
