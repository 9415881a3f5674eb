"""Tests of ``scrapy_hostqueue.testing``: the local test hosts, the crawl report,
the Redis server launcher."""
