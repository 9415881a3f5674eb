"""Tests of the SQLite frontier (``scrapy_hostqueue.frontier.sqlite``, JOBDIR)."""
