#!/bin/sh
# What CI runs (.ci/run): the whole suite on python3 (scripts/test.sh), then
# the fast tier (-m "not crawl") on Python 3.10, 3.12 and 3.13, each in its
# own venv (scripts/test_python.sh), where that interpreter is found. Every
# part runs even after one failed; the exit status is 1 if any failed. The
# last line says how many of the runs passed.
set -u
cd "$(dirname "$0")/.."
started=$(date +%s)
# The monitor's page is tested in a real browser (tests/monitor/test_page.py):
# Debian's chromium, installed here when it is missing and CI runs as root.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium"
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null \
        || echo "== could not install chromium: its test is skipped"
fi
passed=0
failed=""
missing=""
if sh scripts/test.sh; then
    passed=$((passed + 1))
else
    failed="$failed python3"
fi
for version in 3.10 3.12 3.13; do
    status=0
    sh scripts/test_python.sh "$version" -m "not crawl" || status=$?
    case $status in
        0) passed=$((passed + 1)) ;;
        77) missing="$missing $version" ;;
        *) failed="$failed $version" ;;
    esac
done
echo "== ci.sh took $(($(date +%s) - started)) s"
if [ -n "$missing" ]; then
    echo "== not run, no interpreter found: Python$missing"
fi
if [ -n "$failed" ]; then
    echo "== failed:$failed"
fi
echo "== ci.sh: $passed of $((passed + $(echo $failed | wc -w))) runs passed"
[ -z "$failed" ]
