"""The SQLite frontier.

The store on a frontier file (``_store``, ``_file``), its Scrapy glue and
:class:`~scrapy_hostqueue.frontier.sqlite._glue.SqliteFrontier` (``_glue``), and the report of
``python -m scrapy_hostqueue frontier PATH`` (``_report``).

Nothing is imported here: the store and its file are pure (no Scrapy), and
importing them must not import the glue.
"""
