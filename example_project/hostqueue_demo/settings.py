"""Settings of the example project: stock Scrapy plus the scrapy-hostqueue add-on.

``python example_project/run_demo.py`` runs ``scrapy crawl pages`` here against local
test hosts; run it by hand the same way, e.g.::

    scrapy crawl pages -a start_urls=http://127.0.0.1:8080/page/0 -s CLOSESPIDER_PAGECOUNT=100
"""

from __future__ import annotations

import os

BOT_NAME = "hostqueue_demo"
SPIDER_MODULES = ["hostqueue_demo.spiders"]
NEWSPIDER_MODULE = "hostqueue_demo.spiders"
USER_AGENT = "hostqueue-demo (+https://github.com/scrapy-hostqueue; local test hosts)"

# One line wires HostQueueScheduler, AIMDMiddleware and AiohttpDownloadHandler.
ADDONS = {"scrapy_hostqueue.Addon": 0}
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"

ROBOTSTXT_OBEY = True
CONCURRENT_REQUESTS = 16
# The per-host ceiling: scrapy-hostqueue adapts each host's limit below it.
CONCURRENT_REQUESTS_PER_DOMAIN = 4
DOWNLOAD_TIMEOUT = 20

# Stop after this many responses (the demo passes -s CLOSESPIDER_PAGECOUNT=N).
CLOSESPIDER_PAGECOUNT = int(os.environ.get("DEMO_PAGES", "600"))

TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"

# Stay open when out of work, until the crawl is stopped (the demo's --monitor).
DEMO_KEEP_OPEN = False

# Items as JSON lines, each written as it comes (survives kill -9); unset = off.
DEMO_ITEMS_FILE = None
ITEM_PIPELINES = {"hostqueue_demo.pipelines.ItemsFilePipeline": 300}

# Where the spider writes Scrapy's final stats as JSON when it closes (the demo
# runner sets it); unset = nowhere.
DEMO_STATS_FILE = None
