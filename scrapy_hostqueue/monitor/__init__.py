"""The live monitor: a web page of the crawl's hosts, served inside the crawl.

* ``extension``: :class:`~scrapy_hostqueue.monitor.extension.HostQueueMonitor`,
  the Scrapy extension the add-on enables, which gathers the figures;
* ``_snapshot``: the snapshot made of them (pure: no Scrapy import);
* ``_server``: the aiohttp server and its token; ``page.html``: the page.
"""
