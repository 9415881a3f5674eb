"""pytest plugin: Scrapy's own test suite with ``scrapy_hostqueue.Addon`` as a default add-on.

``scripts/scrapy_suite.sh`` loads it (``-p hostqueue_default``) when it runs
Scrapy's tests from Scrapy's source tree. With ``--hostqueue-addon`` it puts the
add-on into Scrapy's default ``ADDONS`` before any test builds settings, so
every crawler a test makes (``get_crawler()``, ``CrawlerRunner``, ...) runs with
the add-on, as a project with ``ADDONS = {"scrapy_hostqueue.Addon": 0}`` in its
settings would; a test that sets ``ADDONS`` itself replaces the default, as it
would replace a project's. Without the option it changes nothing (the baseline
run), so both runs import the same code in the same order.
"""

# Scrapy and this package are imported inside the hooks, so that loading the
# plugin imports nothing before pytest-twisted has installed the reactor and
# Scrapy's conftest has set the event loop policy.
# ruff: noqa: PLC0415
from __future__ import annotations

from typing import Any

ADDON = "scrapy_hostqueue.Addon"

#: How many crawlers the add-on configured: proof, in the run's summary, that
#: the tests ran with it.
_applied = 0


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--hostqueue-addon",
        action="store_true",
        default=False,
        help=f"add {ADDON} to Scrapy's default ADDONS",
    )


def pytest_configure(config: Any) -> None:
    if not config.getoption("--hostqueue-addon"):
        return
    # Settings() reads the module's attributes when it is built: patching the
    # module before collection reaches every crawler the tests make.
    from scrapy.settings import default_settings

    default_settings.ADDONS = {**default_settings.ADDONS, ADDON: 0}

    from scrapy_hostqueue import Addon

    update_settings = Addon.update_settings

    def counted(self: Any, settings: Any) -> None:
        global _applied
        _applied += 1
        update_settings(self, settings)

    Addon.update_settings = counted  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    if config.getoption("--hostqueue-addon"):
        terminalreporter.write_line(f"{ADDON} configured {_applied} crawlers")


def pytest_report_header(config: Any) -> str:
    import scrapy

    import scrapy_hostqueue

    state = "on" if config.getoption("--hostqueue-addon") else "off (baseline)"
    return (
        f"Scrapy {scrapy.__version__} from {scrapy.__file__}; scrapy-hostqueue "
        f"{scrapy_hostqueue.__version__}; {ADDON} as a default add-on: {state}"
    )
