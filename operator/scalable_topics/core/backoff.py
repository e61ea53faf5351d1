"""Exponential back-off, the one used by the controller's work queue and the client SDK's
reconnect loops."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Backoff:
    """The n-th consecutive failure waits ``base * 2**(n-1)`` seconds, at most ``cap``; with
    ``jitter`` (full jitter over the upper half) a random share in ``[value/2, value]`` instead,
    so that many clients failing together do not retry together.

    Two ways to use it: :meth:`delay_for` for a caller that counts failures itself (the work
    queue, per key), or :meth:`delay` / :meth:`reset` for one retry loop, which counts here.
    """

    base: float = 0.05
    cap: float = 5.0
    jitter: bool = True
    failures: int = 0

    def delay_for(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        value = float(min(self.cap, self.base * 2 ** (failures - 1)))
        return random.uniform(value / 2, value) if self.jitter else value

    def delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        return self.delay_for(self.failures)

    def reset(self) -> None:
        """A success: the next failure waits ``base`` again."""
        self.failures = 0
