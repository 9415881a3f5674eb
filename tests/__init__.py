"""The tests, laid out like the package.

``tests/frontier/redis/`` tests ``scrapy_hostqueue/frontier/redis/``, and so on; shared helpers in
``helpers/``.
"""
