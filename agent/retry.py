"""Retries inside the deadline: exponential backoff with seeded jitter, bounded by CompleteBy and a budget.

The Agent's contract from the Scheduler Agent Supervisor pattern (seed 000/001, "Agent"): no call starts at or after
the deadline (nor with less than `min_call_budget` left); each call's timeout is the time left (capped by
`call_timeout`); no backoff sleep runs past the deadline; the body (idempotency key included) is built once and sent
unchanged; `max_retries` bounds the calls. With a `gate` (the shared circuit breaker) every call is `acquire`d first
and `record`ed after; a refusal before any call ends the request as `CircuitOpen`, after calls as `RetriesExhausted`.
Time comes from an injected `Clock`, so tests drive the loop without sleeping. In detail: docs/modules-product.md."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from agent.errors import Classification, ErrorCode
from agent.remote import CallResult, RemoteCaller
from orderflow.breaker import BreakerState, Permit, Refusal
from orderflow.clock import WaitingClock as Clock

__all__ = ["CallGate", "Clock", "RetryPolicy", "StepOutcome", "backoff_delay", "call_with_retries", "unit_hash"]


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4  # calls after the first; at most max_retries + 1 calls per request
    backoff_base: float = 0.1  # seconds
    backoff_max: float = 5.0
    call_timeout: float = 30.0  # upper bound of one call, further bounded by the deadline
    min_call_budget: float = 0.01  # do not start a call with less time than this left
    jitter_seed: int = 0


def unit_hash(*parts: object) -> float:
    """A deterministic float in [0, 1) from `parts`: the seeded randomness of the Agent and the simulator."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return float(int.from_bytes(digest[:8], "big")) / float(2**64)


def backoff_delay(policy: RetryPolicy, key: str, retry: int, retry_after: float | None = None) -> float:
    """Delay before retry number `retry` (1-based): equal-jitter exponential backoff, at least `retry_after`.

    The jitter is a pure function of (seed, key, retry), so a run replays identically whatever the timing.
    """
    ceiling = min(policy.backoff_max, policy.backoff_base * float(2 ** (retry - 1)))
    delay = ceiling / 2 + ceiling / 2 * unit_hash(policy.jitter_seed, key, retry)
    return max(delay, retry_after or 0.0)


class CallGate(Protocol):
    """What the retry loop asks before each call and tells after it: the circuit breaker of `service`."""

    service: str

    async def acquire(self) -> Permit | Refusal: ...

    async def record(self, permit: Permit, ok: bool) -> None: ...


@dataclass(frozen=True)
class StepOutcome:
    """The end of one request's calls: success with the service's result, or a failure and why."""

    succeeded: bool
    attempts: int
    result: dict[str, Any]
    permanent: bool = False
    error_code: str | None = None
    error: str | None = None


async def call_with_retries(
    caller: RemoteCaller,
    step: str,
    body: dict[str, Any],
    deadline: datetime,
    policy: RetryPolicy,
    clock: Clock,
    gate: CallGate | None = None,
) -> StepOutcome:
    """Call `step` until success, a permanent failure, `max_retries`, the deadline or the `gate`'s refusal,
    whichever is first.

    What the breaker counts: a *request* whose calls all failed transiently (its retries did not absorb the
    failures) is one failure; calls whose failures the retries absorbed count for nothing, so a remote that fails
    30 % of calls but answers every request keeps the breaker closed. A half-open probe is one call: its own outcome
    closes or re-opens the breaker."""
    request = _Request(caller, step, body, deadline, policy, clock, gate)
    outcome = await _calls(request)
    calls = request.permits
    if gate is not None and calls and not calls[-1].probe and not outcome.succeeded and not outcome.permanent:
        await gate.record(calls[-1], False)
    return outcome


@dataclass
class _Request:
    """One request's calls: what `call_with_retries` was given, and the permits of the calls made so far."""

    caller: RemoteCaller
    step: str
    body: dict[str, Any]
    deadline: datetime
    policy: RetryPolicy
    clock: Clock
    gate: CallGate | None
    permits: list[Permit] = field(default_factory=list)


async def _calls(request: _Request) -> StepOutcome:
    caller, step, body, deadline = request.caller, request.step, request.body, request.deadline
    policy, clock, gate, calls = request.policy, request.clock, request.gate, request.permits
    key = str(body.get("idempotencyKey", ""))
    last: CallResult | None = None
    attempts = policy.max_retries + 1
    for attempt in range(1, attempts + 1):
        if attempt > 1 and not await _backoff(policy, key, attempt - 1, last, deadline, clock):
            return _deadline_outcome(attempt - 1, last)
        permit = Permit()
        if gate is not None:
            admitted = await gate.acquire()
            if isinstance(admitted, Refusal):
                return _refused_outcome(gate.service, admitted, attempt - 1, last)
            permit = admitted
        # Measured after `acquire` (it may read the breaker's store). Should that read have used up the time left, a
        # half-open probe taken here goes unused; the breaker gives it back after its lease.
        remaining = _remaining(deadline, clock)
        if remaining < policy.min_call_budget:
            return _deadline_outcome(attempt - 1, last)
        last = await caller.call(step, body, min(remaining, policy.call_timeout))
        calls.append(permit)
        if gate is not None and permit.probe:
            await gate.record(permit, last.classification is not Classification.TRANSIENT)
        if last.classification is not Classification.TRANSIENT:
            return _final_outcome(attempt, last)
    assert last is not None
    return StepOutcome(
        False,
        attempts,
        {},
        permanent=False,
        error_code=ErrorCode.RETRIES_EXHAUSTED,
        error=f"{attempts} attempts failed transiently; last: {last.error}",
    )


def _remaining(deadline: datetime, clock: Clock) -> float:
    return (deadline - clock.now()).total_seconds()


async def _backoff(
    policy: RetryPolicy, key: str, retry: int, last: CallResult | None, deadline: datetime, clock: Clock
) -> bool:
    """Sleep before a retry; False (without sleeping) when the retry could not start before the deadline."""
    delay = backoff_delay(policy, key, retry, last.retry_after if last else None)
    if delay + policy.min_call_budget > _remaining(deadline, clock):
        return False
    await clock.sleep(delay)
    return True


def _final_outcome(attempts: int, result: CallResult) -> StepOutcome:
    if result.classification is Classification.SUCCESS:
        return StepOutcome(True, attempts, result.body)
    return StepOutcome(
        False,
        attempts,
        {},
        permanent=True,
        error_code=result.error_code or ErrorCode.REMOTE_REJECTED,
        error=result.error,
    )


def _refused_outcome(service: str, refusal: Refusal, calls: int, last: CallResult | None) -> StepOutcome:
    """The breaker refused the next call: `CircuitOpen` when no call was made for this request, else an ordinary
    transient failure (retries stopped early; the last call's error)."""
    if calls == 0:
        state = "" if refusal.state is BreakerState.OPEN else f" ({refusal.state.value}, its probes taken)"
        return StepOutcome(
            False,
            0,
            {"retryAfterSeconds": refusal.retry_after.total_seconds()},
            permanent=False,
            error_code=ErrorCode.CIRCUIT_OPEN,
            error=f"the circuit of {service} is open{state}; remote not called",
        )
    return _transient_outcome(
        calls,
        ErrorCode.RETRIES_EXHAUSTED,
        f"{calls} attempt(s) failed transiently, then the circuit of {service} opened",
        last,
    )


def _deadline_outcome(attempts: int, last: CallResult | None) -> StepOutcome:
    return _transient_outcome(
        attempts, ErrorCode.DEADLINE_EXCEEDED, f"deadline reached after {attempts} attempt(s)", last
    )


def _transient_outcome(attempts: int, code: ErrorCode, what: str, last: CallResult | None) -> StepOutcome:
    """A failure that may pass (permanent = false): the Supervisor owns the retry; `what` plus the last call's error."""
    detail = f"; last: {last.error}" if last and last.error else ""
    return StepOutcome(False, attempts, {}, permanent=False, error_code=code, error=f"{what}{detail}")
