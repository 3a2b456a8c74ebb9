"""The shared circuit breaker in the Agent's request path: the real `SharedBreaker` over the embedded store.

Each remote call is asked for (`acquire`); a probe call, and a request whose calls all failed, is reported (`record`);
a request the breaker refuses before any call is answered `CircuitOpen` with `retryAfterSeconds` ("not now"); a
refusal after calls is an ordinary transient failure. Failures of several Agents add up in the one document;
transitions raise `CircuitOpened` / `CircuitClosed` alerts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.agent_fakes import (
    ALERTS,
    REPLIES,
    REQUESTS,
    FakeBus,
    FakeClock,
    agent_config,
    make_request,
    request_message,
    to_fake,
)

from agent.errors import Classification, ErrorCode
from agent.handler import Outbox, RequestHandler, circuit_alert, circuit_alerter
from agent.remote import CallResult
from agent.worker import AgentWorker, breaker_factory, open_breaker_store, serve
from orderflow.adapters import open_breaker_documents
from orderflow.breaker import (
    CIRCUIT_OPEN,
    BreakerDoc,
    BreakerState,
    Permit,
    SharedBreaker,
    Transition,
    shared_breaker,
)
from orderflow.clock import SystemClock
from orderflow.embedded.store import SqliteDocuments, open_sqlite_documents
from orderflow.messages import AgentReply, AlertKind, OperatorAlert

# threshold 3 in 30 s, cool-down 15 s (doubled per failed probe), 2 probes
ENV = {
    "CircuitBreakerFailureThreshold": "3",
    "CircuitBreakerWindowSeconds": "30",
    "CircuitBreakerCooldownSeconds": "15",
    "CircuitBreakerMaxCooldownSeconds": "300",
    "CircuitBreakerProbes": "2",
    "RemoteServiceName": "fulfilment",
}
OK = CallResult(Classification.SUCCESS, 200, {"confirmation": "c-1"})
DOWN = CallResult(Classification.TRANSIENT, 503, error="HTTP 503 unavailable")
REJECTED = CallResult(Classification.PERMANENT, 422, {"errorCode": "OutOfStock"}, error="HTTP 422 OutOfStock")


@dataclass
class Remote:
    """A `RemoteCaller` answering `result` (settable); with `gate`, each call waits for it first."""

    result: CallResult = OK
    gate: asyncio.Event | None = None
    calls: list[str] = field(default_factory=list)

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        self.calls.append(body["orderId"])
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), 5)
        return self.result

    async def wait_calls(self, count: int) -> None:
        async def reached() -> None:
            while len(self.calls) < count:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(reached(), 5)


class Settled:
    """A receiver that only records settlements (these tests read the replies from the bus)."""

    def __init__(self) -> None:
        self.completed: list[Any] = []

    async def complete_message(self, message: Any) -> None:
        self.completed.append(message)

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        raise AssertionError(f"unexpected dead-letter: {reason}")


class Unreachable:
    """A `DocumentStore` whose every operation fails, as Cosmos does during a network partition."""

    async def get(self, name: str) -> tuple[dict[str, Any], str] | None:
        raise ConnectionError("store unreachable")

    async def put(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        raise ConnectionError("store unreachable")

    async def aclose(self) -> None:
        return None


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The embedded store's file; each Agent opens its own connection to it (as separate processes do)."""
    return tmp_path / "s.db"


@pytest.fixture
async def opened() -> AsyncIterator[list[SqliteDocuments]]:
    docs: list[SqliteDocuments] = []
    yield docs
    for d in docs:
        await d.aclose()


def documents(path: Path, opened: list[SqliteDocuments]) -> SqliteDocuments:
    docs = open_sqlite_documents(path, "circuitBreakers")
    opened.append(docs)
    return docs


def an_agent(
    bus: FakeBus, clock: FakeClock, docs: Any, remote: Remote, **env: str
) -> tuple[RequestHandler, SharedBreaker]:
    """One Agent instance: its own breaker object over the shared document, alerting on the bus."""
    breaker = shared_breaker(docs, clock, {**ENV, **env}, circuit_alerter(bus.get_queue_sender(ALERTS), clock))
    outbox = Outbox(bus.get_queue_sender(REPLIES), bus.get_queue_sender(ALERTS), REPLIES, REQUESTS)
    return RequestHandler(remote, outbox, agent_config().retry_policy(), clock, breaker), breaker


async def ask(handler: RequestHandler, bus: FakeBus, clock: FakeClock, order_id: str, **overrides: Any) -> AgentReply:
    """Handle one request for `order_id` (deadline 30 s from now) and return the reply it sent."""
    request = make_request(order_id, deadline=clock.now() + timedelta(seconds=30), **overrides)
    receiver = Settled()
    await handler.handle(receiver, to_fake(request_message(request), 0))
    assert len(receiver.completed) == 1
    [raw] = [m.raw for m in bus.queue(REPLIES).active if m.session_id == order_id]
    return AgentReply.model_validate_json(raw)


def alerts(bus: FakeBus) -> list[OperatorAlert]:
    return [OperatorAlert.model_validate_json(m.raw) for m in bus.queue(ALERTS).active]


async def open_by_another_agent(docs: Any, clock: FakeClock) -> SharedBreaker:
    """Another Agent's breaker records `threshold` transient failures: the shared breaker opens."""
    other = shared_breaker(docs, clock, ENV)
    for _ in range(3):
        await other.record(Permit(), ok=False)
    assert (await other.view()).state is BreakerState.OPEN
    return other


async def stored(docs: Any) -> BreakerDoc:
    found = await docs.get("fulfilment")
    assert found is not None
    return BreakerDoc.model_validate(found[0])


async def test_an_open_breaker_is_answered_circuit_open_without_calling(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    await open_by_another_agent(documents(store, opened), clock)
    clock.advance(4)
    remote = Remote()
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    reply = await ask(handler, bus, clock, "o-1")
    assert remote.calls == []
    assert (reply.outcome, reply.permanent, reply.error_code) == ("failed", False, CIRCUIT_OPEN)
    assert ErrorCode.CIRCUIT_OPEN == CIRCUIT_OPEN == "CircuitOpen"
    assert reply.error == "the circuit of fulfilment is open; remote not called"
    assert reply.result == {"retryAfterSeconds": 11.0}  # the rest of the 15 s cool-down


async def test_failures_of_two_agents_add_up_and_open_the_breaker(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    """Threshold 2; each Agent's request makes 2 calls (maxRetries 1), both 503, and counts once: one failed request
    per Agent, neither alone reaches 2."""
    remote_a, remote_b = Remote(DOWN), Remote(DOWN)
    agent_a, _ = an_agent(bus, clock, documents(store, opened), remote_a, CircuitBreakerFailureThreshold="2")
    agent_b, _ = an_agent(bus, clock, documents(store, opened), remote_b, CircuitBreakerFailureThreshold="2")
    first = await ask(agent_a, bus, clock, "o-1", max_retries=1)
    assert first.error_code == ErrorCode.RETRIES_EXHAUSTED and len(remote_a.calls) == 2
    doc = await stored(documents(store, opened))
    assert doc.state is BreakerState.CLOSED and len(doc.failures) == 1
    clock.advance(2)
    second = await ask(agent_b, bus, clock, "o-2", max_retries=1)
    assert second.error_code == ErrorCode.RETRIES_EXHAUSTED and len(remote_b.calls) == 2
    assert (await stored(documents(store, opened))).state is BreakerState.OPEN
    assert [a.kind for a in alerts(bus)] == [AlertKind.CIRCUIT_OPENED]
    clock.advance(2)  # past Agent A's 1 s read cache
    third = await ask(agent_a, bus, clock, "o-3", max_retries=1)
    assert third.error_code == CIRCUIT_OPEN and remote_a.calls == ["o-1", "o-1"]


async def test_calls_whose_failures_the_retries_absorb_do_not_count(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    """A remote that fails some calls but answers every request (the retries absorb it) keeps the breaker closed."""

    @dataclass
    class FailsFirstCall(Remote):
        async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
            self.calls.append(body["orderId"])
            return DOWN if self.calls.count(body["orderId"]) == 1 else OK

    remote = FailsFirstCall()
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    for i in range(10):  # 10 failed calls, more than the threshold of 3
        assert (await ask(handler, bus, clock, f"o-{i}")).outcome == "succeeded"
    assert len(remote.calls) == 20
    assert await documents(store, opened).get("fulfilment") is None  # nothing counted


async def test_half_open_lets_exactly_the_probes_through_and_a_probe_success_closes(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    await open_by_another_agent(documents(store, opened), clock)
    clock.advance(16)  # cool-down over: half-open, 2 probes
    remote = Remote(OK, gate=asyncio.Event())
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    probes = [asyncio.create_task(ask(handler, bus, clock, f"p-{i}")) for i in range(2)]
    await remote.wait_calls(2)  # both probes are in flight
    refused = await ask(handler, bus, clock, "o-3")
    assert refused.error_code == CIRCUIT_OPEN and refused.result == {"retryAfterSeconds": 15.0}
    assert "half-open" in (refused.error or "")
    assert sorted(remote.calls) == ["p-0", "p-1"]
    remote.gate.set()  # type: ignore[union-attr]
    assert [r.outcome for r in await asyncio.gather(*probes)] == ["succeeded", "succeeded"]
    assert (await stored(documents(store, opened))).state is BreakerState.CLOSED
    closed = alerts(bus)[-1]
    assert closed.kind is AlertKind.CIRCUIT_CLOSED and closed.reason == "a probe succeeded"
    assert (await ask(handler, bus, clock, "o-4")).outcome == "succeeded"  # closed: calls go through again


async def test_a_probe_failure_reopens_with_a_longer_cooldown(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    await open_by_another_agent(documents(store, opened), clock)
    clock.advance(16)
    remote = Remote(DOWN)
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    probe = await ask(handler, bus, clock, "o-1")
    # the probe was made, then the breaker re-opened: an ordinary transient failure, not CircuitOpen
    assert remote.calls == ["o-1"]
    assert (probe.error_code, probe.permanent, probe.result) == (ErrorCode.RETRIES_EXHAUSTED, False, {})
    doc = await stored(documents(store, opened))
    assert doc.state is BreakerState.OPEN and doc.cooldown_seconds == 30.0 and doc.reason == "a probe failed"
    refused = await ask(handler, bus, clock, "o-2")
    assert refused.error_code == CIRCUIT_OPEN and 29.9 < refused.result["retryAfterSeconds"] <= 30.0
    assert remote.calls == ["o-1"]
    clock.advance(16)  # the first cool-down's length is not enough any more
    assert (await ask(handler, bus, clock, "o-3")).error_code == CIRCUIT_OPEN and remote.calls == ["o-1"]


async def test_a_breaker_opening_mid_retries_is_an_ordinary_transient_failure(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    """The first call fails; meanwhile other Agents open the breaker: the retry is refused, and the reply is an
    ordinary transient failure (a call was made), not CircuitOpen."""
    docs = documents(store, opened)

    @dataclass
    class OutageStartsDuringTheCall(Remote):
        async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
            self.calls.append(body["orderId"])
            await open_by_another_agent(docs, clock)
            clock.advance(2)  # past this Agent's 1 s read cache
            return DOWN

    remote = OutageStartsDuringTheCall()
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    reply = await ask(handler, bus, clock, "o-1")
    assert remote.calls == ["o-1"]
    assert (reply.outcome, reply.permanent, reply.error_code) == ("failed", False, ErrorCode.RETRIES_EXHAUSTED)
    assert reply.result == {}
    assert (
        reply.error == "1 attempt(s) failed transiently, then the circuit of fulfilment opened; last: HTTP 503 "
        "unavailable"
    )


async def test_a_permanent_failure_counts_as_a_healthy_remote(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    remote = Remote(REJECTED)
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    for i in range(5):
        assert (await ask(handler, bus, clock, f"o-{i}")).error_code == "OutOfStock"
    assert await documents(store, opened).get("fulfilment") is None  # nothing recorded: closed, no failures
    assert len(remote.calls) == 5


async def test_alerts_on_open_and_close_only(
    bus: FakeBus, clock: FakeClock, store: Path, opened: list[SqliteDocuments]
) -> None:
    """Open (alert) → half-open (none) → a probe fails, open again (none) → half-open (none) → closed (alert)."""
    remote = Remote(DOWN)
    handler, _ = an_agent(bus, clock, documents(store, opened), remote)
    for i in range(3):  # three requests whose retries all fail: the threshold
        await ask(handler, bus, clock, f"o-1{i}")
    [opened_alert] = alerts(bus)
    clock.advance(16)
    await ask(handler, bus, clock, "o-2")  # the probe fails
    assert alerts(bus) == [opened_alert]
    clock.advance(31)
    remote.result = OK
    assert (await ask(handler, bus, clock, "o-3")).outcome == "succeeded"
    first, second = alerts(bus)
    assert first == opened_alert and first.kind is AlertKind.CIRCUIT_OPENED and first.order_id is None
    assert first.reason == "3 failed requests within 30 s"
    assert first.details == {
        "service": "fulfilment",
        "before": "closed",
        "after": "open",
        "changedAt": first.details["changedAt"],
        "source": "agent",
    }
    assert first.details["changedAt"].endswith("Z")
    assert second.kind is AlertKind.CIRCUIT_CLOSED and second.reason == "a probe succeeded"
    assert (second.details["before"], second.details["after"]) == ("half-open", "closed")
    assert first.message_id() != second.message_id()


@pytest.mark.parametrize(
    ("before", "after", "kind"),
    [
        (BreakerState.CLOSED, BreakerState.OPEN, AlertKind.CIRCUIT_OPENED),
        (BreakerState.OPEN, BreakerState.HALF_OPEN, None),
        (BreakerState.HALF_OPEN, BreakerState.OPEN, None),  # a failed probe: the same outage goes on
        (BreakerState.HALF_OPEN, BreakerState.CLOSED, AlertKind.CIRCUIT_CLOSED),
        (BreakerState.OPEN, BreakerState.CLOSED, AlertKind.CIRCUIT_CLOSED),  # forced closed
    ],
)
def test_which_transitions_are_alerted(
    before: BreakerState, after: BreakerState, kind: AlertKind | None, clock: FakeClock
) -> None:
    alert = circuit_alert(Transition("fulfilment", before, after, "why", clock.now()), clock.now())
    assert (alert.kind if alert else None) == kind


async def test_calls_go_through_when_the_breaker_store_is_unreachable(bus: FakeBus, clock: FakeClock) -> None:
    remote = Remote(OK)
    handler, _ = an_agent(bus, clock, Unreachable(), remote)
    assert (await ask(handler, bus, clock, "o-1")).outcome == "succeeded"
    remote.result = DOWN
    failed = await ask(handler, bus, clock, "o-2")  # every retry is made: the breaker cannot count, nor refuse
    assert failed.error_code == ErrorCode.RETRIES_EXHAUSTED and remote.calls == ["o-1"] + ["o-2"] * 5


# --- wiring: the worker and serve() ----------------------------------------------------------------------


async def run_worker(worker: AgentWorker, bus: FakeBus, replies: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await bus.wait_for(lambda: len(bus.queue(REPLIES).active) >= replies, 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def far() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC) + timedelta(minutes=5)


def bus_replies(bus: FakeBus) -> dict[str, AgentReply]:
    return {m.session_id or "": AgentReply.model_validate_json(m.raw) for m in bus.queue(REPLIES).active}


async def test_the_worker_calls_through_the_breaker_and_alerts_on_its_alerts_queue(
    bus: FakeBus, store: Path, opened: list[SqliteDocuments]
) -> None:
    remote = Remote(DOWN)
    worker = AgentWorker(
        bus,
        remote,
        agent_config(max_concurrent_sessions=1),
        None,
        breaker_factory(documents(store, opened), SystemClock(), {**ENV, "CircuitBreakerFailureThreshold": "1"}),
    )
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far())))
    await bus.send(REQUESTS, request_message(make_request("o-2", deadline=far())))
    await run_worker(worker, bus, 2)
    got = bus_replies(bus)
    assert got["o-1"].error_code == ErrorCode.RETRIES_EXHAUSTED and got["o-2"].error_code == CIRCUIT_OPEN
    assert remote.calls == ["o-1"] * 5  # o-1's five failed calls are one failed request: threshold 1
    assert [a.kind for a in alerts(bus)] == [AlertKind.CIRCUIT_OPENED]


async def test_serve_opens_the_configured_breaker_and_closes_its_store(
    bus: FakeBus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve() builds the breaker from the app settings: forced open in the store, a request is not called."""
    env = {**ENV, "CosmosDb__accountEndpoint": f"embedded://{tmp_path / 's.db'}"}
    operator = open_sqlite_documents(tmp_path / "s.db", "circuitBreakers")
    await shared_breaker(operator, SystemClock(), ENV).force(BreakerState.OPEN, "test")
    await operator.aclose()
    closed: list[bool] = []

    def tracking(source: Any) -> Any:
        docs = open_breaker_documents(source)
        aclose = docs.aclose

        async def close() -> None:
            closed.append(True)
            await aclose()

        docs.aclose = close  # type: ignore[method-assign]
        return docs

    monkeypatch.setattr("agent.worker.open_breaker_documents", tracking)
    await bus.send(REQUESTS, request_message(make_request("o-1", deadline=far())))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, agent_config(remote_url="http://127.0.0.1:9"), stop, env=env))
    await bus.wait_for(lambda: bool(bus.queue(REPLIES).active), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    reply = bus_replies(bus)["o-1"]
    assert reply.error_code == CIRCUIT_OPEN and reply.result == {"retryAfterSeconds": 15.0}
    assert closed == [True]


def test_a_disabled_breaker_opens_no_store_and_an_enabled_one_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_store(source: Any) -> Any:
        raise AssertionError("the store must not be opened with the breaker off")

    monkeypatch.setattr("agent.worker.open_breaker_documents", no_store)
    assert open_breaker_store({"CircuitBreakerFailureThreshold": "0"}) is None
    monkeypatch.undo()
    with pytest.raises(ValueError, match="CosmosDb__accountEndpoint"):
        open_breaker_store({})
    with pytest.raises(ValueError, match="CircuitBreakerProbes"):
        open_breaker_store({"CircuitBreakerProbes": "0", "CosmosDb__accountEndpoint": "embedded://x"})
