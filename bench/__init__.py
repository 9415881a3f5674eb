"""Benchmark suite: every scenario side by side with stock Scrapy (``python -m bench``)."""
