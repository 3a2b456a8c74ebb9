"""The Agent's fault switches for the timing drills (lab/timing_drills.py), injected by `python -m lab agent`
(lab/agent_faults.py): replies held back (AGENT_REPLY_DELAY_MS / _MIN_MS / _SHARE, `HeldReplies`) and a skewed clock
(AGENT_CLOCK_SKEW_SECONDS, `SkewedClock`). Each is off by default, and off it changes nothing; the deployed Agent has
none of them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import SessionLockLostError
from support.agent_fakes import REPLIES, REQUESTS, FakeBus, FakeClock, agent_config, make_request, request_message

from agent.config import AGENT_SETTINGS, build_parser
from agent.errors import Classification, ErrorCode
from agent.remote import CallResult
from agent.worker import AgentWorker, serve
from lab._timing_options import TimingOptions
from lab.agent_faults import (
    FAULT_SETTINGS,
    AgentFaults,
    HeldReplies,
    ReplyDelay,
    SkewedClock,
    agent_bus,
    agent_clock,
    faults_from_env,
    split_args,
    with_faults,
)
from orderflow.clock import SystemClock
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.messages import AgentReply

NO_BREAKER = {"CircuitBreakerFailureThreshold": "0"}


class ManualClock:
    """A clock whose sleeps end only when the test moves time past them."""

    def __init__(self) -> None:
        self._now = datetime(2030, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + timedelta(seconds=seconds), future))
        await future

    async def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        for due, future in list(self._sleepers):
            if due <= self._now and not future.done():
                future.set_result(None)
        for _ in range(5):  # let the woken tasks run to their next await
            await asyncio.sleep(0)


class Recording:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_messages(self, message: ServiceBusMessage) -> None:
        self.sent.append(str(message.message_id))


class Instant:
    def __init__(self) -> None:
        self.calls = 0

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        self.calls += 1
        return CallResult(Classification.SUCCESS, 200, {"step": step})


def far() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=5)


def ids(n: int) -> list[str]:
    return [f"o-{i}:1:reserve-inventory:reply" for i in range(n)]


# --- off by default ---------------------------------------------------------------------------------------------


def test_the_switches_are_off_by_default_and_off_change_nothing() -> None:
    faults = faults_from_env({})
    assert faults == AgentFaults() and (faults.reply_delay, faults.clock_skew_seconds) == (ReplyDelay(0, 0, 1.0), 0.0)
    assert not faults.reply_delay.enabled
    assert all(faults.reply_delay.seconds(i) == 0.0 for i in ids(50))
    clock, client = FakeClock(), FakeBus()
    assert agent_clock(faults, clock) is clock  # no wrapper at all
    assert with_faults(client, REPLIES, faults, clock, 1.0) is client


def test_the_deployed_agent_has_no_fault_switch() -> None:
    names = {s.name for s in FAULT_SETTINGS}
    assert not names & {s.name for s in AGENT_SETTINGS}
    flags = {a for action in build_parser()._actions for a in action.option_strings}
    assert not {"--reply-delay-ms", "--reply-delay-min-ms", "--reply-delay-share", "--clock-skew-seconds"} & flags


def test_the_lab_entry_takes_the_switches_as_flags_and_passes_the_rest_to_the_agent() -> None:
    given, rest = split_args(["--clock-skew-seconds", "-2", "--jitter-seed", "3", "--reply-delay-ms", "50"])
    assert given == {"AGENT_CLOCK_SKEW_SECONDS": -2.0, "AGENT_REPLY_DELAY_MS": 50}
    assert rest == ["--jitter-seed", "3"]
    faults = faults_from_env({"AGENT_REPLY_DELAY_MS": "9", **given}, seed=3)
    assert faults.clock_skew_seconds == -2.0 and faults.reply_delay == ReplyDelay(50, 0, 1.0, 3)


async def test_without_the_switch_the_reply_is_sent_before_the_request_is_completed(bus: FakeBus) -> None:
    request = make_request("o-1", deadline=far())
    await bus.send(REQUESTS, request_message(request))
    await _run_until(AgentWorker(bus, Instant(), agent_config()), bus, lambda: bool(bus.queue(REPLIES).active))
    assert _settled_order(bus, request.message_id()) == ["send", "complete"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENT_REPLY_DELAY_SHARE": "1.5"}, "within \\[0, 1\\]"),
        ({"AGENT_REPLY_DELAY_MS": "100", "AGENT_REPLY_DELAY_MIN_MS": "200"}, "must not exceed"),
        ({"AGENT_REPLY_DELAY_MS": "-1"}, "must not be negative"),
        ({"AGENT_CLOCK_SKEW_SECONDS": "soon"}, "must be a number"),
        ({"AGENT_CLOCK_SKEW_SECONDS": "nan"}, "finite"),
    ],
)
def test_invalid_switch_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults_from_env(env)


# --- replies held back ------------------------------------------------------------------------------------------


def test_which_replies_are_held_and_how_long_is_seeded_by_message_id() -> None:
    delay = ReplyDelay(max_ms=1000, min_ms=200, share=0.3, seed=5)
    held = {i: delay.seconds(i) for i in ids(2000) if delay.seconds(i) > 0}
    assert 0.25 < len(held) / 2000 < 0.35
    assert all(0.2 <= s <= 1.0 for s in held.values())
    assert max(held.values()) > 0.9 and min(held.values()) < 0.3  # spread over the range
    assert {i: ReplyDelay(1000, 200, 0.3, 5).seconds(i) for i in held} == held  # a pure function
    assert {i for i in ids(2000) if ReplyDelay(1000, 200, 0.3, 6).seconds(i) > 0} != set(held)  # the seed counts
    assert all(ReplyDelay(1000, 0, 1.0, 5).seconds(i) > 0 for i in ids(100))  # share 1: every reply
    assert not any(ReplyDelay(1000, 0, 0.0, 5).seconds(i) for i in ids(100))  # share 0: none


async def test_a_held_reply_goes_out_after_its_delay_and_a_later_one_overtakes_it() -> None:
    delay = ReplyDelay(max_ms=10_000, min_ms=1000, share=1.0, seed=1)
    first, second = sorted(ids(10), key=delay.seconds, reverse=True)[:2]  # first is held longer than second
    clock, inner = ManualClock(), Recording()
    held = HeldReplies(inner, delay, clock)
    await held.send_messages(ServiceBusMessage("{}", message_id=first))
    await held.send_messages(ServiceBusMessage("{}", message_id=second))
    await clock.advance(0)
    assert inner.sent == [] and held.held == 2  # send_messages returned; nothing went out yet
    await clock.advance(delay.seconds(second))
    assert inner.sent == [second]
    await clock.advance(delay.seconds(first) - delay.seconds(second))
    assert inner.sent == [second, first]


async def test_a_reply_not_chosen_goes_out_at_once() -> None:
    delay = ReplyDelay(max_ms=10_000, share=0.5, seed=1)
    at_once = next(i for i in ids(50) if delay.seconds(i) == 0)
    inner = Recording()
    held = HeldReplies(inner, delay, ManualClock())
    await held.send_messages(ServiceBusMessage("{}", message_id=at_once))
    assert inner.sent == [at_once] and held.held == 0


async def test_at_stop_held_replies_get_the_grace_then_are_dropped() -> None:
    delay = ReplyDelay(max_ms=10_000, min_ms=5000, share=1.0, seed=1)
    inner = Recording()
    held = HeldReplies(inner, delay, ManualClock())  # time never moves: the reply cannot go out
    await held.send_messages(ServiceBusMessage("{}", message_id=ids(1)[0]))
    await asyncio.wait_for(held.flush(0.05), 5)
    assert inner.sent == []


async def test_with_the_switch_the_request_is_completed_first_and_the_reply_follows(bus: FakeBus) -> None:
    """The worker wires the switch: the request is settled at once, the held reply goes out after it, and a stop
    waits (within the grace) for the replies still held."""
    config = agent_config()
    faults = AgentFaults(ReplyDelay(max_ms=300, min_ms=200, share=1.0, seed=config.jitter_seed))
    request = make_request("o-1", deadline=far())
    await bus.send(REQUESTS, request_message(request))
    client = with_faults(bus, config.replies_queue, faults, FakeClock(), config.shutdown_grace_ms / 1000)
    worker = AgentWorker(client, Instant(), config)
    await _run_until(worker, bus, lambda: bool(bus.queue(REQUESTS).completed))
    assert _settled_order(bus, request.message_id()) == ["complete", "send"]  # sent during the stop's grace
    assert [AgentReply.model_validate_json(m.raw).instance_id for m in bus.queue(REPLIES).active] == ["o-1:1"]
    assert client.replies is not None and client.replies.held == 1


# --- the clock skewed -------------------------------------------------------------------------------------------


async def test_a_skewed_clock_moves_now_but_not_waiting() -> None:
    inner = FakeClock()
    ahead, behind = SkewedClock(inner, 5.0), SkewedClock(inner, -5.0)
    assert ahead.now() - inner.now() == timedelta(seconds=5) and inner.now() - behind.now() == timedelta(seconds=5)
    await ahead.sleep(2.0)
    assert inner.sleeps == [2.0]
    assert ahead.now() - inner.now() == timedelta(seconds=5)


async def test_an_agent_clock_ahead_sees_the_deadline_passed_and_does_not_call(bus: FakeBus) -> None:
    """Deadline 3 s away on the wall clock; the Agent's clock is 10 s ahead: deadline exceeded, remote not called,
    and the reply's completedAt is the Agent's (skewed) time."""
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=datetime.now(UTC) + timedelta(seconds=3))))
    reply = await _serve_one(bus, clock_skew_seconds=10.0)
    assert reply.error_code == ErrorCode.DEADLINE_EXCEEDED and "remote not called" in (reply.error or "")
    assert reply.completed_at > datetime.now(UTC) + timedelta(seconds=8)


async def test_an_agent_clock_behind_calls_past_the_deadline(bus: FakeBus) -> None:
    """Deadline 1 s ago on the wall clock; the Agent's clock is 1.5 s behind: it still calls (and retries: the remote
    at port 9 refuses every connection) until its own clock reaches the deadline."""
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=datetime.now(UTC) - timedelta(seconds=1))))
    reply = await _serve_one(bus, clock_skew_seconds=-1.5)
    assert reply.error_code in (ErrorCode.RETRIES_EXHAUSTED, ErrorCode.DEADLINE_EXCEEDED)
    assert "remote not called" not in (reply.error or "")


async def _session_lock_seen(tmp_path: Path, skew: float) -> bool:
    """Whether the Agent's bus client (as `python -m lab agent` builds it with this skew) can use a session it was
    just granted: a 5 s session lock, judged on the client's clock."""
    connection = f"Endpoint=embedded://{tmp_path / 'bus.db'}"
    setup = EmbeddedBroker(tmp_path / "bus.db")
    setup.declare_queue(REQUESTS, requires_session=True, lock_duration=timedelta(seconds=5))
    setup.close()
    faults = AgentFaults(clock_skew_seconds=skew)
    async with agent_bus(connection, {}, faults, agent_clock(faults, SystemClock())) as client:
        async with client.get_queue_sender(REQUESTS) as sender:
            await sender.send_messages(ServiceBusMessage("r", session_id="o-1"))
        async with client.get_queue_receiver(REQUESTS, session_id="o-1") as receiver:
            try:
                [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            except SessionLockLostError:
                return False
            await receiver.complete_message(message)
            return True


@pytest.mark.parametrize(("skew", "usable"), [(0.0, True), (4.0, True), (-5.0, True), (5.0, False), (6.0, False)])
async def test_the_skew_moves_the_bus_clients_clock_too(tmp_path: Path, skew: float, usable: bool) -> None:
    # The SDK judges a session lock on the machine's clock (_servicebus_session.py BaseSession._lock_expired:
    # locked_until_utc <= utc_now(); _base_handler.py _check_live raises SessionLockLostError before it calls the
    # service): a client ahead by the LockDuration sees the lock it was just granted as expired.
    assert await _session_lock_seen(tmp_path, skew) is usable


def test_the_clock_skew_drill_leaves_the_agent_ahead_a_second_of_each_lock() -> None:
    # agent-requests' LockDuration is 5 s (servicebus.config.json): ahead by 4 s, an Agent can still use its sessions.
    options = TimingOptions("clock-skew")
    assert options.skew_s == 4.0 and options.settings_values()["AGENT_CLOCK_SKEW_SECONDS"] == "4.0"
    assert TimingOptions("clock-skew", overrides=(("AGENT_CLOCK_SKEW_SECONDS", "-5"),)).skew_s == 5.0


def test_a_skewed_clock_is_refused_for_a_bus_client_that_cannot_take_it() -> None:
    faults = AgentFaults(clock_skew_seconds=5.0)
    emulator = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
    with pytest.raises(ValueError, match="only the embedded client"):
        agent_bus(emulator, {}, faults, SystemClock())
    with pytest.raises(ValueError, match="only the embedded client"):
        agent_bus(
            None, {"ServiceBusConnection__fullyQualifiedNamespace": "x.servicebus.windows.net"}, faults, SystemClock()
        )


# --- helpers ----------------------------------------------------------------------------------------------------


async def _serve_one(bus: FakeBus, clock_skew_seconds: float) -> AgentReply:
    """The real Agent's `serve` with the lab's skewed clock, as `python -m lab agent` starts it."""
    stop = asyncio.Event()
    config = agent_config(remote_url="http://127.0.0.1:9")
    clock = agent_clock(AgentFaults(clock_skew_seconds=clock_skew_seconds), SystemClock())
    task = asyncio.create_task(serve(bus, config, stop, clock=clock, env=NO_BREAKER))
    try:
        await bus.wait_for(lambda: bool(bus.queue(REPLIES).active), 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    return AgentReply.model_validate_json(bus.queue(REPLIES).active[0].raw)


async def _run_until(worker: AgentWorker, bus: FakeBus, done: Any) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await bus.wait_for(done, 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def _settled_order(bus: FakeBus, request_id: str) -> list[str]:
    """`send` (the reply) and `complete` (the request) in the order they happened."""
    wanted = {f"send:{REPLIES}:{request_id}:reply": "send", f"complete:{REQUESTS}:{request_id}": "complete"}
    return [wanted[e] for e in bus.events if e in wanted]
