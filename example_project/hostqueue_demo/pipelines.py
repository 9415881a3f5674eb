"""``ItemsFilePipeline``: each item as one JSON line, written as it comes.

On when the ``DEMO_ITEMS_FILE`` setting names a file. Every line goes to the
operating system at once (no buffer in this process), so an item that left
this pipeline survives the crawl being killed (``kill -9``); a feed export
(``-o``) buffers its lines and may lose the last ones then.
"""

from __future__ import annotations

import json
import os
from typing import Any

from itemadapter import ItemAdapter
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured


class ItemsFilePipeline:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemsFilePipeline:
        path = crawler.settings.get("DEMO_ITEMS_FILE")
        if not path:
            raise NotConfigured
        return cls(path)

    def process_item(self, item: Any) -> Any:
        line = json.dumps(ItemAdapter(item).asdict(), sort_keys=True) + "\n"
        os.write(self._fd, line.encode())
        return item

    def close_spider(self) -> None:
        os.close(self._fd)
