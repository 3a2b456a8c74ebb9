"""The embedded client's time and retries, as the azure-servicebus SDK has them on the client: the local clock it
reads for lock expiry (`utc_now`), monotonic deadlines, waits and backoff sleeps (`Timer`, which tests replace to move
time instead of waiting), and the retry policy of `_do_retryable_operation` (`RetryPolicy`, `Attempts`: retry_total 3,
backoff 0.8 s exponential, bounded by the operation's budget). Sources and figures: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from azure.core.pipeline.policies import RetryMode
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus._base_handler import _get_backoff_time
from azure.servicebus._common.utils import get_attempt_timeout
from azure.servicebus.exceptions import OperationTimeoutError

from . import notify

# azure/servicebus/_base_handler.py `_do_retryable_operation`: the hint added to a NEXT_AVAILABLE_SESSION timeout.
NEXT_AVAILABLE_HINT = (
    " If trying to receive from NEXT_AVAILABLE_SESSION, use max_wait_time on the ServiceBusReceiver to control the "
    "timeout."
)
_RETRY_KEYWORDS = ("retry_total", "retry_backoff_factor", "retry_backoff_max", "retry_mode", "try_timeout")


class Timer:
    """The client machine's time: `now()` is the local clock the SDK compares lock expiry with (default: the broker's
    clock, one machine), `monotonic()` its deadlines; `wait` blocks on a receiver's socket, `sleep` backs off."""

    def __init__(self, local_clock: Callable[[], datetime]) -> None:
        self.local_clock = local_clock

    def now(self) -> datetime:
        return self.local_clock()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, waiter: notify.Waiter, seconds: float) -> None:
        waiter.wait(seconds)

    async def wait_async(self, waiter: notify.Waiter, seconds: float) -> None:
        await waiter.wait_async(seconds)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """The client's retry options, with the SDK's defaults (azure/servicebus/_common/_configuration.py)."""

    retry_total: int = 3
    retry_backoff_factor: float = 0.8
    retry_backoff_max: float = 120
    retry_mode: RetryMode = RetryMode.Exponential
    try_timeout: float | None = None

    def updated(self, options: Mapping[str, Any]) -> RetryPolicy:
        """This policy with the retry keywords among `options` (a client's or a handler's keywords)."""
        given = {k: options[k] for k in _RETRY_KEYWORDS if options.get(k) is not None}
        if "retry_mode" in given:
            given["retry_mode"] = RetryMode(given["retry_mode"])
        try_timeout = given.get("try_timeout")
        if try_timeout is not None and try_timeout <= 0:
            raise ValueError("The try_timeout must be a finite value greater than 0.")
        return replace(self, **given)

    def backoff(self, retried_times: int) -> float:
        mode, factor, most = self.retry_mode, self.retry_backoff_factor, self.retry_backoff_max
        return float(_get_backoff_time(mode, factor, most, retried_times))  # type: ignore[no-untyped-call]


class Attempts:
    """One retryable operation (azure/servicebus/_base_handler.py `_do_retryable_operation` and `_backoff`): up to
    1 + retry_total attempts, each bounded by what is left of `budget` (None: unbounded) and `try_timeout`; between
    them the backoff, when it fits in the budget. `failed` answers how long to back off, or raises the final error."""

    def __init__(self, policy: RetryPolicy, timer: Timer, budget: float | None, session_target: Any = None) -> None:
        self.policy, self.timer = policy, timer
        self.deadline = timer.monotonic() + budget if budget else None
        self.retried = 0
        self._next_available = session_target is NEXT_AVAILABLE_SESSION

    def attempt_timeout(self) -> float | None:
        remaining = None if self.deadline is None else self.deadline - self.timer.monotonic()
        return get_attempt_timeout(remaining, self.policy.try_timeout)

    def failed(self, error: Exception) -> float:
        """Seconds to back off before the next attempt; raises `error` when it is not retryable or retries are over."""
        if not getattr(error, "_retryable", False):
            raise error
        self.retried += 1
        if self.retried <= self.policy.retry_total:
            backoff = self.policy.backoff(self.retried)
            fits = self.deadline is None or backoff + self.timer.monotonic() <= self.deadline
            if backoff <= self.policy.retry_backoff_max and fits:
                return backoff
        if isinstance(error, OperationTimeoutError):
            hint = NEXT_AVAILABLE_HINT if self._next_available else ""
            raise OperationTimeoutError(message=str(error) + hint) from error
        raise error
