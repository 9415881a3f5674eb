"""The Redis frontier, a crawl shared by several processes: the store
(``_store``), its scripts and keys (``_db``), the task that talks to Redis
(``_link``), host sharing (``_share``), the Scrapy glue (``_glue``,
``_frontier``) and ``python -m scrapy_hostqueue push|frontier redis://...``
(``_cli``)."""

from scrapy_hostqueue.frontier.redis._frontier import SharedFrontier

__all__ = ["SharedFrontier"]
