"""The receive loop on fakes: happy path through the simulator, FIFO per session, concurrency cap, poison,
redelivery after a failed reply, graceful stop with a request in flight, a few waits for a session at a time and
the slots they hand out."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.agent_fakes import (
    ALERTS,
    REPLIES,
    REQUESTS,
    FakeBus,
    agent_config,
    make_request,
    raw_message,
    request_message,
)

from agent import worker as worker_module
from agent.remote import CallResult, HttpRemoteCaller, RemoteCaller
from agent.worker import AgentWorker
from lab.simulator import FaultConfig, Simulator
from orderflow.messages import STEPS, AgentReply


@dataclass
class Tracking:
    """Wraps a RemoteCaller: records call order per order and the peak number of orders in flight."""

    inner: RemoteCaller
    order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    in_flight: set[str] = field(default_factory=set)
    peak: int = 0
    gate: asyncio.Event | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        order_id = body["orderId"]
        self.order[order_id].append(step)
        self.in_flight.add(order_id)
        self.peak = max(self.peak, len(self.in_flight))
        self.started.set()
        try:
            if self.gate is not None:
                await asyncio.wait_for(self.gate.wait(), 5)
            await asyncio.sleep(0.005)  # let other sessions overlap (measured, not relied on for correctness)
            return await self.inner.call(step, body, timeout)
        finally:
            self.in_flight.discard(order_id)


async def enqueue_orders(bus: FakeBus, orders: int) -> None:
    for step in STEPS:  # steps interleaved across orders; FIFO must hold within each order
        for i in range(orders):
            await bus.send(REQUESTS, request_message(make_request(f"o-{i}", step, deadline=far_future())))


def far_future() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(minutes=5)


def replies(bus: FakeBus) -> list[AgentReply]:
    return [AgentReply.model_validate_json(m.raw) for m in bus.queue(REPLIES).active]


async def run_until(worker: AgentWorker, bus: FakeBus, done: Any, timeout: float = 10) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await bus.wait_for(done, timeout)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout)


async def test_happy_path_all_steps_succeed_in_order(bus: FakeBus, tmp_path: Path) -> None:
    config = agent_config(max_concurrent_sessions=4)
    async with (
        Simulator(FaultConfig(seed=3, fail_first_calls=1), tmp_path / "db") as sim,
        aiohttp.ClientSession() as http,
    ):
        caller = Tracking(HttpRemoteCaller(http, sim.url))
        worker = AgentWorker(bus, caller, config)
        await enqueue_orders(bus, 8)
        await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 24)
        report = sim.store.report()
    got = replies(bus)
    assert all(r.outcome == "succeeded" for r in got)
    assert {m.message_id for m in bus.queue(REPLIES).active} == {
        f"o-{i}:1:{s.value}:reply" for i in range(8) for s in STEPS
    }
    assert all(caller.order[f"o-{i}"] == [s.value for s in STEPS for _ in range(2)] for i in range(8))  # FIFO
    assert 1 < caller.peak <= 4  # sessions in parallel, never more than the cap
    assert report["totalApplied"] == 24 and report["duplicates"] == 0
    assert bus.queue(REQUESTS).active == [] and len(bus.queue(REQUESTS).completed) == 24
    assert worker.stats["succeeded"] == 24


@dataclass
class Instant:
    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        from agent.errors import Classification

        return CallResult(Classification.SUCCESS, 200, {"step": step})


async def test_poison_request_goes_to_dead_letter_and_the_session_goes_on(bus: FakeBus) -> None:
    await bus.send(REQUESTS, raw_message("{broken", session_id="o-1", message_id="bad-1"))
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
    worker = AgentWorker(bus, Instant(), agent_config())
    await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 1)
    assert [m.message_id for m in bus.queue(REQUESTS).dead] == ["bad-1"]
    assert bus.queue(REQUESTS).dead[0].dead_letter_reason == "InvalidJson"
    assert len(bus.queue(ALERTS).active) == 1 and worker.stats["dead-lettered"] == 1


async def test_failed_reply_send_abandons_and_redelivers_once_replied(bus: FakeBus, tmp_path: Path) -> None:
    async with Simulator(FaultConfig(seed=1), tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
        await bus.send(REQUESTS, request_message(make_request("o-1", STEPS[1], deadline=far_future())))
        bus.send_failures[REPLIES], bus.send_error = 1, RuntimeError  # not transient: given back at once
        worker = AgentWorker(bus, HttpRemoteCaller(http, sim.url), agent_config())
        await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 2)
        report = sim.store.report()
    first = "o-1:1:reserve-inventory"
    assert bus.events.index(f"abandon:{REQUESTS}:{first}") < bus.events.index(f"complete:{REQUESTS}:{first}")
    assert [r.step for r in replies(bus)] == [STEPS[0], STEPS[1]]  # order kept across the redelivery
    assert report["calls"] == 3 and report["totalApplied"] == 2 and report["duplicates"] == 0  # retried call replayed
    assert worker.stats["abandoned"] == 1


async def test_a_reply_send_refused_for_a_while_is_sent_again_in_place(bus: FakeBus, tmp_path: Path) -> None:
    # A transient bus failure (ConnectionError) of the reply is waited out by the handler (agent/handler.py,
    # orderflow/patience.py): the request is not given back, so it costs no delivery and no second remote call.
    async with Simulator(FaultConfig(seed=1), tmp_path / "db") as sim, aiohttp.ClientSession() as http:
        await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
        bus.send_failures[REPLIES] = 1
        worker = AgentWorker(bus, HttpRemoteCaller(http, sim.url), agent_config())
        await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 1)
        report = sim.store.report()
    assert not any(e.startswith("abandon:") for e in bus.events) and worker.stats["abandoned"] == 0
    assert report["calls"] == 1 and report["totalApplied"] == 1


async def test_a_few_receivers_wait_for_a_session_however_many_slots_are_free(bus: FakeBus) -> None:
    # A receiver waiting for a session is woken by every message sent to the queue (the embedded broker pokes each
    # waiter; on Service Bus each wait is an open link, and with the real SDK each accept opens its own connection,
    # about 0.5 s): `session_acceptors` waits at a time, not one per free slot, and not one in all (one accept at a
    # time capped the Agent at about 2 sessions/s over AMQP: docs/modules-product.md, agent/worker.py).
    caller = Tracking(Instant())
    worker = AgentWorker(bus, caller, agent_config(max_concurrent_sessions=8, session_acceptors=3))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for _ in range(1000):  # yield to the loop until the acceptors wait (no timer: each turn runs every ready task)
            if bus.session_waiters == 3:
                break
            await asyncio.sleep(0)
        assert bus.session_waiters == 3  # all three wait at once, before any session exists
        await enqueue_orders(bus, 6)
        await bus.wait_for(lambda: len(bus.queue(REPLIES).active) == 18)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert bus.peak_session_waiters == 3
    assert 1 < caller.peak <= 8  # still several sessions at once
    assert all(caller.order[f"o-{i}"] == [s.value for s in STEPS] for i in range(6))  # FIFO


async def test_a_single_slot_serves_every_session_in_turn(bus: FakeBus) -> None:
    caller = Tracking(Instant())
    worker = AgentWorker(bus, caller, agent_config(max_concurrent_sessions=1))
    await enqueue_orders(bus, 3)
    await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 9)
    assert caller.peak == 1  # a session's slot is free again once it is released, never before
    assert bus.locked_sessions == set()


async def test_a_session_wait_that_times_out_frees_its_slot_and_closes_its_receiver(
    bus: FakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "SESSION_ACCEPT_WAIT_SECONDS", 0.01)
    worker = AgentWorker(bus, Instant(), agent_config(max_concurrent_sessions=1, receive_wait_ms=10))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await bus.wait_for(lambda: bus.accept_timeouts >= 3)  # more timed-out waits than there are slots
        await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
        await bus.wait_for(lambda: len(bus.queue(REPLIES).active) == 1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    without_session = [r for r in bus.receivers if r.session is None]
    assert len(without_session) >= 3
    assert all(r.closes == 1 for r in without_session)  # a wait that got no session leaves nothing open
    assert worker.stats["errors"] == 0  # a timeout is no error


async def test_a_failing_session_is_released_and_its_slot_serves_again_after_the_pause(
    bus: FakeBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "ERROR_PAUSE_SECONDS", 0.01)
    bus.receive_failures = 1
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
    worker = AgentWorker(bus, Instant(), agent_config(max_concurrent_sessions=1))
    await run_until(worker, bus, lambda: len(bus.queue(REPLIES).active) == 1)
    assert worker.stats["errors"] == 1 and worker.stats["succeeded"] == 1
    assert [r.session.session_id for r in bus.receivers if r.session is not None][:2] == ["o-1", "o-1"]
    assert bus.locked_sessions == set()


async def test_stop_lets_the_request_in_flight_finish(bus: FakeBus) -> None:
    caller = Tracking(Instant(), gate=asyncio.Event())
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
    await bus.send(REQUESTS, request_message(make_request("o-1", STEPS[1], deadline=far_future())))
    stop = asyncio.Event()
    task = asyncio.create_task(AgentWorker(bus, caller, agent_config()).run(stop))
    await asyncio.wait_for(caller.started.wait(), 5)  # first request is in the remote call
    stop.set()
    caller.gate.set()  # type: ignore[union-attr]
    await asyncio.wait_for(task, 5)
    assert [r.step for r in replies(bus)] == [STEPS[0]]  # finished and replied
    assert [m.message_id for m in bus.queue(REQUESTS).completed] == ["o-1:1:reserve-inventory"]
    assert [m.message_id for m in bus.queue(REQUESTS).active] == ["o-1:1:charge-payment"]  # abandoned, not lost
    assert bus.locked_sessions == set()


async def test_stop_past_the_grace_cancels_without_settling(bus: FakeBus) -> None:
    caller = Tracking(Instant(), gate=asyncio.Event())  # never opened: the call hangs
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far_future())))
    stop = asyncio.Event()
    task = asyncio.create_task(AgentWorker(bus, caller, agent_config(shutdown_grace_ms=1)).run(stop))
    await asyncio.wait_for(caller.started.wait(), 5)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert bus.queue(REPLIES).active == [] and bus.queue(REQUESTS).completed == []
    assert len(bus.queue(REQUESTS).active) == 1  # redelivered later; the idempotency key absorbs the repeat


async def test_session_lock_is_renewed_at_half_its_remaining_time() -> None:
    from datetime import timedelta

    from support.agent_fakes import FakeClock

    clock = FakeClock()

    class Session:
        session_id = "o-1"
        renewals = 0
        locked_until_utc = clock.now() + timedelta(seconds=30)

        async def renew_lock(self) -> Any:
            self.renewals += 1
            self.locked_until_utc = clock.now() + timedelta(seconds=30)
            return self.locked_until_utc

    class Receiver:
        session = Session()

    worker = AgentWorker(FakeBus(), Instant(), agent_config(), clock)
    renewer = asyncio.create_task(worker._keep_session_locked(Receiver()))
    while Receiver.session.renewals < 3:
        await asyncio.sleep(0)
    renewer.cancel()
    assert clock.sleeps[:3] == [15.0, 15.0, 15.0]  # renewed well before the lock runs out


async def test_a_renewal_failure_stops_renewing_quietly(clock: Any) -> None:
    class Session:
        locked_until_utc = None

        async def renew_lock(self) -> Any:
            raise ConnectionError("lock lost")

    class Receiver:
        session = Session()

    worker = AgentWorker(FakeBus(), Instant(), agent_config(), clock)
    await asyncio.wait_for(worker._keep_session_locked(Receiver()), 5)  # returns instead of raising
