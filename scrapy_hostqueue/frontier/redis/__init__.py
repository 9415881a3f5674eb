"""The Redis frontier: a crawl shared by several processes.

The Redis frontier, a crawl shared by several processes: the store
(``_store``), its scripts and keys (``_db``), the task that talks to Redis
(``_link``), host sharing (``_share``), the Scrapy glue (``_glue``), the
:class:`~scrapy_hostqueue.frontier.redis._frontier.SharedFrontier`
(``_frontier``) and ``python -m scrapy_hostqueue push|frontier redis://...``
(``_cli``).

Nothing is imported here: the store, its keys and host sharing are pure (no
Scrapy), and importing them must not import the glue.
"""
