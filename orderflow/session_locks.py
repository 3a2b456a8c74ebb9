"""Session locks of the Agent queues: when a live consumer renews, and the budget that keeps a dead one harmless.

`agent-requests` and `agent-replies` carry SessionId = orderId (seed 002, Sequential Convoy); a consumer that dies
holding a session blocks the order until LockDuration runs out, so the locks are short (PT5S) and every live consumer
renews while it holds the session (`renew_delay`). The settings keep three rules (docs/modules-product.md):
1. StepTimeoutSeconds > LockDuration(agent-requests) + LockDuration(agent-replies) + CRASH_HEADROOM_SECONDS;
2. (FailureThreshold - 1) x StepTimeoutSeconds + sum(backoff(n) for n in 1..FailureThreshold-1) > the same sum;
3. host.json maxAutoLockRenewalDuration >= max(StepTimeoutSeconds, ClaimLeaseSeconds).
`tests/product/infra/test_crash_budget.py` checks them on the Azure defaults and on the demo's LOCAL_DEFAULTS."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from orderflow import settings
from orderflow.clock import WaitingClock
from orderflow.state_machine import exponential_backoff

# The smallest LockDuration Service Bus accepts (see the module docstring); also what a consumer assumes when it
# does not know when its lock runs out.
MIN_LOCK_DURATION = timedelta(seconds=5)
CRASH_HEADROOM_SECONDS = 5.0
# A lock with less than this left is renewed at once (Azure.Messaging.ServiceBus ServiceBusProcessor
# `CalculateRenewDelay`: "if (remainingTime < TimeSpan.FromMilliseconds(400)) return TimeSpan.Zero").
RENEW_AT_ONCE_BELOW_SECONDS = 0.4
RENEW_RETRY_SECONDS = 0.2  # pause before retrying a failed renewal while the lock is still valid


def renew_delay(remaining_seconds: float) -> float:
    """How long to wait before renewing a lock with `remaining_seconds` left: half of it, so a renewal is never
    later than the expiry and a failed one leaves time to retry; at once when less than 0.4 s is left."""
    if remaining_seconds < RENEW_AT_ONCE_BELOW_SECONDS:
        return 0.0
    return remaining_seconds / 2


async def keep_lock_renewed(
    renew: Callable[[], Awaitable[object]],
    locked_until: Callable[[], datetime | None],
    clock: WaitingClock,
    *,
    lost: tuple[type[BaseException], ...],
    transient: tuple[type[BaseException], ...],
    log: logging.Logger,
    what: str,
    max_duration_s: float | None = None,
) -> None:
    """Renew a lock at `renew_delay` of its remaining time until cancelled: the one renewal loop of the Agent and of
    devhost's Service Bus trigger. A `transient` failure is retried every RENEW_RETRY_SECONDS while the lock is still
    valid; renewing stops (returns) once the lock is `lost`, once its expiry has passed, and after `max_duration_s`
    (host.json maxAutoLockRenewalDuration) when given. The holder's next receive or settlement then reports the lost
    lock, and the broker redelivers (at-least-once). A lock whose expiry is unknown is taken to last
    MIN_LOCK_DURATION."""
    started = clock.now()
    expires = locked_until() or started + MIN_LOCK_DURATION
    delay = renew_delay((expires - started).total_seconds())
    while True:
        await clock.sleep(delay)
        now = clock.now()
        if now >= expires:
            log.warning("could not renew the lock of %s before it expired", what)
            return
        if max_duration_s is not None and (now - started).total_seconds() >= max_duration_s:
            return
        try:
            renewed = await renew()
        except lost:
            log.warning("lost the lock of %s", what)
            return
        except transient as exc:
            log.warning("renewing the lock of %s failed, retrying: %s", what, exc)
            delay = RENEW_RETRY_SECONDS
            continue
        fallback = renewed if isinstance(renewed, datetime) else clock.now() + MIN_LOCK_DURATION
        expires = locked_until() or fallback
        delay = renew_delay((expires - clock.now()).total_seconds())


@dataclass(frozen=True)
class CrashBudget:
    """The settings and lock durations the rule reads, in seconds."""

    step_timeout_s: float
    claim_lease_s: float
    failure_threshold: int
    backoff_base_s: float
    backoff_max_s: float
    requests_lock_s: float
    replies_lock_s: float
    headroom_s: float = CRASH_HEADROOM_SECONDS

    @classmethod
    def from_settings(cls, env: Mapping[str, str], *, requests_lock: timedelta, replies_lock: timedelta) -> CrashBudget:
        """From app settings (`env`; a missing one has its registry default) and the two queues' LockDuration."""
        return cls(
            step_timeout_s=settings.get_int("StepTimeoutSeconds", env),
            claim_lease_s=settings.get_int("ClaimLeaseSeconds", env),
            failure_threshold=settings.get_int("FailureThreshold", env),
            backoff_base_s=settings.get_int("RetryBackoffBaseSeconds", env),
            backoff_max_s=settings.get_int("RetryBackoffMaxSeconds", env),
            requests_lock_s=requests_lock.total_seconds(),
            replies_lock_s=replies_lock.total_seconds(),
        )

    @property
    def dead_lock_s(self) -> float:
        """The longest one step can wait behind locks left by dead consumers, plus the headroom."""
        return self.requests_lock_s + self.replies_lock_s + self.headroom_s

    @property
    def backoffs_s(self) -> list[float]:
        """The backoffs before attempts 2..FailureThreshold."""
        backoff = exponential_backoff(self.backoff_base_s, self.backoff_max_s)
        return [backoff(n).total_seconds() for n in range(1, self.failure_threshold)]

    @property
    def spare_attempts_s(self) -> float:
        """How long the attempts after a lost one run, with the backoffs before them."""
        return (self.failure_threshold - 1) * self.step_timeout_s + sum(self.backoffs_s)

    def step_rule(self) -> str:
        """Rule 1 with its numbers, e.g. `30 s > 5 s + 5 s + 5 s = 15 s`."""
        return (
            f"{_s(self.step_timeout_s)} > {_s(self.requests_lock_s)} + {_s(self.replies_lock_s)} + "
            f"{_s(self.headroom_s)} = {_s(self.dead_lock_s)}"
        )

    def attempts_rule(self) -> str:
        """Rule 2 with its numbers, e.g. `(3 - 1) × 30 s + 2 s + 4 s = 66 s > 15 s`."""
        backoffs = "".join(f" + {_s(b)}" for b in self.backoffs_s)
        return (
            f"({self.failure_threshold} - 1) × {_s(self.step_timeout_s)}{backoffs} = "
            f"{_s(self.spare_attempts_s)} > {_s(self.dead_lock_s)}"
        )

    def violations(self, max_auto_lock_renewal_s: float | None = None) -> list[str]:
        """Every broken rule, explained with its numbers; empty when the budget holds."""
        broken: list[str] = []
        for name, lock in (("agent-requests", self.requests_lock_s), ("agent-replies", self.replies_lock_s)):
            if lock < MIN_LOCK_DURATION.total_seconds():
                broken.append(
                    f"LockDuration of {name} is {_s(lock)}, below the Service Bus minimum of "
                    f"{_s(MIN_LOCK_DURATION.total_seconds())}"
                )
        if not self.step_timeout_s > self.dead_lock_s:
            broken.append(
                "a crash can cost an attempt: StepTimeoutSeconds must exceed LockDuration(agent-requests) "
                "+ LockDuration(agent-replies) + headroom, but "
                f"{_s(self.step_timeout_s)} <= {_s(self.dead_lock_s)}"
            )
        if not self.spare_attempts_s > self.dead_lock_s:
            broken.append(
                "the attempts after a lost one end before the dead locks: (FailureThreshold - 1) x "
                "StepTimeoutSeconds + backoffs must exceed the locks + headroom, but "
                f"{_s(self.spare_attempts_s)} <= {_s(self.dead_lock_s)}"
            )
        longest_hold = max(self.step_timeout_s, self.claim_lease_s)
        if max_auto_lock_renewal_s is not None and max_auto_lock_renewal_s < longest_hold:
            broken.append(
                "host.json maxAutoLockRenewalDuration must cover the longest a function holds a message "
                "(max(StepTimeoutSeconds, ClaimLeaseSeconds)), but "
                f"{_s(max_auto_lock_renewal_s)} < {_s(longest_hold)}"
            )
        return broken


def _s(seconds: float) -> str:
    return f"{seconds:g} s"
