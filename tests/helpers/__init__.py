"""What the tests share.

One fake clock, the crawls and their watch, the Redis servers and the ``requires_redis`` marker's
rules.
"""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (where ``setup.cfg`` is).
ROOT = Path(__file__).resolve().parents[2]
