"""The SQLite frontier: the store on a frontier file (``_store``, ``_file``),
its Scrapy glue (``_glue``) and the report of ``python -m scrapy_hostqueue
frontier PATH`` (``_report``)."""

from scrapy_hostqueue.frontier.sqlite._glue import SqliteFrontier

__all__ = ["SqliteFrontier"]
