"""Tests of ``scrapy_hostqueue.testing``.

The local test hosts, the crawl report, the Redis server launcher.
"""
