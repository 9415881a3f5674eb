"""Headless chromium for the monitor's tests and screenshots.

The arguments that keep it on this machine: no background networking, no
component updates or sync, a throw-away profile, as root without a sandbox.
"""

from __future__ import annotations

__all__ = ["headless_chromium"]


def headless_chromium(chromium: str, profile: str, width: int, height: int) -> list[str]:
    """Return the command line start of a headless *chromium* that talks only to its URL.

    *profile* is an empty folder for its user data; the window is *width*
    by *height* pixels and the page's scripts get 5 virtual seconds.
    """
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "--virtual-time-budget=5000",
    ]
