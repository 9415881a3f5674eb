"""The package's layout: its import graph, public names and private modules.

Its import graph (read with ``ast``, nothing is imported), its public names, and which modules are
private by their names.

The rules:

* A frontier backend is a folder under ``scrapy_hostqueue/frontier/``
  (``sqlite/``, ``redis/``). No module outside a backend's folder imports one
  of its modules, but ``frontier/__init__.py``, which picks the backend
  ``HOSTQUEUE_FRONTIER`` names, and only inside a function (lazily: a crawl
  loads the one backend it uses).
* A module that calls itself pure (its docstring starts a line with "Pure")
  imports neither Scrapy nor Twisted, nor, at run time, a module of the
  package that does (``if TYPE_CHECKING:`` imports do not run).
* Every exception in ``scrapy_hostqueue.exceptions`` derives from
  ``HostQueueError`` and is named in ``__all__`` and on the API page.
* A module of the package is private by its name (a leading underscore in
  its path) unless the docs name it.
* The tests are laid out like the package: every folder of ``tests/`` is a
  package that mirrors a folder of ``scrapy_hostqueue/`` (but ``helpers/``
  and ``bench/``), and no test module imports another.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import scrapy_hostqueue
from scrapy_hostqueue import exceptions
from tests.helpers import ROOT

PACKAGE = ROOT / "scrapy_hostqueue"
#: The third-party packages a pure module must not import.
IMPURE = ("scrapy", "twisted")
#: The picker, which alone may import a backend from outside (lazily).
PICKER = "scrapy_hostqueue.frontier"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as a dotted name."""

    target: str
    #: Runs when the module is imported (not in a function, not under
    #: ``if TYPE_CHECKING:``).
    at_import: bool
    #: Inside a function body.
    lazy: bool


def module_name(path: Path, root: Path) -> str:
    """Return the dotted name of the module at *path*, *root* being the package's parent."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, name: str, modules: set[str], *, package: bool) -> list[Import]:
    """List what the module *name* (a package's ``__init__`` if *package*) imports.

    ``from a import b`` counts as an import of ``a.b`` when that is one of *modules*, else of ``a``.
    """
    found: list[Import] = []

    def visit(node: ast.AST, *, typing_only: bool, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for part in child.body:
                    visit_one(part, typing_only=True, lazy=lazy)
                for part in child.orelse:
                    visit_one(part, typing_only=typing_only, lazy=lazy)
                continue
            visit_one(child, typing_only=typing_only, lazy=lazy)

    def visit_one(child: ast.AST, *, typing_only: bool, lazy: bool) -> None:
        at_import = not typing_only and not lazy
        if isinstance(child, ast.Import):
            for alias in child.names:
                found.append(Import(alias.name, at_import, lazy))
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                here = name.split(".") if package else name.split(".")[:-1]
                here = here[: len(here) - (child.level - 1)]
                base = ".".join([*here, base] if base else here)
            for alias in child.names:
                full = f"{base}.{alias.name}"
                found.append(Import(full if full in modules else base, at_import, lazy))
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            visit(child, typing_only=typing_only, lazy=True)
        else:
            visit(child, typing_only=typing_only, lazy=lazy)

    visit(ast.parse(source), typing_only=False, lazy=False)
    return found


def import_graph(package_dir: Path) -> dict[str, list[Import]]:
    """Every module of the package in *package_dir* and what it imports."""
    paths = sorted(package_dir.rglob("*.py"))
    names = {module_name(path, package_dir.parent): path for path in paths}
    modules = set(names)
    return {
        name: imports_of(path.read_text(), name, modules, package=path.name == "__init__.py")
        for name, path in names.items()
    }


def backends(graph: dict[str, list[Import]], frontier: str) -> set[str]:
    """Return the backend folders: the subpackages of *frontier*."""
    return {
        name
        for name in graph
        if name.startswith(frontier + ".")
        and name.count(".") == frontier.count(".") + 1
        and any(other.startswith(name + ".") for other in graph)
    }


def backend_problems(graph: dict[str, list[Import]], frontier: str) -> list[str]:
    """List imports of a backend's modules from outside its folder, but the picker's lazy ones."""
    problems = []
    for backend in sorted(backends(graph, frontier)):
        for name, imports in sorted(graph.items()):
            if name == backend or name.startswith(backend + "."):
                continue
            for imp in imports:
                if imp.target != backend and not imp.target.startswith(backend + "."):
                    continue
                if name == frontier and imp.lazy:
                    continue
                problems.append(f"{name} imports {imp.target}")
    return problems


def pure_modules(package_dir: Path) -> set[str]:
    """Return the modules whose docstring calls them pure."""
    pure = set()
    for path in package_dir.rglob("*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if re.search(r"^Pure\b", docstring, re.MULTILINE):
            pure.add(module_name(path, package_dir.parent))
    return pure


def runtime_closure(graph: dict[str, list[Import]], name: str) -> dict[str, str]:
    """Return every module importing *name* imports at run time.

    Every module importing *name* imports at run time, with the module of
    the package that imports it (a module's parent packages included).
    """
    seen: dict[str, str] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        targets = [(imp.target, current) for imp in graph.get(current, []) if imp.at_import]
        targets += [(parent, current) for parent in parents]
        for target, by in targets:
            if target in seen:
                continue
            seen[target] = by
            if target in graph:
                todo.append(target)
    return seen


def purity_problems(graph: dict[str, list[Import]], pure: set[str]) -> list[str]:
    """Scrapy or Twisted imported, at run time, by a module that calls itself pure."""
    problems = []
    for name in sorted(pure):
        for target, by in sorted(runtime_closure(graph, name).items()):
            if target.split(".")[0] in IMPURE:
                problems.append(f"{name}: {by} imports {target}")
    return problems


# -- the rules on the package ----------------------------------------------------


def test_no_module_outside_a_backend_imports_it() -> None:
    graph = import_graph(PACKAGE)
    assert backends(graph, "scrapy_hostqueue.frontier") == {
        "scrapy_hostqueue.frontier.redis",
        "scrapy_hostqueue.frontier.sqlite",
    }
    assert backend_problems(graph, "scrapy_hostqueue.frontier") == []


def test_the_modules_that_call_themselves_pure_import_neither_scrapy_nor_twisted() -> None:
    pure = pure_modules(PACKAGE)
    # The ring and host state, the AIMD rule, the Retry-After parser, the stores.
    assert {
        "scrapy_hostqueue._aimd",
        "scrapy_hostqueue._errors",
        "scrapy_hostqueue._retry_after",
        "scrapy_hostqueue.frontier.memory",
        "scrapy_hostqueue.frontier.sqlite._store",
        "scrapy_hostqueue.frontier.redis._store",
    } <= pure
    assert purity_problems(import_graph(PACKAGE), pure) == []


# -- the checks find what they look for ---------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_backend_check_finds_an_import_from_outside(tmp_path: Path) -> None:
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/front/__init__.py": (
                "def pick():\n    from pkg.front.disk import Store\n    return Store\n"
            ),
            "pkg/front/disk/__init__.py": "from pkg.front.disk._store import Store\n",
            "pkg/front/disk/_store.py": "class Store: ...\n",
            "pkg/sched.py": "from pkg.front.disk import _store\n",
            "pkg/job.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.front.disk._store import Store\n"
            ),
            "pkg/fine.py": "from pkg.front import pick\n",
        },
    )
    graph = import_graph(package)
    assert backends(graph, "pkg.front") == {"pkg.front.disk"}
    # The picker's lazy import is allowed; a typing-only one is not.
    assert backend_problems(graph, "pkg.front") == [
        "pkg.job imports pkg.front.disk._store",
        "pkg.sched imports pkg.front.disk._store",
    ]


def test_the_purity_check_follows_imports_and_parent_packages(tmp_path: Path) -> None:
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ring.py": '"""The ring.\n\nPure logic."""\nfrom pkg import helper\n',
            "pkg/helper.py": "import json\nfrom scrapy.http import Request\n",
            "pkg/sub/__init__.py": "import twisted.internet\n",
            "pkg/sub/rule.py": '"""Pure: a rule."""\n',
            "pkg/clean.py": (
                '"""Pure."""\nfrom typing import TYPE_CHECKING\n'
                "if TYPE_CHECKING:\n    import scrapy\n"
                "def f():\n    import scrapy\n"
            ),
        },
    )
    pure = pure_modules(package)
    assert pure == {"pkg.ring", "pkg.sub.rule", "pkg.clean"}
    assert purity_problems(import_graph(package), pure) == [
        "pkg.ring: pkg.helper imports scrapy.http",
        "pkg.sub.rule: pkg.sub imports twisted.internet",
    ]


# -- public names ----------------------------------------------------------------------

API_PAGE = (ROOT / "docs" / "api.rst").read_text()
DOCS = "\n".join(path.read_text() for path in (ROOT / "docs").glob("*.rst"))


def test_the_package_exports_the_components_and_the_errors_users_name() -> None:
    assert sorted(scrapy_hostqueue.__all__) == [
        "AIMDMiddleware",
        "Addon",
        "AiohttpDownloadHandler",
        "GcTuning",
        "HostBlocked",
        "HostGivenUp",
        "HostQueueError",
        "HostQueueScheduler",
        "HostQueueSettingsError",
        "StartRequestsMiddleware",
        "__version__",
    ]
    for name in scrapy_hostqueue.__all__:
        value = getattr(scrapy_hostqueue, name)
        if name != "__version__":
            assert f"scrapy_hostqueue.{name}\n" in API_PAGE, name
            assert value.__module__.startswith("scrapy_hostqueue."), name


def test_every_exception_derives_from_one_base_and_is_listed() -> None:
    defined = {
        name
        for name, value in vars(exceptions).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == "scrapy_hostqueue.exceptions"
    }
    assert set(exceptions.__all__) == defined
    assert len(defined) == 10
    for name in exceptions.__all__:
        error = getattr(exceptions, name)
        assert issubclass(error, exceptions.HostQueueError), name
        assert re.search(rf"scrapy_hostqueue\.(exceptions\.)?{name}\n", API_PAGE), name


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (exceptions.HostBlocked, "scrapy.exceptions.IgnoreRequest"),
        (exceptions.HostGivenUp, "scrapy.exceptions.IgnoreRequest"),
        (exceptions.HostQueueSettingsError, "builtins.ValueError"),
        (exceptions.RedisFrontierLost, "scrapy_hostqueue.exceptions.RedisFrontierError"),
        (exceptions.TimelineError, "builtins.ValueError"),
        (exceptions.UnsupportedDependencyError, "builtins.ImportError"),
    ],
)
def test_each_exception_keeps_the_base_callers_test_for(error: type, base: str) -> None:
    assert base in {f"{cls.__module__}.{cls.__qualname__}" for cls in error.__mro__}


def documented_modules(docs: str) -> set[str]:
    """Return the modules the docs name.

    Literally, or as the module (and its packages) of an object an ``auto...`` directive documents.
    """
    named = set(re.findall(r"\bscrapy_hostqueue(?:\.\w+)*", docs))
    for target in re.findall(r"^\.\. auto\w+:: (scrapy_hostqueue\S*)", docs, re.MULTILINE):
        module, _, attr = target.rpartition(".")
        value = getattr(importlib.import_module(module), attr)
        named.add(getattr(value, "__module__", target))
    return {".".join(name.split(".")[:i]) for name in named for i in range(1, name.count(".") + 2)}


def test_a_module_the_docs_do_not_name_is_private_by_its_name() -> None:
    public = [
        name
        for name in import_graph(PACKAGE)
        if not any(part.startswith("_") for part in name.split("."))
    ]
    assert "scrapy_hostqueue.scheduler" in public
    documented = documented_modules(DOCS)
    assert "scrapy_hostqueue.gc_tuning" in documented  # as GcTuning's module
    assert [name for name in public if name not in documented] == []


# -- the tests' own layout ---------------------------------------------------------

TESTS = ROOT / "tests"
#: Folders of ``tests/`` that mirror no folder of the package.
OWN_FOLDERS = {"helpers", "bench"}


def test_every_folder_of_the_tests_is_a_package_that_mirrors_the_package() -> None:
    folders = sorted(
        path.relative_to(TESTS)
        for path in TESTS.rglob("*")
        if path.is_dir() and path.name != "__pycache__"
    )
    assert Path("frontier") / "redis" in folders
    assert [folder for folder in folders if not (TESTS / folder / "__init__.py").exists()] == []
    assert [
        folder
        for folder in folders
        if folder.parts[0] not in OWN_FOLDERS and not (PACKAGE / folder).is_dir()
    ] == []


def test_no_test_module_imports_another() -> None:
    graph = import_graph(TESTS)
    tests = {name for name in graph if name.rsplit(".", 1)[-1].startswith("test_")}
    assert "tests.frontier.redis.test_store" in tests
    assert [
        f"{name} imports {imp.target}"
        for name in sorted(tests)
        for imp in graph[name]
        if imp.target in tests
    ] == []
