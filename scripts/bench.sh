#!/bin/sh
# The benchmark suite: every scenario side by side with stock Scrapy.
# Arguments go to `python -m bench` (--scenarios S1,S3 --configs ... --repeats N --quick).
. "$(dirname "$0")/_venv.sh"
# aiohttp honours proxy variables: the benchmark only talks to loopback hosts.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
exec "$PY" -m bench "$@"
