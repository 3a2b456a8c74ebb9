"""Per-item TTL in both stores (issue 26): a finished order's two documents carry `ttl`, an unfinished one none.

Conformance source, Cosmos DB "Time to Live" (https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live): with the
container's DefaultTimeToLive set (-1 in infra/), an item with `ttl` N > 0 expires N seconds after its last write and
is no longer returned by reads or queries; no `ttl`, or -1, never expires; an expired item's id can be created again.
The embedded store reproduces it on its own clock (`SqliteFile.now`); the Cosmos protocol server has no TTL at all."""

from __future__ import annotations

import sqlite3

import pytest
from support.state_records import NOW, in_state
from support.store_backends import Backend

from orderflow.adapters import Stores
from orderflow.errors import NotFound
from orderflow.messages import SubmitOrder
from orderflow.records import TTL_NEVER, OrderRecord, ProcessState
from orderflow.state_machine import mark_notified

NO_TTL_ON_SERVER = (
    "@vercel/cosmosdb-server implements no time-to-live: an item past its ttl is still read. Cosmos DB stops "
    "returning it at _ts + ttl (learn.microsoft.com/azure/cosmos-db/nosql/time-to-live)"
)


def stored_order() -> OrderRecord:
    rec = in_state(ProcessState.PENDING)
    order = SubmitOrder.model_validate(
        {
            "orderId": rec.order_id,
            "replyTo": rec.reply_to,
            "customer": {"id": "c", "name": "n"},
            "items": [{"sku": "s", "quantity": 1, "unitPrice": "1.00"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T12:00:00Z",
        }
    )
    return OrderRecord.from_order(order, NOW)


async def finish(stores: Stores, ttl: int) -> None:
    """The order stored, then finished and notified with `ttl` (the notification's two writes)."""
    await stores.orders.create_if_absent(stored_order())
    await stores.state.create_if_absent(in_state(ProcessState.PENDING))
    current = await stores.state.get("o-1")
    assert current is not None
    await stores.orders.set_ttl("o-1", ttl)
    finished = in_state(ProcessState.PROCESSED)
    await stores.state.replace(mark_notified(finished, NOW, ttl), current[1])


async def test_a_finished_orders_documents_carry_their_ttl(stores: Stores) -> None:
    await stores.state.create_if_absent(in_state(ProcessState.PROCESSING))
    running = await stores.state.get("o-1")
    assert running is not None and running[0].ttl is None  # unfinished: no ttl property at all
    await finish_running(stores, running[1])
    done = await stores.state.get("o-1")
    assert done is not None and done[0].ttl == 3600
    order = await stores.orders.get("o-1")
    assert order is not None and (order.model_extra or {}).get("ttl") == 3600
    await stores.orders.set_ttl("o-1", TTL_NEVER)  # `orderflow keep`
    kept = await stores.orders.get("o-1")
    assert kept is not None and (kept.model_extra or {}).get("ttl") == TTL_NEVER
    # A notification's TTL write that lands after the keep (it read the record before) leaves it kept.
    await stores.orders.set_ttl("o-1", 3600)
    still = await stores.orders.get("o-1")
    assert still is not None and (still.model_extra or {}).get("ttl") == TTL_NEVER


async def finish_running(stores: Stores, etag: str) -> None:
    await stores.orders.create_if_absent(stored_order())
    await stores.orders.set_ttl("o-1", 3600)
    await stores.state.replace(mark_notified(in_state(ProcessState.PROCESSED), NOW, 3600), etag)


async def test_set_ttl_on_a_missing_order_is_not_found(stores: Stores) -> None:
    with pytest.raises(NotFound):
        await stores.orders.set_ttl("nobody", 60)


async def test_expired_documents_are_gone_and_unfinished_ones_stay(
    backend: Backend, stores: Stores, request: pytest.FixtureRequest
) -> None:
    if backend.name == "cosmos":
        request.applymarker(pytest.mark.xfail(reason=NO_TTL_ON_SERVER, run=False))
    db = stores.state._db  # type: ignore[attr-defined]  # the embedded file and its clock
    start = db.now()
    await finish(stores, 60)
    unfinished = in_state(ProcessState.PROCESSING).model_copy(update={"id": "o-2", "order_id": "o-2"})
    await stores.state.create_if_absent(unfinished)
    db.now = lambda: start + 59
    assert await stores.state.get("o-1") is not None and await stores.orders.get("o-1") is not None
    db.now = lambda: start + 61  # past _ts + ttl
    assert await stores.state.get("o-1") is None and await stores.orders.get("o-1") is None
    assert await stores.state.count_in_state(ProcessState.PROCESSED) == 0
    assert (await stores.state.query_in_state(ProcessState.PROCESSED, 10)).items == []
    assert await stores.state.get("o-2") is not None  # no ttl: never expires
    assert await stores.state.count_in_state(ProcessState.PROCESSING) == 1
    _, created = await stores.orders.create_if_absent(stored_order())  # the expired id is free again
    assert created
    with pytest.raises(NotFound):  # an expired record cannot be replaced: it is gone
        await stores.state.replace(in_state(ProcessState.PROCESSED), "any")
    # Deleted in the background as Cosmos DB does: here by a later write transaction (at most once a second).
    with sqlite3.connect(db.path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM order_state WHERE id = 'o-1'").fetchone() == (0,)


async def test_a_kept_order_never_expires(backend: Backend, stores: Stores, request: pytest.FixtureRequest) -> None:
    if backend.name == "cosmos":
        request.applymarker(pytest.mark.xfail(reason=NO_TTL_ON_SERVER, run=False))
    db = stores.state._db  # type: ignore[attr-defined]
    start = db.now()
    await finish(stores, TTL_NEVER)
    db.now = lambda: start + 10 * 365 * 86400
    assert await stores.state.get("o-1") is not None and await stores.orders.get("o-1") is not None
