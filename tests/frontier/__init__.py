"""Tests of ``scrapy_hostqueue.frontier``: the picker and the in-memory store."""
