"""The Agent keeps an order's session on `agent-requests` while it works, with the queue's 5 s LockDuration.

The lock is short on purpose (orderflow/session_locks.py: a dead Agent must block an order for at most 5 s), so a
live Agent must renew it: at half the remaining time (2.5 s), never later than the expiry, retrying a failed renewal
while the lock lasts and stopping once it is lost. Time is an injected clock shared with the embedded broker: "the
Agent worked 20 s on one request" is 20 clock moves, not a wait.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError, SessionCannotBeLockedError, SessionLockLostError
from support.agent_fakes import REPLIES, REQUESTS, FakeBus, FakeClock, agent_config, make_request, request_message
from support.stepped_clock import SteppedClock

from agent.errors import Classification
from agent.remote import CallResult
from agent.worker import AgentWorker
from orderflow.adapters import aio_bus_from_connection_string
from orderflow.session_locks import MIN_LOCK_DURATION

REPO = Path(__file__).resolve().parents[3]
LOCK = timedelta(seconds=5)


class Session:
    """A session whose lock lasts LOCK from each renewal; `failures` renewals fail first with `error`."""

    def __init__(self, clock: Any, failures: int = 0, error: Exception | None = None) -> None:
        self.clock = clock
        self.session_id = "o-1"
        self.locked_until_utc: datetime = clock.now() + LOCK
        self.failures = failures
        self.error = error or ServiceBusConnectionError(message="link detached")
        self.attempts: list[tuple[datetime, datetime]] = []  # (when, lock expiry at that moment)

    async def renew_lock(self) -> datetime:
        self.attempts.append((self.clock.now(), self.locked_until_utc))
        if self.failures:
            self.failures -= 1
            raise self.error
        self.locked_until_utc = self.clock.now() + LOCK
        return self.locked_until_utc


class Receiver:
    def __init__(self, session: Session) -> None:
        self.session = session


class Instant:
    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        return CallResult(Classification.SUCCESS, 200, {"step": step})


async def _renew(clock: FakeClock, session: Session, until: int) -> None:
    """Run the renewer until `until` renewal attempts happened (bounded)."""
    worker = AgentWorker(FakeBus(), Instant(), agent_config(), clock)
    renewer = asyncio.create_task(worker._keep_session_locked(Receiver(session)))
    try:
        async with asyncio.timeout(5):
            while len(session.attempts) < until and not renewer.done():
                await asyncio.sleep(0)
    finally:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)


async def test_a_5_s_session_lock_is_renewed_every_2_5_s_before_it_expires(clock: FakeClock) -> None:
    session = Session(clock)
    await _renew(clock, session, until=4)
    assert clock.sleeps[:4] == [2.5, 2.5, 2.5, 2.5]
    assert all(when < expiry for when, expiry in session.attempts)  # never later than the lock


async def test_a_lock_about_to_expire_is_renewed_at_once(clock: FakeClock) -> None:
    session = Session(clock)
    session.locked_until_utc = clock.now() + timedelta(seconds=0.3)  # below the 0.4 s of the SDK's processor
    await _renew(clock, session, until=1)
    assert clock.sleeps[0] == 0.0 and session.attempts[0][0] < session.attempts[0][1]


async def test_a_failed_renewal_is_retried_while_the_lock_lasts(clock: FakeClock) -> None:
    session = Session(clock, failures=2)
    await _renew(clock, session, until=5)
    renewed = session.attempts[2:]  # two failures, then renewals again
    assert len(renewed) == 3 and all(when < expiry for when, expiry in session.attempts)
    assert session.locked_until_utc > clock.now()  # the session is still held


async def test_renewing_stops_once_the_lock_is_lost(clock: FakeClock) -> None:
    session = Session(clock, failures=10, error=SessionLockLostError())
    worker = AgentWorker(FakeBus(), Instant(), agent_config(), clock)
    await asyncio.wait_for(worker._keep_session_locked(Receiver(session)), 5)  # returns instead of raising
    assert len(session.attempts) == 1


async def test_renewing_stops_when_failures_outlast_the_lock(clock: FakeClock) -> None:
    session = Session(clock, failures=1000)
    worker = AgentWorker(FakeBus(), Instant(), agent_config(), clock)
    await asyncio.wait_for(worker._keep_session_locked(Receiver(session)), 5)
    assert session.attempts and all(when < expiry for when, expiry in session.attempts)
    assert clock.now() >= session.locked_until_utc  # it gave up only after the lock had run out


async def test_an_unknown_expiry_is_taken_as_the_service_bus_minimum(clock: FakeClock) -> None:
    session = Session(clock)
    session.locked_until_utc = None  # type: ignore[assignment]
    await _renew(clock, session, until=1)
    assert clock.sleeps[0] == MIN_LOCK_DURATION.total_seconds() / 2


class Gated:
    """A remote call that does not answer until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.calls = 0

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        self.calls += 1
        self.started.set()
        await asyncio.wait_for(self.gate.wait(), 60)
        return CallResult(Classification.SUCCESS, 200, {"step": step})


async def test_the_agent_holds_an_orders_session_while_it_works_four_lock_durations(tmp_path: Path) -> None:
    clock = SteppedClock()
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={REPO / 'servicebus.config.json'}"
    async with aio_bus_from_connection_string(conn, clock=clock) as client:
        broker = client.broker
        assert broker.queue_properties(REQUESTS).lock_duration == LOCK  # the product's queue, as configured
        request = make_request("o-1", deadline=clock.now() + timedelta(minutes=5))
        async with client.get_queue_sender(REQUESTS) as sender:
            await sender.send_messages(request_message(request))
        caller = Gated()
        worker = AgentWorker(client, caller, agent_config(max_concurrent_sessions=1), clock)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await asyncio.wait_for(caller.started.wait(), 20)
            for _ in range(20):  # the remote call takes 20 s: four times the session's LockDuration
                await clock.advance(1)
            with pytest.raises(SessionCannotBeLockedError):  # still the Agent's: no other consumer gets it
                broker.accept_session(REQUESTS, "o-1")
            caller.gate.set()
            async with asyncio.timeout(20):
                while broker.counts(REPLIES).active < 1 or broker.counts(REQUESTS).total > 0:
                    await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
    assert caller.calls == 1  # never redelivered
    assert worker.stats["succeeded"] == 1 and worker.stats["errors"] == 0


class Ahead:
    """The Agent's machine clock, `LOCK` ahead of the broker's."""

    def __init__(self, broker_clock: SteppedClock) -> None:
        self.broker_clock = broker_clock

    def now(self) -> datetime:
        return self.broker_clock.now() + LOCK

    async def sleep(self, seconds: float) -> None:
        await self.broker_clock.sleep(seconds)


async def test_an_agent_a_lock_duration_ahead_gives_each_session_back_and_pauses(tmp_path: Path) -> None:
    # The SDK judges a session lock on the machine's clock (_servicebus_session.py BaseSession._lock_expired:
    # locked_until_utc <= utc_now(); _base_handler.py _check_live raises SessionLockLostError before any call), so an
    # Agent whose clock runs the LockDuration ahead cannot use a session it is granted. It gives it back at once,
    # uncounted (the broker's lock had not expired), and its slot waits CLOCK_AHEAD_PAUSE_SECONDS instead of taking
    # the order from a healthy Agent again every ERROR_PAUSE_SECONDS.
    clock = SteppedClock()
    ahead = Ahead(clock)
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={REPO / 'servicebus.config.json'}"
    async with aio_bus_from_connection_string(conn, clock=clock, local_clock=ahead.now) as client:
        broker = client.broker
        async with client.get_queue_sender(REQUESTS) as sender:
            await sender.send_messages(request_message(make_request("o-1", deadline=clock.now() + LOCK * 10)))
        caller = Gated()
        worker = AgentWorker(client, caller, agent_config(max_concurrent_sessions=1, session_acceptors=1), ahead)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            async with asyncio.timeout(20):
                while not worker.stats["expired_on_arrival"]:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the slot is paused: nothing else is taken meanwhile
            lock = broker.accept_session(REQUESTS, "o-1")  # given back: another consumer gets the order at once
            [message] = broker.take(REQUESTS, 1, session=lock).messages
            assert message.delivery_count == 0  # the give-back counted no delivery
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
    assert (caller.calls, worker.stats["expired_on_arrival"], worker.stats["errors"]) == (0, 1, 0)
