"""The Supervisor's backoff before a recovered order is retried (RetryBackoffBaseSeconds, RetryBackoffMaxSeconds);
orderflow.state_machine re-exports it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

Backoff = Callable[[int], timedelta]


def exponential_backoff(base_seconds: float, max_seconds: float) -> Backoff:
    """Delay before retry number `failure_count` (1-based): base * 2**(n-1), capped at max_seconds."""
    if base_seconds < 0 or max_seconds < 0:
        raise ValueError("backoff seconds must be >= 0")

    def delay(failure_count: int) -> timedelta:
        if failure_count < 1:
            raise ValueError(f"failure_count must be >= 1, got {failure_count}")
        exponent = min(failure_count - 1, 62)  # 2**62 seconds is past any cap; avoids huge ints
        return timedelta(seconds=min(base_seconds * (2**exponent), max_seconds))

    return delay
