"""Admission control's figures (orderflow/admission.py, issue 11) over the embedded store: the `admission` document in
the checkpoint container ({processing, pending, refreshedAt, reserved}), the strict Processing bound across instances
(slots reserved on the etag before a claim, given back when unused), and one process's view of the Pending backlog
(`BacklogGate`).

Time is a `FakeClock`; nothing sleeps. A second "instance" is a second Services on a second connection to one file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from support.integration_support import order_body, tunables

from orderflow import admission
from orderflow.admission import (
    DOCUMENT,
    RESERVATION_GRACE,
    BacklogGate,
    Figures,
    backlog_gate,
    refresh,
    release,
    reserve,
)
from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord, ProcessState, format_utc, instance_id
from orderflow.runtime import Services
from orderflow.state_machine import claim


def open_services(path: Path, clock: FakeClock, **overrides: int) -> Services:
    orders, state = open_sqlite_stores(path)
    return Services(orders=orders, state=state, bus=None, tunables=replace(tunables(), **overrides), clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def services(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Services]:
    s = open_services(tmp_path / "s.db", clock, max_in_processing=3)
    yield s
    await s.state.aclose()


async def add_record(services: Services, order_id: str, state: ProcessState, failure_count: int = 0) -> None:
    now = services.clock.now()
    rec = OrderStateRecord.new(SubmitOrder.model_validate(order_body(order_id)), now)
    if state is ProcessState.PROCESSING:
        rec = claim(rec, instance_id(order_id, 1), now + timedelta(seconds=30), now)
    elif state is not ProcessState.PENDING:
        rec = rec.model_copy(update={"process_state": state})
    rec = rec.model_copy(update={"failure_count": failure_count})
    _, created = await services.state.create_if_absent(rec)
    assert created


async def stored(services: Services) -> Figures:
    figures, _ = await admission.read_figures(services)
    return figures


async def put(services: Services, figures: Figures) -> None:
    found = await services.state.get_checkpoint(DOCUMENT)
    await services.state.put_checkpoint(DOCUMENT, figures.to_data(), None if found is None else found[1])


async def test_refresh_counts_processing_and_pending_exactly(services: Services, clock: FakeClock) -> None:
    for i in range(3):
        await add_record(services, f"pend-{i}", ProcessState.PENDING)
    for i in range(2):
        await add_record(services, f"proc-{i}", ProcessState.PROCESSING)
    await add_record(services, "done", ProcessState.PROCESSED)
    await add_record(services, "err", ProcessState.ERROR)
    await put(services, Figures(processing=50, pending=900, refreshed_at="2020-01-01T00:00:00.000000Z"))  # overcount

    figures = await refresh(services)

    assert figures == Figures(2, 3, format_utc(clock.now()), pending_by_app={"app": 3}, turn=1)
    assert await stored(services) == figures  # written, for every instance to read

    clock.advance(15)
    await add_record(services, "proc-2", ProcessState.PROCESSING)
    again = await refresh(services)
    assert again == Figures(3, 3, format_utc(clock.now()), pending_by_app={"app": 3}, turn=2)


async def test_refresh_of_an_empty_store_creates_the_document(services: Services, clock: FakeClock) -> None:
    assert await services.state.get_checkpoint(DOCUMENT) is None
    assert await refresh(services) == Figures(0, 0, format_utc(clock.now()), pending_by_app={"app": 0}, turn=1)
    assert await stored(services) == Figures(0, 0, format_utc(clock.now()), pending_by_app={"app": 0}, turn=1)


async def test_reserve_grants_up_to_the_bound_and_no_further(services: Services) -> None:
    await put(services, Figures(processing=0, pending=5, refreshed_at="2024-01-01T00:00:00.000000Z"))
    assert await reserve(services, 2) == 2
    assert await reserve(services, 5) == 1  # the bound is 3: only the room left
    assert await reserve(services) == 0
    figures = await stored(services)
    assert (figures.processing, figures.pending) == (3, 2)  # each slot leaves Pending
    await release(services, 2)  # two slots unused (another Starter won those records)
    assert (await stored(services)).processing == 1
    assert await reserve(services, 5) == 2


async def test_reserve_with_no_document_counts_from_zero(services: Services) -> None:
    assert await reserve(services) == 1
    assert (await stored(services)).processing == 1


async def test_reservations_from_two_instances_at_once_never_pass_the_bound(tmp_path: Path, clock: FakeClock) -> None:
    bound = 10
    a = open_services(tmp_path / "s.db", clock, max_in_processing=bound)
    b = open_services(tmp_path / "s.db", clock, max_in_processing=bound)  # another instance: its own connection
    try:
        await refresh(a)
        granted = 0
        for _ in range(3):  # rounds of a flood of claims on both instances at once
            results = await asyncio.gather(*(reserve(s) for _ in range(15) for s in (a, b)))
            granted += sum(results)
            # Never past the bound, and no lost update: every slot granted is in the figure, once.
            assert (await stored(a)).processing == granted <= bound
        assert granted == bound  # and the races left no room unused
        assert await reserve(b) == 0
    finally:
        await a.state.aclose()
        await b.state.aclose()


async def test_reservations_lose_no_update_under_contention(tmp_path: Path, clock: FakeClock) -> None:
    bound = 1000  # no bound in reach: every slot granted is counted once, none twice
    a = open_services(tmp_path / "s.db", clock, max_in_processing=bound)
    b = open_services(tmp_path / "s.db", clock, max_in_processing=bound)
    try:
        results = await asyncio.gather(*(reserve(s) for _ in range(12) for s in (a, b)))
        assert (await stored(a)).processing == sum(results) == 24
    finally:
        await a.state.aclose()
        await b.state.aclose()


async def test_refresh_keeps_counting_slots_reserved_within_the_grace(services: Services, clock: FakeClock) -> None:
    """A slot reserved just before the count may not have its claim landed yet: the refresh still counts it, so a
    refresh racing a claim never lets the figure fall below the work in flight."""
    assert await reserve(services, 2) == 2  # reserved; the claims have not landed (nothing is Processing)
    figures = await refresh(services)
    assert figures.processing == 2 and len(figures.reserved) == 2
    clock.advance(RESERVATION_GRACE + timedelta(seconds=1))  # by now a claim has landed or never will
    figures = await refresh(services)
    assert figures.processing == 0 and figures.reserved == ()


async def test_backlog_gate_counts_an_admission_at_once(services: Services, clock: FakeClock) -> None:
    first = "2024-01-01T00:00:00.000000Z"
    await put(services, Figures(processing=0, pending=5, refreshed_at=first))
    gate = BacklogGate("app")
    assert [await gate.admit(services) for _ in range(3)] == [True, True, True]
    assert gate.backlog() == 8  # the stored figure plus this process's admissions since

    await put(services, Figures(processing=0, pending=40, refreshed_at=first))  # another host's write, same refresh
    clock.advance(0.999)
    assert await gate.admit(services) and gate.backlog() == 9  # cached: no read within the second
    gate.release()  # that one was not stored after all (a duplicate)
    clock.advance(0.001)
    await gate.admit(services)
    assert gate.backlog() == 44  # read again; same refreshedAt: this process's 4 still count


async def test_backlog_gate_refuses_at_the_bound_even_for_concurrent_submissions(services: Services) -> None:
    bound = services.tunables.apps.max_pending
    await put(services, Figures(processing=0, pending=bound - 2, refreshed_at="2024-01-01T00:00:00.000000Z"))
    gate = BacklogGate("app")
    results = await asyncio.gather(*(gate.admit(services) for _ in range(10)))
    assert sorted(results) == [False] * 8 + [True] * 2
    assert gate.backlog() == bound


async def test_a_new_refresh_drops_the_admissions_it_counted(services: Services, clock: FakeClock) -> None:
    await put(services, Figures(processing=0, pending=5, refreshed_at=format_utc(clock.now())))
    gate = BacklogGate("app")
    await gate.admit(services)
    clock.advance(RESERVATION_GRACE + timedelta(seconds=2))
    await gate.admit(services)  # an admission just before the next refresh's count: the count may miss its record
    await put(services, Figures(processing=0, pending=10, refreshed_at=format_utc(clock.now())))
    clock.advance(1)
    await gate.admit(services)
    # the first admission is older than refreshedAt - grace: counted there; the later two are kept
    assert gate.backlog() == 12


async def test_backlog_gate_without_a_document_counts_its_own_admissions(services: Services) -> None:
    gate = BacklogGate("app")
    assert await gate.admit(services)
    assert gate.backlog() == 1


async def test_each_services_keeps_one_backlog_gate(tmp_path: Path, clock: FakeClock) -> None:
    a = open_services(tmp_path / "s.db", clock)
    b = open_services(tmp_path / "s.db", clock)
    try:
        assert backlog_gate(a, "app") is backlog_gate(a, "app")
        assert backlog_gate(a, "app") is not backlog_gate(b, "app")
    finally:
        await a.state.aclose()
        await b.state.aclose()


async def test_an_exit_frees_a_slot_unless_the_last_count_already_left_it_out(
    services: Services, clock: FakeClock
) -> None:
    await reserve(services, 2)
    figures = await refresh(services)  # counted at `refreshedAt`: 2 (the fresh reservations)
    assert figures.processing == 2
    await admission.exited(services, clock.now() - timedelta(seconds=1))  # left before the count: not in it
    await admission.flush(services)
    assert (await stored(services)).processing == 2
    clock.advance(1)
    await admission.exited(services, clock.now())  # left after the count: its slot is free
    await admission.flush(services)
    assert (await stored(services)).processing == 1
    await admission.exited(services, clock.now())
    await admission.exited(services, clock.now())  # never below zero
    await admission.flush(services)
    assert (await stored(services)).processing == 0


def count_writes(services: Services) -> list[int]:
    """One entry per write of the admission document."""
    writes: list[int] = []
    put_checkpoint = services.state.put_checkpoint

    async def counted(*args: object, **kwargs: object) -> str:
        writes.append(1)
        return await put_checkpoint(*args, **kwargs)  # type: ignore[arg-type]

    services.state.put_checkpoint = counted  # type: ignore[method-assign]
    return writes


async def test_concurrent_reservations_and_exits_share_writes_and_keep_the_bound(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Group commit (issue 13): the requests that queue while a write is in flight are written together by the next
    one, so 20 submissions reserving at once cost far fewer than 20 writes, and the bound still holds exactly."""
    services = open_services(tmp_path / "s.db", clock, max_in_processing=12)
    try:
        await refresh(services)
        clock.advance(1)
        writes = count_writes(services)
        granted = await asyncio.gather(*(reserve(services) for _ in range(20)))
        assert sum(granted) == 12 and (await stored(services)).processing == 12
        assert granted[:12] == [1] * 12  # in arrival order
        assert len(writes) <= 3
        writes.clear()
        await asyncio.gather(*(admission.exited(services, clock.now()) for _ in range(8)))
        assert writes == []  # the exits wait for a write to ride on
        assert await reserve(services) == 1  # which a reservation brings: 8 slots free, one taken
        assert (await stored(services)).processing == 5 and len(writes) == 1
    finally:
        await services.state.aclose()


async def test_an_exit_waits_at_most_exit_coalesce_for_a_write_to_ride_on(services: Services, clock: FakeClock) -> None:
    await reserve(services, 3)
    writes = count_writes(services)
    await admission.exited(services, clock.now())
    clock.advance(admission.EXIT_COALESCE.total_seconds() / 2)
    await admission.exited(services, clock.now())
    assert writes == [] and (await stored(services)).processing == 3  # an over-count meanwhile: the safe side
    clock.advance(admission.EXIT_COALESCE.total_seconds() / 2)
    await admission.exited(services, clock.now())  # the oldest has waited EXIT_COALESCE: all three are written
    assert len(writes) == 1 and (await stored(services)).processing == 0


async def test_a_reservation_at_the_bound_frees_the_waiting_exits_first(services: Services, clock: FakeClock) -> None:
    assert await reserve(services, 3) == 3  # the bound
    await admission.exited(services, clock.now())
    assert (await stored(services)).processing == 3
    assert await reserve(services) == 1


async def test_a_reserved_slot_takes_its_order_out_of_its_apps_pending_figure(services: Services) -> None:
    """Issue 25: each slot granted for an app's order leaves that app's Pending backlog (`pendingByApp`), so the
    app's bound is not held by orders already claimed until the next refresh; a slot of no known app changes none."""
    await put(services, Figures(0, 5, "2024-01-01T00:00:00.000000Z", pending_by_app={"app": 3, "partner": 2}))

    assert await reserve(services, 3, ["partner", "app", None]) == 3

    figures = await stored(services)
    assert (figures.pending, dict(figures.pending_by_app)) == (2, {"app": 2, "partner": 1})
