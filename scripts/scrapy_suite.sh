#!/bin/sh
# Runs Scrapy's own tests, for the Scrapy version this package installs, with
# scrapy_hostqueue.Addon as a default add-on ("addon") or without it
# ("baseline"), and lists the failures that only the add-on run has.
#
#   sh scripts/scrapy_suite.sh baseline|addon GROUP|tests/test_x.py ...
#   sh scripts/scrapy_suite.sh compare GROUP
#   sh scripts/scrapy_suite.sh setup
#
# GROUP: crawl, engine, scheduler, middleware (downloader middlewares),
# handler (download handlers, plus Scrapy's aiohttp handler tests run against
# this package's handler), downloader (the downloader and its slots), more
# (other modules whose tests run crawls).
# Scrapy's tests and their own dependencies stay outside the repository, in
# SCRAPY_SUITE_DIR (default /tmp/scrapy-suite): Scrapy's sdist (which holds
# tests/), a venv with this package (editable) and Scrapy's test dependencies,
# and results/MODE-GROUP.{log,failed}.
# SCRAPY_SUITE_TEST_TIMEOUT: seconds per test (default 120);
# SCRAPY_SUITE_TIMEOUT: seconds for the whole run (default 1800).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
here="$root/scripts/scrapy_suite"
dir=${SCRAPY_SUITE_DIR:-/tmp/scrapy-suite}
venv="$dir/venv"
py=${PYTHON:-python3}
mode=${1:?usage: scrapy_suite.sh baseline|addon|compare GROUP|tests/test_x.py ... or setup}
shift
group=${1:-}

failed_names() {
    # "FAILED tests/x.py::T::t - message" -> "tests/x.py::T::t"
    sed -e 's/ - .*//' "$1" | sort -u
}

if [ "$mode" = compare ]; then
    base="$dir/results/baseline-$group.failed"
    addon="$dir/results/addon-$group.failed"
    echo "baseline: $(failed_names "$base" | wc -l) failed or errors"
    echo "addon:    $(failed_names "$addon" | wc -l) failed or errors"
    echo "== only with the add-on"
    failed_names "$base" > "$dir/results/.base"
    failed_names "$addon" > "$dir/results/.addon"
    comm -13 "$dir/results/.base" "$dir/results/.addon"
    echo "== only without the add-on"
    comm -23 "$dir/results/.base" "$dir/results/.addon"
    exit 0
fi

case "$mode" in
    baseline) addon_option= ;;
    addon) addon_option=--hostqueue-addon ;;
    setup) addon_option= ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
esac

mkdir -p "$dir/results"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
stamp="$venv/.scrapy-suite-installed"
want=$(cat "$root/setup.cfg" "$0" | cksum)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # Scrapy's test requirements (its tox.ini), without coverage and xdist.
    # pytest 9 turns fixture forms that Scrapy 2.19's FTP and proxy tests use
    # into collection and setup errors.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root" \
        attrs pexpect psutil pyftpdlib pygments "pytest>=8.4.1,<9" pytest-rerunfailures \
        pytest-timeout "sybil>=1.3.0" "pytest-twisted>=1.14.3" testfixtures
    echo "$want" > "$stamp"
fi
version=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('scrapy'))")
src="$dir/scrapy-$version"
if [ ! -d "$src/tests" ]; then
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary :all: "scrapy==$version" -d "$dir"
    tar -xzf "$dir/scrapy-$version.tar.gz" -C "$dir"
fi
cp "$here/test_downloader_handler_hostqueue.py" "$src/tests/"
if [ "$mode" = setup ]; then
    echo "Scrapy $version's tests in $src, venv $venv"
    exit 0
fi
[ -n "$group" ] || { echo "name a group or test modules" >&2; exit 2; }

case "$group" in
    crawl) modules="tests/test_crawl.py" ;;
    engine) modules=$(cd "$src" && echo tests/test_engine*.py) ;;
    scheduler) modules=$(cd "$src" && echo tests/test_scheduler*.py) ;;
    middleware) modules=$(cd "$src" && echo tests/test_downloadermiddleware*.py) ;;
    handler) modules=$(cd "$src" && echo tests/test_downloader_handler*.py) ;;
    downloader) modules="tests/test_core_downloader.py tests/test_downloaderslotssettings.py" ;;
    more)
        # Other modules whose tests run crawls: start requests, signals,
        # closing, stats, pipelines, AutoThrottle.
        modules="tests/test_spider_start.py tests/test_spidermiddleware_start.py
            tests/test_spidermiddleware_process_start.py tests/test_request_left.py
            tests/test_closespider.py tests/test_request_cb_kwargs.py tests/test_signals.py
            tests/test_pipeline_crawl.py tests/test_extension_throttle.py
            tests/test_request_attribute_binding.py tests/test_spidermiddleware_output_chain.py
            tests/test_spidermiddleware_httperror.py tests/test_dupefilters.py tests/test_crawler.py
            tests/test_logstats.py tests/test_extension_periodic_log.py tests/test_stats.py"
        ;;
    *) modules="$*"; group=$(echo "$*" | tr ' /' '_-') ;;
esac

# aiohttp and urllib honour proxy variables; Scrapy's proxy tests set their own.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
log="$dir/results/$mode-$group.log"
cd "$src"
set +e
# shellcheck disable=SC2086  # $modules is a list of paths
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout "${SCRAPY_SUITE_TIMEOUT:-1800}" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -p hostqueue_default $addon_option \
    --continue-on-collection-errors --timeout="${SCRAPY_SUITE_TEST_TIMEOUT:-120}" -rfE \
    $modules > "$log" 2>&1
status=$?
set -e
grep -E '^(FAILED|ERROR) tests/' "$log" > "$dir/results/$mode-$group.failed" || true
grep -E "configured [0-9]+ crawlers" "$log" || true
tail -n 1 "$log"
echo "exit $status; log: $log; failures: $dir/results/$mode-$group.failed"
