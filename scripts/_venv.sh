# Sourced by the other scripts: makes .venv with the package and its extras
# installed in editable mode, and reinstalls only when setup.cfg changes.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
stamp="$venv/.hostqueue-installed"
want=$(cat "$root/setup.cfg" "$root/pyproject.toml" | cksum)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[test,plot,docs,redis]"
    echo "$want" > "$stamp"
fi
PY="$venv/bin/python"
cd "$root"
