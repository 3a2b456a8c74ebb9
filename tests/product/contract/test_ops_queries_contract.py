"""Contract of the StateStore queries behind the operator tools (issue 14: `orderflow orders`, `summary`, the HTTP
API), run on every adapter (fixture `backend`: the embedded SQLite store, azure-cosmos on the Cosmos protocol server).

- `query_in_state(state, page_size, continuation, updated_before)`: one state, optionally last written before a time,
  ordered by (updatedAt, id), keyset-paged: no page skips or repeats a record while others leave the state; a
  malformed continuation is a ValueError (the HTTP API answers 400 with its message).
- `oldest_in_state(state)`: the smallest (updatedAt, id) in the state, or None.
- `count_expired(now)`: supervised records (Processing, CompensationInProgress) with CompleteBy < now.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orderflow.adapters import Stores
from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.ports import ExpiredCursor, Page
from orderflow.records import OrderStateRecord, ProcessState, instance_id
from orderflow.state_machine import claim

if TYPE_CHECKING:
    from support.store_backends import Backend

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
US = timedelta(microseconds=1)
LEASE = timedelta(seconds=60)
PENDING, PROCESSING = ProcessState.PENDING, ProcessState.PROCESSING


def new_state(order_id: str, updated: datetime = T0, **changes: object) -> OrderStateRecord:
    order = SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c1", "name": "Ada"},
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T12:00:00+00:00",
        }
    )
    return OrderStateRecord.new(order, T0 - timedelta(days=1)).model_copy(update={"updated_at": updated, **changes})


def processing(order_id: str, complete_by: datetime, state: ProcessState = PROCESSING) -> OrderStateRecord:
    return new_state(
        order_id, process_state=state, locked_by=instance_id(order_id, 1), attempt=1, complete_by=complete_by
    )


async def seed(stores: Stores, *records: OrderStateRecord) -> None:
    for rec in records:
        _, created = await stores.state.create_if_absent(rec)
        assert created


def ids(page: Page) -> list[str]:
    return [rec.order_id for rec, _ in page.items]


async def list_all(
    stores: Stores,
    state: ProcessState,
    page_size: int,
    updated_before: datetime | None = None,
    between_pages: list[str] | None = None,
) -> tuple[list[str], int]:
    """Every page of the listing, with each item's etag checked against a point read; (ids in order, page count).
    `between_pages`: ids to move out of `state` (claimed: Pending → Processing) right after the first page."""
    seen: list[str] = []
    pages, token = 0, None
    while True:
        page = await stores.state.query_in_state(state, page_size, token, updated_before=updated_before)
        pages += 1
        assert len(page.items) <= page_size
        for rec, etag in page.items:
            assert rec.process_state is state
            assert await stores.state.get(rec.order_id) == (rec, etag)
        seen += ids(page)
        if pages == 1:
            for order_id in between_pages or []:
                await stores.state.update_with_retry(
                    order_id, lambda r: claim(r, instance_id(r.order_id, 1), T0 + LEASE, T0 + timedelta(hours=1))
                )
        token = page.continuation
        if token is None:
            return seen, pages
        assert pages < 100, "paging does not terminate"


# --- query_in_state ---------------------------------------------------------------------------------------------


async def test_query_in_state_filters_by_state_and_orders_by_updated_at_then_id(
    stores: Stores, backend: Backend
) -> None:
    await seed(
        stores,
        new_state("p-late", T0 + 2 * US),
        new_state("p-tie-b", T0),
        new_state("p-early", T0 - LEASE),
        new_state("p-tie-a", T0),
        processing("busy", T0 + LEASE).model_copy(update={"updated_at": T0 - 2 * LEASE}),
        new_state("done", T0 - 2 * LEASE, process_state=ProcessState.PROCESSED),
        new_state("failed", T0 - 2 * LEASE, process_state=ProcessState.ERROR, last_error="x"),
    )
    page = await stores.state.query_in_state(PENDING, 100)
    assert ids(page) == ["p-early", "p-tie-a", "p-tie-b", "p-late"]
    assert page.continuation is None
    assert page.request_charge > 0 if backend.charges_request_units else page.request_charge == 0
    assert ids(await stores.state.query_in_state(PROCESSING, 100)) == ["busy"]
    assert ids(await stores.state.query_in_state(ProcessState.ERROR, 100)) == ["failed"]
    empty = await stores.state.query_in_state(ProcessState.CANCELLED, 100)
    assert empty.items == [] and empty.continuation is None


async def test_query_in_state_updated_before_is_exclusive(stores: Stores) -> None:
    cut = T0
    await seed(
        stores,
        new_state("long-ago", cut - timedelta(days=2)),
        new_state("just-before", cut - US),
        new_state("at-cut", cut),
        new_state("after", cut + US),
        new_state("other-state-old", cut - timedelta(days=3), process_state=ProcessState.CANCELLED),
    )
    older = await stores.state.query_in_state(PENDING, 100, updated_before=cut)
    assert ids(older) == ["long-ago", "just-before"] and older.continuation is None
    assert ids(await stores.state.query_in_state(PENDING, 100, updated_before=cut + US)) == [
        "long-ago",
        "just-before",
        "at-cut",
    ]
    assert ids(await stores.state.query_in_state(PENDING, 100, updated_before=cut - timedelta(days=3))) == []
    # The filter holds on every page, not only the first.
    seen, pages = await list_all(stores, PENDING, 1, updated_before=cut + US)
    assert seen == ["long-ago", "just-before", "at-cut"] and pages == 3


async def test_query_in_state_pages_cover_every_record_exactly_once(stores: Stores) -> None:
    # Inserted out of order, with ties on updatedAt (i and i+11 share one) that straddle page boundaries.
    records = [new_state(f"o-{i:02d}", T0 + timedelta(seconds=(i * 7) % 11)) for i in range(23)]
    await seed(stores, *records, processing("busy", T0), new_state("done", T0, process_state=ProcessState.PROCESSED))
    seen, pages = await list_all(stores, PENDING, 5)
    expected = [r.order_id for r in sorted(records, key=lambda r: (r.updated_at, r.id))]
    assert seen == expected
    assert pages == 5


async def test_query_in_state_last_full_page_has_no_continuation(stores: Stores) -> None:
    await seed(stores, *(new_state(f"o-{i}", T0 + i * US) for i in range(6)))
    first = await stores.state.query_in_state(PENDING, 3)
    assert ids(first) == ["o-0", "o-1", "o-2"] and first.continuation is not None
    second = await stores.state.query_in_state(PENDING, 3, first.continuation)
    assert ids(second) == ["o-3", "o-4", "o-5"]
    assert second.continuation is None  # no empty page after an exactly full one


async def test_query_in_state_paging_while_records_leave_the_state_skips_nothing(stores: Stores) -> None:
    """After the first page, one record of that page and one not read yet are claimed (they leave Pending). The
    listing goes on from its position: every record still Pending is read once, in order, the one that left unread.
    (An offset-paged listing would skip a record here: the page-1 record that left shifts every later offset.)"""
    records = [new_state(f"o-{i:02d}", T0 + timedelta(seconds=i)) for i in range(12)]
    await seed(stores, *records)
    seen, _ = await list_all(stores, PENDING, 5, between_pages=["o-01", "o-08"])
    assert seen == [r.order_id for r in records if r.order_id != "o-08"]
    moved = await stores.state.query_in_state(PROCESSING, 100)
    assert ids(moved) == ["o-01", "o-08"]


@pytest.mark.parametrize(
    "token",
    [
        pytest.param("", id="empty"),
        pytest.param("not a token!", id="not-base64"),
        pytest.param(base64.urlsafe_b64encode(b"\xff\xfe").decode(), id="not-utf8"),
        pytest.param(base64.urlsafe_b64encode(b"{}").decode(), id="object"),
        pytest.param(base64.urlsafe_b64encode(b'{"a": 1, "b": 2}').decode(), id="two-key-object"),
        pytest.param(base64.urlsafe_b64encode(b"[1, 2]").decode(), id="numbers"),
        pytest.param(
            base64.urlsafe_b64encode(json.dumps(["2024-05-01T12:00:00.000000Z"]).encode()).decode(), id="one-element"
        ),
        pytest.param(base64.urlsafe_b64encode(json.dumps(["yesterday", "o-1"]).encode()).decode(), id="not-a-time"),
        pytest.param(
            base64.urlsafe_b64encode(json.dumps(["2024-05-01T12:00:00Z", "o-1"]).encode()).decode(),
            id="not-the-stored-format",
        ),
    ],
)
async def test_query_in_state_malformed_continuation_is_a_value_error(stores: Stores, token: str) -> None:
    await seed(stores, new_state("o-1"), new_state("o-2", T0 + US))
    with pytest.raises(ValueError, match="malformed continuation token"):
        await stores.state.query_in_state(PENDING, 1, token)


async def test_query_in_state_continuation_round_trips(stores: Stores) -> None:
    """A well-formed token that a query issued is accepted (the malformed cases above are not refused for being
    tokens at all), and a page size below 1 is refused."""
    await seed(stores, new_state("o-1"), new_state("o-2", T0 + US))
    first = await stores.state.query_in_state(PENDING, 1)
    assert first.continuation is not None
    assert ids(await stores.state.query_in_state(PENDING, 1, first.continuation)) == ["o-2"]
    with pytest.raises(ValueError):
        await stores.state.query_in_state(PENDING, 0)


def test_the_supervisors_checkpointed_continuation_still_decodes() -> None:
    """query_expired's continuation is checkpointed by the Supervisor (orderflow/supervisor.py): a token written by
    the code before query_in_state shared its codec must still decode to the same position after a deployment."""
    before = "WyIyMDI0LTA1LTAxVDEyOjAwOjAwLjAwMDAwMFoiLCAiby0xIl0="  # ["2024-05-01T12:00:00.000000Z", "o-1"]
    cursor = ExpiredCursor.decode(before)
    assert (cursor.complete_by, cursor.id) == ("2024-05-01T12:00:00.000000Z", "o-1")
    assert cursor.encode() == before
    assert ExpiredCursor.start(T0, None) == ExpiredCursor("2024-05-01T12:00:00.000000Z", "")


# --- oldest_in_state --------------------------------------------------------------------------------------------


async def test_oldest_in_state(stores: Stores) -> None:
    assert await stores.state.oldest_in_state(PENDING) is None
    await seed(stores, new_state("done", T0 - timedelta(days=9), process_state=ProcessState.PROCESSED))
    assert await stores.state.oldest_in_state(PENDING) is None  # records in other states only
    await seed(stores, new_state("newer", T0 + US), new_state("tie-b", T0), new_state("tie-a", T0))
    oldest = await stores.state.oldest_in_state(PENDING)
    assert oldest is not None and oldest.order_id == "tie-a"
    got = await stores.state.get("tie-a")
    assert got is not None and got[0] == oldest
    await stores.state.update_with_retry(
        "tie-a", lambda r: claim(r, instance_id("tie-a", 1), T0 + LEASE, T0 + timedelta(hours=1))
    )
    oldest = await stores.state.oldest_in_state(PENDING)
    assert oldest is not None and oldest.order_id == "tie-b"
    done = await stores.state.oldest_in_state(ProcessState.PROCESSED)
    assert done is not None and done.order_id == "done"


# --- count_expired ----------------------------------------------------------------------------------------------


async def test_count_expired_counts_supervised_records_past_complete_by(stores: Stores) -> None:
    now = T0
    assert await stores.state.count_expired(now) == 0
    await seed(
        stores,
        processing("expired", now - US),
        processing("long-expired", now - timedelta(days=1)),
        processing("compensating-expired", now - US, ProcessState.COMPENSATING),
        processing("due-now", now),  # CompleteBy == now: not expired yet
        processing("running", now + US),
        processing("compensating-running", now + LEASE, ProcessState.COMPENSATING),
        # Not supervised, whatever their CompleteBy: not counted.
        new_state("pending", complete_by=now - US),
        new_state("processed", process_state=ProcessState.PROCESSED, complete_by=now - US),
        new_state("failed", process_state=ProcessState.ERROR, last_error="x", complete_by=now - US),
        new_state("no-deadline"),
    )
    assert await stores.state.count_expired(now) == 3
    assert await stores.state.count_expired(now + US) == 4
    assert await stores.state.count_expired(now - timedelta(days=1)) == 0
    assert await stores.state.count_expired(now - timedelta(days=1) + US) == 1


# --- the embedded store's plan ----------------------------------------------------------------------------------


async def test_sqlite_listing_seeks_the_updated_at_index(tmp_path: Path) -> None:
    """Every query_in_state page (and so oldest_in_state) is a seek on ix_state_updated (processState, updatedAt, id)
    from its position, not a scan of the state's records or a sort: a deep page costs what the first one does. The
    index is on the expression json_extract(doc, '$.updatedAt'), used only when a query spells it the same way."""
    orders, state = open_sqlite_stores(tmp_path / "store.db")
    statements: list[str] = []
    state._db._conn.set_trace_callback(statements.append)
    try:
        await seed(Stores(orders, state), *(new_state(f"o-{i}", T0 + i * US) for i in range(3)))
        first = await state.query_in_state(PENDING, 1, updated_before=T0 + LEASE)
        await state.query_in_state(PENDING, 1, first.continuation, updated_before=T0 + LEASE)
        await state.query_in_state(PENDING, 1, first.continuation)
        await state.oldest_in_state(PENDING)
        listings = [s for s in statements if s.startswith("SELECT doc, etag FROM order_state WHERE process_state =")]
        assert len(listings) == 4
        for sql in listings:
            plan = " | ".join(row[3] for row in state._db._conn.execute("EXPLAIN QUERY PLAN " + sql))
            assert "USING INDEX ix_state_updated (process_state=?" in plan, (sql, plan)
            assert "TEMP B-TREE" not in plan, (sql, plan)
        deep = listings[1:3]
        assert all(
            "<expr>>?" in " ".join(r[3] for r in state._db._conn.execute("EXPLAIN QUERY PLAN " + s)) for s in deep
        ), deep
    finally:
        await state.aclose()
