"""The tests' one fake clock.

A ``time.monotonic`` stand-in that the package's parts take as their ``clock`` argument, moved by
the test.
"""

from __future__ import annotations


class FakeClock:
    """Reads as :attr:`now` (call it).

    The test moves it with :meth:`advance` or by setting :attr:`now`. With *step*, every read first
    moves it on by *step* seconds, as a clock does while the code under test runs.
    """

    def __init__(self, start: float = 100.0, *, step: float = 0.0) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> float:
        """Move on by *seconds*; returns the new time."""
        self.now += seconds
        return self.now
