"""Session locks of the Agent queues: when a live consumer renews, and the budget that keeps a dead one harmless.

`agent-requests` and `agent-replies` carry SessionId = orderId (FIFO per order, one consumer per order at a time:
seed 002, Sequential Convoy). A consumer that dies holding an order's session (kill -9, OOM, a platform restart)
cannot release it: the session stays locked until its LockDuration runs out (Service Bus docs, "Message sessions":
the lock is released when the receiver closes it or the lock expires). The order's next request or reply waits
behind that lock. So the locks are short (LockDuration PT5S, the smallest value Service Bus accepts: the portal's
minimum, and the emulator's since 1.1.2, "support for updating LockDuration to a minimum of 5 seconds") and every
live consumer renews its session lock while it holds the session (`renew_delay`), and the settings keep this rule:

1. **A crash never costs an attempt.** A dead Agent delays an order's request by at most LockDuration of
   `agent-requests`; a dead host delays its reply by at most LockDuration of `agent-replies` (measured from the
   crash: a live consumer renews, so the lock it leaves runs at most one LockDuration past its last renewal). So

       StepTimeoutSeconds > LockDuration(agent-requests) + LockDuration(agent-replies) + CRASH_HEADROOM_SECONDS

2. **The attempts left after a lost one outlast the lock.** A restart can still outlast the headroom and cost an
   attempt. (A kill between the Starter's claim and `start_new` does not: the Supervisor finds that attempt's
   orchestration missing and starts it again in the same attempt, orderflow/supervisor.py.) The attempt lost ended
   at most one step after the crash; the remaining FailureThreshold - 1 attempts,
   with the backoffs before them, must end after the dead locks and the headroom have passed:

       (FailureThreshold - 1) x StepTimeoutSeconds + sum(backoff(n) for n in 1..FailureThreshold-1)
           > LockDuration(agent-requests) + LockDuration(agent-replies) + CRASH_HEADROOM_SECONDS

   (stronger than the older "FailureThreshold x (StepTimeoutSeconds + backoff) > LockDuration": that one counted
   the lost attempt itself, which ran while the lock was still dead).

3. **Renewal outlasts the work.** A function's message (and session) lock is renewed only up to host.json
   `maxAutoLockRenewalDuration` (Azure.Messaging.ServiceBus processor, `RenewSessionLock`: the renewal is cancelled
   after `MaxAutoLockRenewalDuration`); with 5 s locks a function still working after that loses its lock within
   5 s. The longest the app's functions legitimately hold a message is bounded by a step (a reply later than its
   step's CompleteBy is moot) and by the claim lease (the submission claims and starts the order within it):

       maxAutoLockRenewalDuration >= max(StepTimeoutSeconds, ClaimLeaseSeconds)

CRASH_HEADROOM_SECONDS covers what follows the dead lock: the Agent's call to the remote service and the reply's way
into the orchestration (raise_event, a replay), plus a consumer restart that outlasts the lock. A restart runs
while the lock is still dead, so only its excess over LockDuration counts: with 5 s locks a devhost or Agent restart
of up to about 10 s fits (the simulator answers in milliseconds). A slower restart can cost an attempt; rule 2 is
what absorbs that.

`tests/product/infra/test_crash_budget.py` checks the rule on the Azure defaults (`orderflow/settings.py`, the Bicep
queues, host.json) and on the demo's `lab/system.py` LOCAL_DEFAULTS with `servicebus.config.json`.
"""

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
