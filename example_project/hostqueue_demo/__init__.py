"""Example Scrapy project: a link-following spider wired with scrapy-hostqueue."""
