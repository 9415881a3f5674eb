#!/bin/sh
# Builds the documentation into docs/_build/html (open docs/_build/html/index.html).
# Warnings are errors, as in scripts/test.sh.
. "$(dirname "$0")/_venv.sh"
exec "$PY" -m sphinx -W -n -b html docs docs/_build/html "$@"
