"""Waiting out a transient failure inside one operation (`patiently`): the same operation again after waits doubling
from 0.5 s to 8 s, while `orderflow.errors.is_transient` says it may pass and the time left allows; then, or on any
other failure, it raises. For idempotent operations only: the submission's writes and its acknowledgement, the
Scheduler's request send, the Agent's reply and its settlement. Why (a bus outage costs no delivery, no attempt):
docs/modules-product.md, section orderflow/patience.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeVar

from orderflow.clock import Clock
from orderflow.errors import is_transient
from orderflow.text import QUOTE_MAX, shown

T = TypeVar("T")
FIRST_WAIT, LONGEST_WAIT = 0.5, 8.0
log = logging.getLogger("orderflow.patience")


async def patiently(
    attempt: Callable[[], Awaitable[T]],
    clock: Clock,
    until: datetime,
    *,
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    logger: logging.Logger = log,
) -> T:
    """`attempt()`, again after each transient failure while the next try would still start before `until`."""
    wait = FIRST_WAIT
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_transient(exc) or clock.now() + timedelta(seconds=wait) > until:
                raise
            logger.warning("%s: %s; retrying in %.1f s", what, shown(exc, QUOTE_MAX * 4), wait)
            await sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT)
