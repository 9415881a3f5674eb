"""Screenshots of the live monitor for the docs.

docs/monitor-1280.png, docs/monitor-600.png and docs/monitor-processes.png:
runs the demo with
``--monitor``, lets the crawl go for a few seconds, has a headless chromium
take the page at 1280 and 600 px wide (with the throttling host's detail
open), then stops the crawl; then the same with ``--workers 2`` (two
processes on a shared frontier in a local Redis), at 1280 px.

Usage: ``.venv/bin/python scripts/monitor_screenshots.py [OUTPUT_DIR]``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from scrapy_hostqueue.testing._browser import headless_chromium

ROOT = Path(__file__).resolve().parent.parent
#: The demo's throttling host ("429 above 3, Retry-After 2").
DETAIL_HOST = "127.0.0.5"


def screenshot(chromium: str, url: str, path: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                *headless_chromium(chromium, profile, width, height),
                f"--screenshot={path}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main() -> int:
    chromium = shutil.which("chromium")
    if chromium is None:
        print("no chromium on PATH", file=sys.stderr)
        return 2
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    take(chromium, out, [((1280, 900), "1280", DETAIL_HOST), ((600, 1000), "600", DETAIL_HOST)])
    # Two processes on one shared frontier: the processes' table.
    take(chromium, out, [((1280, 1000), "processes", None)], "--workers", "2")
    return 0


def take(
    chromium: str, out: Path, shots: list[tuple[tuple[int, int], str, str | None]], *extra: str
) -> None:
    """Run the demo with *extra* arguments and take *shots* of its first monitor.

    Each shot is a window size, a name, and the host whose detail is open.
    """
    with tempfile.TemporaryDirectory() as work:
        demo = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "example_project" / "run_demo.py"),
                *("--monitor", "--output-dir", work, "--no-timeline", *extra),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert demo.stdin is not None and demo.stdout is not None
        try:
            url = None
            for line in demo.stdout:
                found = re.match(r"monitor(?: \(\S+\))?: (\S+)", line)
                if found:
                    url = found.group(1)
                    break
            if url is None:
                raise SystemExit("the demo gave no monitor URL")
            # Long enough for a Retry-After block and a few limit changes,
            # polled as the page does, so that the host's history fills in.
            for _ in range(12):
                time.sleep(1)
                base, token = url.split("?")
                with urllib.request.urlopen(f"{base}hosts.json?{token}", timeout=10) as answer:
                    answer.read()
            for (width, height), name, host in shots:
                path = out / f"monitor-{name}.png"
                screenshot(chromium, url + (f"#host={host}" if host else ""), path, width, height)
                print(path)
        finally:
            demo.stdin.write("\n")
            demo.stdin.flush()
            demo.communicate(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
