"""Error taxonomy of the Agent's remote calls: the one classifier (transient → retry, permanent → do not).

`classify(outcome)` takes what one HTTP call produced — a status code or the exception it raised — and says
whether it succeeded, may succeed on retry (transient) or never will (permanent). HTTP rules: 408, 429 and
every 5xx are transient, every other 4xx is permanent (project style brief). Azure's own clients draw the
same line (azure-core `pipeline/policies/_retry.py`: `_SAFE_CODES = set(range(506)) - {408, 429, 500, 502,
503, 504}`, so no other 4xx is retried); we also retry 501/505, which a flaky gateway can return.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

import aiohttp

from orderflow.breaker import CIRCUIT_OPEN as _CIRCUIT_OPEN


class Classification(StrEnum):
    SUCCESS = "success"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


class ErrorCode(StrEnum):
    """`AgentReply.errorCode` values the Agent itself produces (the remote service may add its own)."""

    DEADLINE_EXCEEDED = "DeadlineExceeded"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    REMOTE_REJECTED = "RemoteRejected"
    CIRCUIT_OPEN = _CIRCUIT_OPEN  # the breaker refused before any call: "not now" (result.retryAfterSeconds)


_TRANSIENT_STATUSES = frozenset({408, 429})
# Network-level failures: the request may or may not have reached the service; the idempotency key makes a
# retry safe either way.
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,  # connection refused/reset, payload errors, server disconnects, client timeouts
    asyncio.TimeoutError,  # = builtins.TimeoutError on 3.11
    ConnectionError,
    OSError,
)


def classify(outcome: int | BaseException) -> Classification:
    """Classify one remote call by its HTTP status or the exception it raised."""
    if isinstance(outcome, BaseException):
        return Classification.TRANSIENT if isinstance(outcome, _TRANSIENT_EXCEPTIONS) else Classification.PERMANENT
    if 200 <= outcome < 300:
        return Classification.SUCCESS
    if outcome in _TRANSIENT_STATUSES or 500 <= outcome < 600:
        return Classification.TRANSIENT
    return Classification.PERMANENT  # other 4xx, and 1xx/3xx a JSON API never answers with
