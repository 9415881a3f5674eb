# Sourced by the other scripts: makes a venv with the package and its extras
# installed in editable mode, and reinstalls only when setup.cfg changes.
# By default .venv, on python3, with every extra; PYTHON names another
# interpreter, VENV another directory and EXTRAS other extras (scripts/ci.sh
# makes .venv-3.10 and the like with the test extras only).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
py=${PYTHON:-python3}
extras=${EXTRAS:-test,plot,docs,redis}
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
stamp="$venv/.hostqueue-installed"
want="$extras $(cat "$root/setup.cfg" "$root/pyproject.toml" | cksum)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[$extras]"
    echo "$want" > "$stamp"
fi
PY="$venv/bin/python"
cd "$root"
