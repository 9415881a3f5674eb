#!/bin/sh
# The whole test suite: ruff (lint + format check), mypy, the documentation
# build (Sphinx, nitpicky, warnings are errors), pytest on the asyncio reactor.
. "$(dirname "$0")/_venv.sh"
# aiohttp and urllib honour proxy variables: the tests only talk to loopback hosts.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
echo "== ruff"
"$PY" -m ruff check scrapy_hostqueue tests bench example_project docs scripts
"$PY" -m ruff format --check scrapy_hostqueue tests bench example_project docs scripts
echo "== mypy"
"$PY" -m mypy
echo "== docs"
html=$(mktemp -d)
trap 'rm -rf "$html"' EXIT
"$PY" -m sphinx -q -W -n -b html docs "$html"
echo "== pytest"
# Two worker processes: most crawl tests wait on their local hosts, so two
# keep both cores busy; -rfEs lists each failed, erroring and skipped test
# (with its reason).
# Arguments after the script go to pytest.
"$PY" -m pytest -n 2 --dist worksteal -rfEs "$@"
