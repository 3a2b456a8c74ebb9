"""The Starter under the circuit breaker and the Processing bound (orderflow/starter.py, issue 11): the timer's
`run_starter` and the fast path's `start_one`, with a fake `start_new`, over the embedded store. The breaker document
is the one the Agents write (orderflow.breaker.SharedBreaker over the `circuitBreakers` documents of the same file).

- open: claims nothing (orders wait in Pending); half-open: at most the probes left; closed: as usual;
- a breaker store that cannot be read does not stop claiming (fails open);
- the fast path claims only while the breaker is closed;
- MaxOrdersInProcessing: a run claims only the room left; the fast path refuses past the bound; a claim that lands
  after the figure filled up is given back before start_new.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.integration_support import RecordingStartNew, order_body, tunables

from orderflow import admission
from orderflow.breaker import BreakerConfig, BreakerState, Permit, SharedBreaker
from orderflow.clock import FakeClock
from orderflow.embedded.store import SqliteDocuments, open_sqlite_documents, open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord, ProcessState, instance_id
from orderflow.runtime import Services, Tunables
from orderflow.starter import run_starter, start_one
from orderflow.state_machine import claim

SERVICE = "fulfilment"
COLLECTION = "circuitBreakers"
CONFIG = BreakerConfig.from_env({})  # the defaults: threshold 10, cool-down 15 s, 2 probes


@pytest.fixture(autouse=True)
def _default_breaker_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Starter's breaker reads its rules from the app settings (the environment): keep them the defaults here.
    for name in (
        "RemoteServiceName",
        "CircuitBreakerFailureThreshold",
        "CircuitBreakerWindowSeconds",
        "CircuitBreakerCooldownSeconds",
        "CircuitBreakerMaxCooldownSeconds",
        "CircuitBreakerProbes",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def services(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Services]:
    orders, state = open_sqlite_stores(tmp_path / "s.db")
    documents = open_sqlite_documents(tmp_path / "s.db", COLLECTION)
    s = Services(orders=orders, state=state, bus=None, tunables=tunables(), clock=clock, breakers=documents)
    yield s
    await state.aclose()
    await documents.aclose()


@pytest.fixture
async def breaker(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SharedBreaker]:
    """The breaker as an Agent holds it: its own connection to the same file."""
    documents = open_sqlite_documents(tmp_path / "s.db", COLLECTION)
    yield SharedBreaker(documents, SERVICE, CONFIG, clock)
    await documents.aclose()


async def add_pending(services: Services, *order_ids: str) -> None:
    for order_id in order_ids:
        rec = OrderStateRecord.new(SubmitOrder.model_validate(order_body(order_id)), services.clock.now())
        assert (await services.state.create_if_absent(rec))[1]


async def add_processing(services: Services, *order_ids: str) -> None:
    now = services.clock.now()
    for order_id in order_ids:
        rec = OrderStateRecord.new(SubmitOrder.model_validate(order_body(order_id)), now)
        rec = claim(rec, instance_id(order_id, 1), now + timedelta(seconds=30), now)
        assert (await services.state.create_if_absent(rec))[1]


async def record(services: Services, order_id: str) -> OrderStateRecord:
    found = await services.state.get(order_id)
    assert found is not None
    return found[0]


async def assert_waiting(services: Services, *order_ids: str) -> None:
    """Untouched by the Starter: Pending, unlocked, no attempt, nothing deferred."""
    for order_id in order_ids:
        rec = await record(services, order_id)
        assert (rec.process_state, rec.locked_by, rec.attempt, rec.deferrals) == (ProcessState.PENDING, None, 0, 0)


async def open_by_failures(breaker: SharedBreaker) -> None:
    for _ in range(CONFIG.failure_threshold):
        await breaker.record(Permit(), ok=False)
    assert (await breaker.view()).state is BreakerState.OPEN


ORDERS = [f"o-{i}" for i in range(5)]


async def test_an_open_breaker_stops_every_claim(services: Services, breaker: SharedBreaker) -> None:
    await add_pending(services, *ORDERS)
    await breaker.force(BreakerState.OPEN, "test")
    start = RecordingStartNew()

    run = await run_starter(services, start)
    fast = await start_one(services, start, ORDERS[0])

    assert run.claimed == [] and fast.claimed == [] and start.calls == []
    assert run.breaker_limit == 0 and fast.breaker_limit == 0
    await assert_waiting(services, *ORDERS)

    await breaker.force(BreakerState.CLOSED, "test")
    run = await run_starter(services, start)
    assert sorted(run.claimed) == [f"{o}:1" for o in ORDERS] and run.breaker_limit is None


async def test_an_open_breaker_opened_by_failures_stops_claims_until_its_cooldown(
    services: Services, breaker: SharedBreaker, clock: FakeClock
) -> None:
    await add_pending(services, *ORDERS)
    await open_by_failures(breaker)
    start = RecordingStartNew()

    clock.advance(CONFIG.cooldown - timedelta(seconds=1))
    assert (await run_starter(services, start)).claimed == []
    await assert_waiting(services, *ORDERS)

    clock.advance(timedelta(seconds=1))  # half-open now: the probes' worth of orders
    run = await run_starter(services, start)
    assert run.breaker_limit == CONFIG.probes and len(run.claimed) == CONFIG.probes == 2


async def test_half_open_claims_at_most_the_probes_left(
    services: Services, breaker: SharedBreaker, clock: FakeClock
) -> None:
    await add_pending(services, *ORDERS)
    await open_by_failures(breaker)
    clock.advance(CONFIG.cooldown)
    assert await breaker.acquire() == Permit(probe=True)  # an Agent took one of the two probes
    start = RecordingStartNew()

    fast = await start_one(services, start, ORDERS[0])  # half-open: only the timer claims, within the probes
    run = await run_starter(services, start)

    assert fast.claimed == [] and fast.breaker_limit == 1
    assert run.breaker_limit == 1 and len(run.claimed) == 1 and len(start.calls) == 1
    claimed_order = run.claimed[0].rsplit(":", 1)[0]
    await assert_waiting(services, *(o for o in ORDERS if o != claimed_order))

    assert await breaker.acquire() == Permit(probe=True)  # the last probe
    run = await run_starter(services, start)
    assert run.breaker_limit == 0 and run.claimed == []


async def test_a_closed_breaker_claims_as_usual(services: Services, breaker: SharedBreaker) -> None:
    await add_pending(services, *ORDERS)
    await breaker.record(Permit(), ok=False)  # one failure: a closed document exists, below the threshold
    assert (await breaker.view()).state is BreakerState.CLOSED
    start = RecordingStartNew()

    run = await run_starter(services, start)

    assert run.breaker_limit is None and sorted(run.claimed) == [f"{o}:1" for o in ORDERS]
    assert sorted(start.instances) == sorted(run.claimed)


async def test_no_breaker_document_claims_as_usual(services: Services) -> None:
    await add_pending(services, *ORDERS)
    run = await run_starter(services, RecordingStartNew())
    assert run.breaker_limit is None and len(run.claimed) == len(ORDERS)


class BrokenDocuments(SqliteDocuments):
    """A breaker store that cannot be reached."""

    def __init__(self) -> None:
        pass

    async def get(self, name: str) -> tuple[dict[str, Any], str] | None:
        raise ConnectionError("breaker store unreachable")

    async def put(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        raise ConnectionError("breaker store unreachable")

    async def aclose(self) -> None:
        pass


async def test_an_unreadable_breaker_claims_as_if_closed(services: Services) -> None:
    broken = replace(services, breakers=BrokenDocuments())
    await add_pending(broken, *ORDERS)
    start = RecordingStartNew()

    run = await run_starter(broken, start, limit=3)
    assert run.breaker_limit is None and len(run.claimed) == 3
    fast = await start_one(broken, start, ORDERS[4])
    assert fast.claimed == [f"{ORDERS[4]}:1"]


async def test_the_breaker_of_the_configured_remote_service_is_read(
    services: Services, tmp_path: Path, clock: FakeClock
) -> None:
    """Tunables.remote_service (RemoteServiceName) names the breaker document the Starter reads."""
    other = replace(services, tunables=replace(services.tunables, remote_service="payments"))
    documents = open_sqlite_documents(tmp_path / "s.db", COLLECTION)
    try:
        await SharedBreaker(documents, "payments", CONFIG, clock).force(BreakerState.OPEN, "test")
        await add_pending(other, *ORDERS)
        run = await run_starter(other, RecordingStartNew())
        assert run.breaker_limit == 0 and run.claimed == []
    finally:
        await documents.aclose()


# MaxOrdersInProcessing.


def bounded(services: Services, bound: int) -> Services:
    return replace(services, tunables=replace(services.tunables, max_in_processing=bound))


async def test_a_run_claims_only_the_room_left_under_the_bound(services: Services) -> None:
    busy = [f"busy-{i}" for i in range(3)]
    await add_processing(services, *busy)
    s = bounded(services, len(busy) + 2)
    await add_pending(s, *ORDERS)
    start = RecordingStartNew()

    run = await run_starter(s, start)

    assert len(run.claimed) == 2 and len(start.calls) == 2
    assert run.not_admitted == 0  # it asked for the room left only: no claim turned away, none given back
    assert (await admission.read_figures(s))[0].processing == len(busy) + 2
    claimed = {i.rsplit(":", 1)[0] for i in run.claimed}
    await assert_waiting(s, *(o for o in ORDERS if o not in claimed))
    assert sum([(await record(s, o)).process_state is ProcessState.PROCESSING for o in ORDERS]) == 2

    again = await run_starter(s, start)  # full: nothing more, not even tried
    assert again.claimed == [] and again.not_admitted == 0 and len(start.calls) == 2

    s.clock.advance(admission.RESERVATION_GRACE.total_seconds() + 1)  # type: ignore[attr-defined]  # next run
    done = await s.state.get(busy[0])  # one order leaves Processing: the next refresh sees the room
    assert done is not None
    await s.state.replace(
        done[0].model_copy(update={"process_state": ProcessState.PROCESSED, "locked_by": None}), done[1]
    )
    assert len((await run_starter(s, start)).claimed) == 1


async def test_the_fast_path_refuses_past_the_bound(services: Services) -> None:
    s = bounded(services, 2)
    await admission.refresh(s)  # the Starter's last run: nothing Processing
    await add_pending(s, *ORDERS[:3])
    start = RecordingStartNew()

    untouched = await s.state.get(ORDERS[2])
    first = await start_one(s, start, ORDERS[0])
    second = await start_one(s, start, ORDERS[1])
    third = await start_one(s, start, ORDERS[2])

    assert first.claimed == [f"{ORDERS[0]}:1"] and second.claimed == [f"{ORDERS[1]}:1"]
    assert third.claimed == [] and third.not_admitted == 1
    assert start.instances == [f"{ORDERS[0]}:1", f"{ORDERS[1]}:1"]
    await assert_waiting(s, ORDERS[2])  # left for the timer
    assert await s.state.get(ORDERS[2]) == untouched  # not even claimed and given back: the figure said full


class FillsTheFigureOnReserve:
    """A state store where another instance fills the admission figure just before this instance reserves: the race
    `admission.reserve` settles on the etag by granting nothing."""

    def __init__(self, inner: Any, bound: int, on_read: int) -> None:
        self._inner = inner
        self._bound = bound
        self._reads_left = on_read  # the admission read that `reserve` makes (the timer's refresh reads first)

    async def get_checkpoint(self, name: str) -> Any:
        found = await self._inner.get_checkpoint(name)
        if name == admission.DOCUMENT and found is not None:
            self._reads_left -= 1
        if name == admission.DOCUMENT and found is not None and self._reads_left == 0:
            await self._inner.put_checkpoint(name, {**found[0], "processing": self._bound}, found[1])
        return found  # the stale figure: the write after it loses on the etag, and the re-read sees it full

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("path", ["timer", "fast path"])
async def test_a_slot_taken_by_another_instance_meanwhile_means_no_claim(services: Services, path: str) -> None:
    s = bounded(services, 2)
    await admission.refresh(s)
    await add_pending(s, "o-late")
    untouched = await s.state.get("o-late")
    racing = replace(s, state=FillsTheFigureOnReserve(s.state, 2, on_read=2 if path == "timer" else 1))
    start = RecordingStartNew()

    run = await (run_starter(racing, start) if path == "timer" else start_one(racing, start, "o-late"))

    assert run.claimed == [] and run.not_admitted == 1 and start.calls == []
    assert await s.state.get("o-late") == untouched  # never claimed: the slot came first, and there was none
    assert (await admission.read_figures(s))[0].processing == 2  # not past the bound


async def test_slots_of_records_another_starter_won_are_given_back(services: Services) -> None:
    s = bounded(services, 5)
    await admission.refresh(s)
    await add_pending(s, *ORDERS[:2])
    found = await s.state.get(ORDERS[0])
    assert found is not None
    stale_etag = found[1]
    await s.state.replace(found[0], stale_etag)  # another Starter's write: our etag for ORDERS[0] is now stale
    start = RecordingStartNew()
    other = await s.state.get(ORDERS[1])
    assert other is not None
    batch = [(found[0], stale_etag), other]

    from orderflow.starter import StarterRun, _claim_within_the_bound

    run = StarterRun()
    await _claim_within_the_bound(s, start, batch, run)

    assert run.lost_race == 1 and run.claimed == [f"{ORDERS[1]}:1"]
    assert (await admission.read_figures(s))[0].processing == 1  # the lost record's slot was given back


async def test_the_starter_carries_the_retries_that_fit_the_budget(services: Services) -> None:
    fitted = Tunables.from_env({"RemoteCallBudgetPerStep": "30", "ClaimLeaseSeconds": "30"})
    s = replace(services, tunables=replace(services.tunables, agent_retries=fitted.agent_retries))
    await add_pending(s, "o-1")
    start = RecordingStartNew()

    await run_starter(s, start)

    [(_, _, inp)] = start.calls
    assert inp["agentRetries"] == 1  # (1 + 1) x 5 x 3 = 30: the request's maxRetries (orchestrators/order_workflow.py)
