"""Contract of the OrdersDb and StateStore ports, run on every adapter (fixture `backend`: sqlite, cosmos).

Cosmos semantics are the reference: create 409, If-Match 412 (https://learn.microsoft.com/rest/api/cosmos-db/
common-cosmos-db-rest-response-headers ; .../optimistic-concurrency), missing point read 404
(https://learn.microsoft.com/rest/api/cosmos-db/get-a-document), continuation-token paging
(https://learn.microsoft.com/azure/cosmos-db/nosql/query/pagination).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from azure.cosmos.exceptions import CosmosResourceNotFoundError
from support.cosmos_server import SeenRequest

from orderflow.adapters import Stores
from orderflow.azure.cosmos import CosmosStateStore
from orderflow.errors import Conflict, NotFound, PreconditionFailed, TransientStoreError
from orderflow.messages import StepName, SubmitOrder
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState, StepStatus, instance_id
from orderflow.state_machine import (
    Fenced,
    IllegalTransition,
    claim,
    exponential_backoff,
    record_step,
    recover,
)

if TYPE_CHECKING:
    from support.store_backends import Backend, CosmosUnderTest

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=60)
US = timedelta(microseconds=1)


def make_order(order_id: str, sku: str = "SKU-1", quantity: int = 1) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c1", "name": "Ada"},
            "items": [{"sku": sku, "quantity": quantity, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T12:00:00+00:00",
        }
    )


def new_state(order_id: str, created: datetime = T0, **changes: object) -> OrderStateRecord:
    return OrderStateRecord.new(make_order(order_id), created).model_copy(update=changes)


def processing(order_id: str, complete_by: datetime) -> OrderStateRecord:
    return new_state(
        order_id,
        process_state=ProcessState.PROCESSING,
        locked_by=instance_id(order_id, 1),
        attempt=1,
        complete_by=complete_by,
    )


async def seed(stores: Stores, *records: OrderStateRecord) -> None:
    for rec in records:
        _, created = await stores.state.create_if_absent(rec)
        assert created


def claimer(order_id: str, now: datetime) -> Callable[[OrderStateRecord], OrderStateRecord]:
    return lambda rec: claim(rec, instance_id(order_id, rec.attempt + 1), now + LEASE, now)


# --- orders DB ------------------------------------------------------------------------------------


async def test_orders_create_is_idempotent(stores: Stores) -> None:
    record = OrderRecord.from_order(make_order("o-1"), T0)
    assert await stores.orders.create_if_absent(record) == (record, True)
    assert await stores.orders.create_if_absent(record) == (record, False)
    assert await stores.orders.get("o-1") == record


async def test_orders_create_conflict_returns_the_stored_order(stores: Stores) -> None:
    first = OrderRecord.from_order(make_order("o-1", quantity=1), T0)
    other = OrderRecord.from_order(make_order("o-1", quantity=2), T0 + LEASE)
    await stores.orders.create_if_absent(first)
    stored, created = await stores.orders.create_if_absent(other)
    assert not created
    assert stored == first and stored.order_hash != other.order_hash
    assert stored.submit_order() == make_order("o-1", quantity=1)


async def test_get_missing_returns_none(stores: Stores) -> None:
    # Cosmos DB answers a point read of a missing item 404 (https://learn.microsoft.com/rest/api/cosmos-db/
    # get-a-document#status-codes); the ports return None. On the cosmos backend this holds only because the test
    # server answers 404 too (tests/support/cosmosdb_server.js); the adapter maps nothing else to None.
    assert await stores.orders.get("nope") is None
    assert await stores.state.get("nope") is None
    assert await stores.state.get_checkpoint("nope") is None


# --- state store: create / replace ----------------------------------------------------------------


async def test_state_create_is_idempotent_and_keeps_the_first(stores: Stores) -> None:
    rec = new_state("o-1")
    stored, created = await stores.state.create_if_absent(rec)
    assert (stored, created) == (rec, True)
    again, created_again = await stores.state.create_if_absent(rec.model_copy(update={"reply_to": "other"}))
    assert (again, created_again) == (rec, False)
    got = await stores.state.get("o-1")
    assert got is not None and got[0] == rec and got[1]


async def test_replace_changes_etag_and_refuses_a_stale_one(stores: Stores) -> None:
    await seed(stores, new_state("o-1"))
    got = await stores.state.get("o-1")
    assert got is not None
    rec, etag = got
    claimed = claimer("o-1", T0)(rec)
    new_etag = await stores.state.replace(claimed, etag)
    assert new_etag != etag
    with pytest.raises(PreconditionFailed):
        await stores.state.replace(claimed.model_copy(update={"last_error": "late"}), etag)
    assert await stores.state.get("o-1") == (claimed, new_etag)


async def test_replace_missing_record_is_not_found(stores: Stores) -> None:
    with pytest.raises(NotFound):
        await stores.state.replace(new_state("ghost"), '"00000000-0000-0000-0000-000000000000"')


async def test_update_with_retry_missing_record_is_not_found(stores: Stores) -> None:
    with pytest.raises(NotFound):
        await stores.state.update_with_retry("ghost", lambda rec: rec)


# --- concurrency and fencing ----------------------------------------------------------------------


async def test_two_concurrent_claimers_exactly_one_wins(stores: Stores, peer: Stores) -> None:
    ids = [f"o-{i}" for i in range(5)]
    await seed(stores, *(new_state(i) for i in ids))
    for order_id in ids:
        results = await asyncio.gather(
            stores.state.update_with_retry(order_id, claimer(order_id, T0)),
            peer.state.update_with_retry(order_id, claimer(order_id, T0)),
            return_exceptions=True,
        )
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1, results
        assert all(isinstance(e, IllegalTransition) for e in losers), losers  # re-read: already locked
        stored = await stores.state.get(order_id)
        assert stored is not None and stored[0].locked_by == instance_id(order_id, 1)
        assert stored[0].attempt == 1


async def test_conditional_replace_race_has_one_winner(stores: Stores, peer: Stores) -> None:
    await seed(stores, new_state("o-1"))
    got = await stores.state.get("o-1")
    assert got is not None
    rec, etag = got
    claimed = claimer("o-1", T0)(rec)
    results = await asyncio.gather(
        stores.state.replace(claimed, etag), peer.state.replace(claimed, etag), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["PreconditionFailed", "str"]


async def test_fenced_update_is_refused_and_writes_nothing(stores: Stores) -> None:
    await seed(stores, new_state("o-1"))
    _, etag = await stores.state.update_with_retry("o-1", claimer("o-1", T0))
    stale = instance_id("o-1", 7)
    with pytest.raises(Fenced):
        await stores.state.update_with_retry(
            "o-1", lambda r: record_step(r, stale, StepName.RESERVE_INVENTORY, StepStatus.RUNNING, T0)
        )
    got = await stores.state.get("o-1")
    assert got is not None and got[1] == etag


async def test_update_with_retry_rereads_after_a_lost_race(
    stores: Stores, peer: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(stores, new_state("o-1"))
    real_get = stores.state.get
    calls = 0

    async def racing_get(order_id: str) -> tuple[OrderStateRecord, str] | None:
        nonlocal calls
        calls += 1
        found = await real_get(order_id)
        if calls == 1:  # someone else writes between our read and our If-Match replace
            await peer.state.update_with_retry(order_id, lambda r: r.model_copy(update={"last_error": "peer"}))
        return found

    monkeypatch.setattr(stores.state, "get", racing_get)
    rec, _ = await stores.state.update_with_retry("o-1", claimer("o-1", T0))
    assert calls == 2
    assert rec.locked_by == instance_id("o-1", 1) and rec.last_error == "peer"


async def test_update_with_retry_gives_up_after_its_attempts(
    stores: Stores, peer: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(stores, new_state("o-1"))
    real_get = stores.state.get
    calls = 0

    async def always_raced(order_id: str) -> tuple[OrderStateRecord, str] | None:
        nonlocal calls
        calls += 1
        found = await real_get(order_id)
        await peer.state.update_with_retry(order_id, lambda r: r.model_copy(update={"last_error": f"w{calls}"}))
        return found

    monkeypatch.setattr(stores.state, "get", always_raced)
    with pytest.raises(PreconditionFailed):
        await stores.state.update_with_retry("o-1", claimer("o-1", T0), attempts=3)
    assert calls == 3


# --- queries --------------------------------------------------------------------------------------


async def test_query_claimable_honours_state_lock_retry_at_and_limit(stores: Stores) -> None:
    await seed(
        stores,
        new_state("fresh-late", created=T0 + 2 * US),
        new_state("fresh-early", created=T0),
        new_state("retry-due", created=T0 - LEASE, retry_at=T0 - US),
        new_state("retry-now", created=T0 - LEASE, retry_at=T0),
        new_state("retry-later", created=T0 - LEASE, retry_at=T0 + US),
        new_state("locked", locked_by="locked:1"),
        processing("busy", T0 + LEASE),
        new_state("done", process_state=ProcessState.PROCESSED),
    )
    ids = [r.order_id for r, _ in await stores.state.query_claimable(T0, 10)]
    assert ids == ["fresh-early", "fresh-late", "retry-due", "retry-now"]
    assert [r.order_id for r, _ in await stores.state.query_claimable(T0, 1)] == ["fresh-early"]
    later = [r.order_id for r, _ in await stores.state.query_claimable(T0 + US, 10)]
    assert later == ["fresh-early", "fresh-late", "retry-due", "retry-now", "retry-later"]
    rec, etag = (await stores.state.query_claimable(T0, 1))[0]
    assert await stores.state.get(rec.order_id) == (rec, etag)


async def test_query_unnotified_finds_terminal_records_still_owed_a_notification(stores: Stores) -> None:
    old, recent = T0 - LEASE, T0
    await seed(
        stores,
        new_state("owed-processed", process_state=ProcessState.PROCESSED, updated_at=old),
        new_state("owed-error", process_state=ProcessState.ERROR, last_error="x", updated_at=old),
        new_state("sent", process_state=ProcessState.PROCESSED, updated_at=old, notified_at=old),
        new_state("too-recent", process_state=ProcessState.ERROR, last_error="x", updated_at=recent),
        processing("running", T0 + LEASE).model_copy(update={"updated_at": old}),
        new_state("pending", updated_at=old),
    )
    found = {r.order_id for r, _ in await stores.state.query_unnotified(T0 - US, 10)}
    assert found == {"owed-processed", "owed-error"}
    assert len(await stores.state.query_unnotified(T0 - US, 1)) == 1
    assert {r.order_id for r, _ in await stores.state.query_unnotified(T0 + US, 10)} == {
        "owed-processed",
        "owed-error",
        "too-recent",
    }


async def test_query_expired_window_bounds(stores: Stores) -> None:
    start, end = T0, T0 + LEASE
    await seed(
        stores,
        processing("before", start - US),
        processing("at-start", start),
        processing("mid", start + LEASE / 2),
        processing("last", end - US),
        processing("at-end", end),
        new_state("pending-in-window", complete_by=start + US),
    )
    page = await stores.state.query_expired(start, end, page_size=100)
    assert [r.order_id for r, _ in page.items] == ["at-start", "mid", "last"]
    assert page.continuation is None


async def _scan(
    stores: Stores,
    start: datetime,
    end: datetime,
    page_size: int,
    on_page: Callable[[list[tuple[OrderStateRecord, str]]], object] | None = None,
) -> tuple[list[str], list[float], int]:
    seen: list[str] = []
    charges: list[float] = []
    pages, token = 0, None
    while True:
        page = await stores.state.query_expired(start, end, page_size, token)
        pages += 1
        assert len(page.items) <= page_size
        seen += [r.order_id for r, _ in page.items]
        charges.append(page.request_charge)
        if on_page is not None:
            await on_page(page.items)  # type: ignore[misc]
        token = page.continuation
        if token is None:
            return seen, charges, pages
        assert pages < 100, "paging does not terminate"


async def test_query_expired_paging_covers_every_record_exactly_once(stores: Stores, backend: Backend) -> None:
    # Inserted out of order, with ties on CompleteBy (i and i+11 share one) that straddle page boundaries.
    records = [processing(f"o-{i:02d}", T0 + timedelta(seconds=(i * 7) % 11)) for i in range(23)]
    await seed(stores, *records)
    by_id = {r.order_id: r for r in records}
    seen, charges, pages = await _scan(stores, T0, T0 + timedelta(hours=1), page_size=5)
    assert sorted(seen) == sorted(by_id) and len(seen) == len(set(seen))
    deadlines = [by_id[i].complete_by for i in seen]
    assert deadlines == sorted(deadlines)  # type: ignore[type-var]
    assert pages >= 5
    assert all(c > 0 for c in charges) if backend.charges_request_units else all(c == 0 for c in charges)


async def test_paging_while_recovering_skips_nothing(stores: Stores) -> None:
    """The Supervisor recovers each page's records (they leave the result set) and keeps paging."""
    records = [processing(f"o-{i:02d}", T0 + timedelta(seconds=i)) for i in range(12)]
    await seed(stores, *records)
    backoff = exponential_backoff(2, 300)
    now = T0 + timedelta(minutes=5)

    async def recover_all(items: list[tuple[OrderStateRecord, str]]) -> None:
        for rec, etag in items:
            await stores.state.replace(recover(rec, rec.locked_by or "", now, 3, backoff), etag)

    seen, _, _ = await _scan(stores, T0, now, page_size=5, on_page=recover_all)
    assert seen == [r.order_id for r in records]
    assert [r.order_id for r, _ in await stores.state.query_claimable(now + timedelta(seconds=2), 100)] == seen


# --- checkpoints ----------------------------------------------------------------------------------


async def test_checkpoint_put_is_conditional(stores: Stores) -> None:
    assert await stores.state.get_checkpoint("supervisor") is None
    first = await stores.state.put_checkpoint("supervisor", {"windowStart": "a"}, None)
    with pytest.raises(Conflict):
        await stores.state.put_checkpoint("supervisor", {"windowStart": "b"}, None)
    second = await stores.state.put_checkpoint("supervisor", {"windowStart": "c"}, first)
    assert second != first
    with pytest.raises(PreconditionFailed):
        await stores.state.put_checkpoint("supervisor", {"windowStart": "d"}, first)
    assert await stores.state.get_checkpoint("supervisor") == ({"windowStart": "c"}, second)


# --- Cosmos point reads: 404 is missing, every other status is an error (cosmos only) ---------------


@pytest.mark.cosmos
async def test_cosmos_point_read_of_a_missing_item_is_404(cosmos_state: CosmosStateStore) -> None:
    """Conformance of the test server (through tests/support/cosmosdb_server.js) with Cosmos DB.

    Cosmos DB: GET .../docs/{id} of an item that is not in the given partition → 404 Not Found
    (https://learn.microsoft.com/rest/api/cosmos-db/get-a-document#status-codes), which azure-cosmos raises as
    CosmosResourceNotFoundError; substatus 0 (not 1002 ReadSessionNotAvailable, which the SDK would retry).
    @vercel/cosmosdb-server 1.0.1 alone answers both reads below with 500.
    """
    container = cosmos_state._container  # the raw SDK container
    await container.create_item({"id": "present", "orderId": "present"})
    for item_id, partition in [("missing", "missing"), ("present", "another-partition")]:
        with pytest.raises(CosmosResourceNotFoundError) as info:
            await container.read_item(item_id, partition_key=partition)
        assert info.value.status_code == 404
        assert info.value.sub_status in (None, 0)


@pytest.mark.cosmos
async def test_cosmos_server_error_on_a_point_read_propagates(cosmos: CosmosUnderTest) -> None:
    """A 500 is an error, not "missing": the adapter neither returns None nor asks again by another path."""
    await seed(cosmos.stores, new_state("o-1"))
    path = cosmos.state_doc_path("o-1")
    cosmos.server.clear_requests()
    with cosmos.server.fault("GET", path, 500):
        with pytest.raises(TransientStoreError) as info:
            await cosmos.stores.state.get("o-1")
    assert info.value.status_code == 500
    seen = cosmos.server.requests()
    assert SeenRequest("GET", path, query=False) in seen
    assert not [r for r in seen if r.query or r.path != path], seen  # no query by id, no other request
    assert (await cosmos.stores.state.get("o-1")) is not None  # the record was there all along


@pytest.mark.cosmos
async def test_cosmos_sdk_retries_a_single_500_on_a_point_read(cosmos: CosmosUnderTest) -> None:
    """The SDK's retry policy owns a 500, so the adapter has no retry of its own.

    azure-cosmos retries a read that fails with 408 or 5xx once more even on a single-region account
    (azure/cosmos/aio/_retry_utility_async.py → _timeout_failover_retry_policy.py: "If an account only has 1
    region, then we still want to retry once on the same region").
    """
    await seed(cosmos.stores, new_state("o-1"))
    path = cosmos.state_doc_path("o-1")
    cosmos.server.clear_requests()
    with cosmos.server.fault("GET", path, 500, times=1):
        got = await cosmos.stores.state.get("o-1")
    assert got is not None and got[0] == new_state("o-1")
    seen = cosmos.server.requests()
    assert seen == [SeenRequest("GET", path, query=False)] * 2  # the faulted read and the SDK's retry
