"""Retries inside the deadline: no call after it, timeouts bounded by it, one key, seeded backoff."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.agent_fakes import START, FakeClock

from agent.errors import Classification, ErrorCode
from agent.remote import CallResult
from agent.retry import RetryPolicy, backoff_delay, call_with_retries

TRANSIENT = CallResult(Classification.TRANSIENT, 503, error="HTTP 503")
OK = CallResult(Classification.SUCCESS, 200, {"confirmation": "c-1"})
REJECTED = CallResult(Classification.PERMANENT, 422, {"errorCode": "PaymentDeclined"}, error="HTTP 422")
BODY = {"orderId": "o-1", "idempotencyKey": "o-1:charge-payment", "payload": {}}


@dataclass
class ScriptedCaller:
    """Returns the scripted results in turn (the last one forever); a call takes `duration` of fake time."""

    clock: FakeClock
    script: list[CallResult]
    duration: float = 0.0
    calls: list[tuple[datetime, float, dict[str, Any]]] = field(default_factory=list)

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        self.calls.append((self.clock.now(), timeout, dict(body)))
        self.clock.advance(min(self.duration, timeout))
        index = min(len(self.calls) - 1, len(self.script) - 1)
        return (
            self.script[index]
            if self.duration <= timeout
            else CallResult(Classification.TRANSIENT, error="TimeoutError")
        )


def policy(**overrides: Any) -> RetryPolicy:
    return RetryPolicy(**{"max_retries": 50, "backoff_base": 0.1, "backoff_max": 1.0, "call_timeout": 5.0, **overrides})


async def test_retries_stop_at_the_deadline(clock: FakeClock) -> None:
    deadline = START + timedelta(seconds=2)
    caller = ScriptedCaller(clock, [TRANSIENT], duration=0.05)
    outcome = await call_with_retries(caller, "charge-payment", BODY, deadline, policy(), clock)
    assert not outcome.succeeded and not outcome.permanent
    assert outcome.error_code == ErrorCode.DEADLINE_EXCEEDED
    assert len(caller.calls) > 3  # it did retry
    for started, timeout, _ in caller.calls:
        assert started < deadline  # never starts a call after the deadline
        assert timeout <= (deadline - started).total_seconds()  # each call bounded by the time left
    assert clock.now() <= deadline  # and it never slept past it


async def test_call_timeout_is_the_time_left_when_shorter(clock: FakeClock) -> None:
    deadline = START + timedelta(seconds=1.5)
    caller = ScriptedCaller(clock, [TRANSIENT], duration=10.0)  # every call hangs until its timeout
    outcome = await call_with_retries(caller, "charge-payment", BODY, deadline, policy(call_timeout=1.0), clock)
    assert caller.calls[0][1] == pytest.approx(1.0)  # capped by call_timeout
    assert caller.calls[1][1] < 0.5  # then by what is left to the deadline
    assert outcome.error_code == ErrorCode.DEADLINE_EXCEEDED
    assert clock.now() <= deadline


async def test_same_idempotency_key_on_every_retry(clock: FakeClock) -> None:
    caller = ScriptedCaller(clock, [TRANSIENT, TRANSIENT, TRANSIENT, OK])
    outcome = await call_with_retries(caller, "charge-payment", BODY, START + timedelta(seconds=30), policy(), clock)
    assert outcome.succeeded and outcome.attempts == 4 and outcome.result == {"confirmation": "c-1"}
    assert [body for _, _, body in caller.calls] == [BODY] * 4


async def test_retries_exhausted_before_the_deadline(clock: FakeClock) -> None:
    caller = ScriptedCaller(clock, [TRANSIENT])
    outcome = await call_with_retries(caller, "s", BODY, START + timedelta(minutes=5), policy(max_retries=3), clock)
    assert len(caller.calls) == 4
    assert outcome.error_code == ErrorCode.RETRIES_EXHAUSTED and not outcome.permanent
    assert "HTTP 503" in (outcome.error or "")


async def test_permanent_failure_is_not_retried(clock: FakeClock) -> None:
    caller = ScriptedCaller(clock, [TRANSIENT, REJECTED, OK])
    outcome = await call_with_retries(caller, "s", BODY, START + timedelta(seconds=30), policy(), clock)
    assert len(caller.calls) == 2
    assert outcome.permanent and outcome.error_code == "PaymentDeclined"


async def test_permanent_failure_without_a_code_gets_the_agent_code(clock: FakeClock) -> None:
    caller = ScriptedCaller(clock, [CallResult(Classification.PERMANENT, 400, error="HTTP 400")])
    outcome = await call_with_retries(caller, "s", BODY, START + timedelta(seconds=30), policy(), clock)
    assert outcome.error_code == ErrorCode.REMOTE_REJECTED


async def test_retry_after_is_honoured(clock: FakeClock) -> None:
    throttled = CallResult(Classification.TRANSIENT, 429, error="HTTP 429", retry_after=2.0)
    caller = ScriptedCaller(clock, [throttled, OK])
    outcome = await call_with_retries(caller, "s", BODY, START + timedelta(seconds=30), policy(), clock)
    assert outcome.succeeded and clock.sleeps == [2.0]


async def test_retry_after_past_the_deadline_stops_at_once(clock: FakeClock) -> None:
    throttled = CallResult(Classification.TRANSIENT, 429, error="HTTP 429", retry_after=60.0)
    caller = ScriptedCaller(clock, [throttled, OK])
    outcome = await call_with_retries(caller, "s", BODY, START + timedelta(seconds=30), policy(), clock)
    assert outcome.error_code == ErrorCode.DEADLINE_EXCEEDED and "HTTP 429" in (outcome.error or "")
    assert len(caller.calls) == 1 and clock.sleeps == []  # no pointless wait until the deadline


async def test_no_call_when_less_than_the_minimum_budget_is_left(clock: FakeClock) -> None:
    caller = ScriptedCaller(clock, [OK])
    deadline = START + timedelta(milliseconds=5)
    outcome = await call_with_retries(caller, "s", BODY, deadline, policy(min_call_budget=0.01), clock)
    assert caller.calls == [] and outcome.error_code == ErrorCode.DEADLINE_EXCEEDED and outcome.attempts == 0


def test_backoff_is_exponential_jittered_capped_and_seeded() -> None:
    p = policy(backoff_base=0.1, backoff_max=1.0, jitter_seed=42)
    delays = [backoff_delay(p, "k", n) for n in range(1, 8)]
    for n, delay in enumerate(delays, start=1):
        ceiling = min(1.0, 0.1 * 2 ** (n - 1))
        assert ceiling / 2 <= delay <= ceiling  # equal jitter: between half and the full ceiling
    assert delays == [backoff_delay(p, "k", n) for n in range(1, 8)]  # a pure function of (seed, key, n)
    other_seed = [backoff_delay(policy(backoff_base=0.1, backoff_max=1.0, jitter_seed=43), "k", n) for n in range(1, 8)]
    assert other_seed != delays
    assert len({backoff_delay(p, f"k{i}", 3) for i in range(20)}) > 15  # keys do not retry in lockstep
