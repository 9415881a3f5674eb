"""Tests of the Redis frontier (``scrapy_hostqueue.frontier.redis``), on real servers."""
