"""Retry policy of CallActivityWithRetry / CallSubOrchestratorWithRetry, computed as the Durable Task
Framework does: DTFx `RetryInterceptor.ComputeNextDelay` (durabletask core/RetryInterceptor.cs) waits
`FirstRetryInterval * BackoffCoefficient ** retryCount` after attempt `retryCount` (0-based) failed, capped at
`MaxRetryInterval` (the extension's RetryOptions default: 6 days). The timers themselves: devhost/durable/shim.py
`Retry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

# The extension's RetryOptions: `DefaultMaxRetryinterval = TimeSpan.FromDays(6)` (the SDK never sends another).
DEFAULT_MAX_RETRY_INTERVAL = timedelta(days=6)


@dataclass(frozen=True)
class RetryPolicy:
    """The retry options an orchestrator sent with its action (`retryOptions` JSON, milliseconds)."""

    first_retry_interval_ms: float
    max_number_of_attempts: int
    backoff_coefficient: float = 1.0
    max_retry_interval_ms: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RetryPolicy:
        max_interval = data.get("maxRetryIntervalInMilliseconds")
        return cls(
            first_retry_interval_ms=float(data["firstRetryIntervalInMilliseconds"]),
            max_number_of_attempts=int(data["maxNumberOfAttempts"]),
            backoff_coefficient=float(data.get("backoffCoefficient", 1.0) or 1.0),
            max_retry_interval_ms=float(max_interval) if max_interval else None,
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "firstRetryIntervalInMilliseconds": self.first_retry_interval_ms,
            "maxNumberOfAttempts": self.max_number_of_attempts,
            "backoffCoefficient": self.backoff_coefficient,
        }
        if self.max_retry_interval_ms is not None:
            data["maxRetryIntervalInMilliseconds"] = self.max_retry_interval_ms
        return data

    def delay_after_attempt(self, attempt: int) -> timedelta:
        """Delay before the next try after 1-based `attempt` failed (DTFx `ComputeNextDelay`, retryCount =
        attempt-1).
        """
        delay = timedelta(milliseconds=self.first_retry_interval_ms * self.backoff_coefficient ** (attempt - 1))
        cap = (
            DEFAULT_MAX_RETRY_INTERVAL
            if self.max_retry_interval_ms is None
            else timedelta(milliseconds=self.max_retry_interval_ms)
        )
        return delay if delay < cap else cap
