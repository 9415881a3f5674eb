"""One name per concept in the user docs, the README and the package's docstrings.

They use the glossary's words, never a retired spelling.

Inline literals (````...````) and cross-reference roles are left out: they
name code, settings, stat keys and log lines, which are fixed public names
(``hostqueue/redis/released_hosts_count`` keeps its word). A ``:term:``
role is prose and is read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "scrapy_hostqueue"

#: ``(retired spelling, the word to use instead)``. A space in a pattern
#: stands for any run of whitespace (a line break included).
RETIRED: tuple[tuple[str, str], ...] = (
    (r"\binflight\b", "'in flight' (in_flight in code)"),
    (
        r"(?<![-\w])budgets?\b",
        "'global limit' for CONCURRENT_REQUESTS; 'budget' is the error budget only",
    ),
    (
        r"\bleas(?:e|es|ed|ing) (?:whole )?hosts?\b|\bhosts? (?:are|is) leased\b"
        r"|\bhost[- ]leases?\b|\bwhole-host leases?\b",
        "'held' for a host ('a process holds a host'); only requests are leased",
    ),
    (
        r"\breleas(?:e|es|ed|ing) (?:the |its |their |a )?(?:hosts?|requests?)\b"
        r"|\breleased (?:hosts?|requests?)\b",
        "'give back' (a held host, a leased request)",
    ),
    (
        r"\brefus(?:e|es|ed|ing) (?:the |its |their )?(?:requests? of (?:a |the )?)?"
        r"given[- ]up\b|\brefused hosts?\b",
        "'given up' (only a JOBDIR is refused)",
    ),
    (r"\bglobal slots?\b|\bsend slots?\b", "'part of the global limit', 'room on the wire'"),
    (r"\bplacements?\b", "'standing' (a host holds a place and has a standing)"),
)
#: What "budget" may follow and stay the error budget: "error budget",
#: "error-budget cool-down", an error budget broken over two lines.
_ERROR_BUDGET = re.compile(r"error[-\s]+$", re.IGNORECASE)
#: Inline literals and roles other than :term: (code, settings, keys).
_LITERAL = re.compile(r"``.+?``|:(?!term:)[a-z:]+:`[^`]+`", re.DOTALL)
#: A :term: role, read as its text.
_TERM = re.compile(r":term:`([^`<]+?)(?:\s*<[^`]+>)?`")

#: Modules whose docstrings are not read (none: every module follows the glossary).
DOCSTRINGS_LEFT_FOR_LATER: frozenset[str] = frozenset()


def _compiled() -> list[tuple[re.Pattern[str], str]]:
    return [
        (re.compile(pattern.replace(" ", r"\s+"), re.IGNORECASE), instead)
        for pattern, instead in RETIRED
    ]


def prose(text: str) -> str:
    """*text* with its literals blanked out (same length, so offsets hold)."""
    text = _LITERAL.sub(lambda m: re.sub(r"\S", " ", m.group()), text)
    return _TERM.sub(lambda m: m.group(1).ljust(len(m.group())), text)


def retired_spellings(text: str, where: str, first_line: int = 1) -> list[str]:
    """``where:line: 'found' -> use instead`` for every retired spelling in *text*."""
    text = prose(text)
    found = []
    for pattern, instead in _compiled():
        for match in pattern.finditer(text):
            if match.group().lower().startswith("budget") and _ERROR_BUDGET.search(
                text[max(0, match.start() - 12) : match.start()]
            ):
                continue
            line = first_line + text.count("\n", 0, match.start())
            spelled = " ".join(match.group().split())
            found.append(f"{where}:{line}: {spelled!r} -> {instead}")
    return found


def docstrings(path: Path) -> list[tuple[int, str]]:
    """``(first line, text)`` of every docstring in the module at *path*."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and (
            text := ast.get_docstring(node, clean=False)
        ):
            first = node.body[0].lineno if node.body else 1
            found.append((first, text))
    return found


def user_docs() -> list[Path]:
    return [ROOT / "README.rst", *sorted((ROOT / "docs").glob("*.rst"))]


@pytest.mark.parametrize("path", user_docs(), ids=lambda path: path.name)
def test_user_docs_use_no_retired_spelling(path: Path) -> None:
    assert retired_spellings(path.read_text(), path.name) == []


def test_the_package_docstrings_use_no_retired_spelling() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in DOCSTRINGS_LEFT_FOR_LATER:
            continue
        for line, text in docstrings(path):
            found += retired_spellings(text, name, line)
    assert found == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("with one politeness budget per host", "'budget'"),
        ("Hosts are leased whole", "'Hosts are leased'"),
        ("a process leases\nwhole hosts", "'leases whole hosts'"),
        ("the process released the host", "'released the host'"),
        ("new requests of the refused hosts", "'refused hosts'"),
        ("Refuse the requests of a given up host", "'Refuse the requests of a given up'"),
        ("the store's inflight count", "'inflight'"),
        ("it holds no global slot", "'global slot'"),
        ("the host's placement", "'placement'"),
    ],
)
def test_a_planted_retired_spelling_is_found(text: str, expected: str) -> None:
    found = retired_spellings(f"Some prose.\n{text}.\n", "planted.rst")
    assert len(found) == 1
    assert found[0].startswith(f"planted.rst:2: {expected} -> ")


@pytest.mark.parametrize(
    "text",
    [
        "the error budget of a host",
        "an error-budget cool-down",
        "the failures of its error\n   budget",
        "the stat ``hostqueue/redis/released_hosts_count``",
        "``python -m bench --budget 400``",
        ":meth:`budget`",
        "a request is leased; a host is held",
        "a host given up; a refused JOBDIR",
        "a host that refuses connections is given up",
        "requests in flight, ``in_flight``",
        "a host holds an active place; a downloader slot",
    ],
)
def test_the_glossarys_own_words_pass(text: str) -> None:
    assert retired_spellings(text, "ok.rst") == []


def test_a_term_role_is_read_as_prose() -> None:
    found = retired_spellings("see :term:`placement <place>`", "t.rst")
    assert [line.split(" -> ")[0] for line in found] == ["t.rst:1: 'placement'"]
