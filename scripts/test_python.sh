#!/bin/sh
# pytest on another Python: sh scripts/test_python.sh 3.13 [pytest args].
# The interpreter is python3.13 from PATH, else pyenv's newest 3.13.x; its
# venv is .venv-3.13, with the test, redis and plot extras (lint, mypy and
# the docs run once, on python3, in scripts/test.sh). Exits 77 when no such interpreter is
# found (pytest's own exit statuses stop at 5).
set -eu
version=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=""
if "python$version" -c "" 2>/dev/null; then
    python=$(command -v "python$version")
else
    python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/"python$version" \
        2>/dev/null | sort -V | tail -n 1)
fi
if [ -z "$python" ]; then
    echo "no Python $version found (python$version on PATH, or pyenv's versions)" >&2
    exit 77
fi
PYTHON=$python VENV="$root/.venv-$version" EXTRAS=test,redis,plot . "$root/scripts/_venv.sh"
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
echo "== pytest on $("$PY" -c 'import sys; print("Python", sys.version.split()[0])')"
"$PY" -m pytest -n 2 --dist worksteal -rfEs "$@"
