"""Retry policy of CallActivityWithRetry / CallSubOrchestratorWithRetry, computed as the Durable Task
Framework does.

DTFx `RetryInterceptor.Invoke` (durabletask core/RetryInterceptor.cs): after attempt number `retryCount`
(0-based)
fails, it waits `FirstRetryInterval * BackoffCoefficient ** retryCount`, capped at `MaxRetryInterval`, with a
durable
timer -- also after the last attempt -- and only then gives up. The Python SDK relies on that extra timer
(azure/durable_functions/models/Task.py, RetryAbleTask.try_set_value).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any


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
        delay_ms = self.first_retry_interval_ms * self.backoff_coefficient ** (attempt - 1)
        if self.max_retry_interval_ms is not None:
            delay_ms = min(delay_ms, self.max_retry_interval_ms)
        return timedelta(milliseconds=delay_ms)

    def may_retry_after(self, attempt: int) -> bool:
        """True when another attempt follows the retry timer of 1-based `attempt`."""
        return attempt < self.max_number_of_attempts
