"""Contract of the DocumentStore port (the circuit-breaker documents) and of `StateStore.count_in_state`, on every
adapter: the embedded SQLite store (`documents` table) and azure-cosmos against the Cosmos protocol server
(container `circuitBreakers`, partition key /id).

Cosmos semantics are the reference: create 409 on a present id, If-Match 412 on a stale etag
(https://learn.microsoft.com/azure/cosmos-db/nosql/database-transactions-optimistic-concurrency), replace of a
missing item 404 (https://learn.microsoft.com/rest/api/cosmos-db/replace-a-document#status-codes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.cosmos.aio import CosmosClient

from orderflow.adapters import Stores
from orderflow.azure.cosmos import CosmosNames, cosmos_breaker_documents, open_cosmos_with_key
from orderflow.breaker import BreakerConfig, BreakerDoc, BreakerState, Permit, SharedBreaker, Transition
from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_documents, open_sqlite_stores
from orderflow.errors import Conflict, NotFound, PreconditionFailed
from orderflow.messages import SubmitOrder
from orderflow.ports import DocumentStore
from orderflow.records import OrderStateRecord, ProcessState

ANY_KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"  # the protocol server accepts any key (as in conftest.py)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SERVICE = "fulfilment"


@dataclass
class DocumentsBackend:
    """`open()` gives a new, independent connection to the same documents each time (another Agent process)."""

    name: str
    open: Callable[[], Awaitable[DocumentStore]]
    # The checkpoint store on the same data, to show the two kinds of document never collide.
    open_stores: Callable[[], Awaitable[Stores]]


def _sqlite_documents(tmp_path: Path) -> DocumentsBackend:
    path = tmp_path / "store.db"

    async def open_() -> DocumentStore:
        return open_sqlite_documents(path, "circuitBreakers")

    async def open_stores() -> Stores:
        return Stores(*open_sqlite_stores(path))

    return DocumentsBackend("sqlite", open_, open_stores)


async def _cosmos_documents(endpoint: str) -> DocumentsBackend:
    tag = uuid.uuid4().hex[:12]
    names = CosmosNames(
        f"orders-{tag}", "orders", f"state-{tag}", "orderState", "supervisorCheckpoints", "circuitBreakers"
    )
    created = Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names))  # creates every container
    await created.aclose()

    async def open_() -> DocumentStore:
        return cosmos_breaker_documents(CosmosClient(endpoint, credential=ANY_KEY), names)

    async def open_stores() -> Stores:
        return Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names, create_containers=False))

    return DocumentsBackend("cosmos", open_, open_stores)


@pytest.fixture(params=["sqlite", pytest.param("cosmos", marks=pytest.mark.cosmos)])
async def docs_backend(request: pytest.FixtureRequest, tmp_path: Path) -> DocumentsBackend:
    if request.param == "sqlite":
        return _sqlite_documents(tmp_path)
    return await _cosmos_documents(request.getfixturevalue("cosmos_endpoint"))


@pytest.fixture
async def documents(docs_backend: DocumentsBackend) -> AsyncIterator[DocumentStore]:
    opened = await docs_backend.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def peer_documents(docs_backend: DocumentsBackend, documents: DocumentStore) -> AsyncIterator[DocumentStore]:
    opened = await docs_backend.open()
    try:
        yield opened
    finally:
        await opened.aclose()


# --- get / put ------------------------------------------------------------------------------------


async def test_documents_satisfy_the_port(documents: DocumentStore) -> None:
    assert isinstance(documents, DocumentStore)


async def test_get_of_a_missing_document_is_none(documents: DocumentStore) -> None:
    assert await documents.get("nobody") is None


async def test_create_if_absent_then_conflict_on_repeat(documents: DocumentStore) -> None:
    etag = await documents.put(SERVICE, {"state": "closed"}, None)
    with pytest.raises(Conflict):
        await documents.put(SERVICE, {"state": "open"}, None)
    assert await documents.get(SERVICE) == ({"state": "closed"}, etag)


async def test_if_match_replaces_and_refuses_a_stale_etag(documents: DocumentStore) -> None:
    first = await documents.put(SERVICE, {"n": 1}, None)
    second = await documents.put(SERVICE, {"n": 2}, first)
    assert second != first
    with pytest.raises(PreconditionFailed):
        await documents.put(SERVICE, {"n": 3}, first)
    assert await documents.get(SERVICE) == ({"n": 2}, second)
    third = await documents.put(SERVICE, {"n": 3}, second)
    assert len({first, second, third}) == 3  # the etag changes on every write, even to equal data


async def test_if_match_on_a_missing_document_is_not_found(documents: DocumentStore) -> None:
    etag = await documents.put("other", {"n": 1}, None)
    with pytest.raises(NotFound):
        await documents.put(SERVICE, {"n": 1}, etag)
    assert await documents.get(SERVICE) is None


async def test_the_data_round_trips_exactly(documents: DocumentStore) -> None:
    doc = BreakerDoc(
        service="svc-é",
        state=BreakerState.OPEN,
        failures=(T0, T0 + timedelta(microseconds=1)),
        open_until=T0 + timedelta(seconds=15),
        cooldown_seconds=15.5,
        reason="3 failed calls «ü»",
    )
    data = doc.to_data()
    etag = await documents.put("svc-é", data, None)
    assert await documents.get("svc-é") == (data, etag)
    found = await documents.get("svc-é")
    assert found is not None and BreakerDoc.model_validate(found[0]) == doc


async def test_documents_are_one_per_id(documents: DocumentStore) -> None:
    a = await documents.put("a", {"x": "a"}, None)
    b = await documents.put("b", {"x": "b"}, None)
    await documents.put("a", {"x": "a2"}, a)
    assert await documents.get("b") == ({"x": "b"}, b)


async def test_a_peer_connection_sees_the_same_document(
    documents: DocumentStore, peer_documents: DocumentStore
) -> None:
    etag = await documents.put(SERVICE, {"n": 1}, None)
    assert await peer_documents.get(SERVICE) == ({"n": 1}, etag)
    with pytest.raises(Conflict):
        await peer_documents.put(SERVICE, {"n": 2}, None)
    newer = await peer_documents.put(SERVICE, {"n": 2}, etag)
    with pytest.raises(PreconditionFailed):
        await documents.put(SERVICE, {"n": 3}, etag)
    assert await documents.get(SERVICE) == ({"n": 2}, newer)


async def test_concurrent_if_match_writes_have_one_winner(
    documents: DocumentStore, peer_documents: DocumentStore
) -> None:
    etag = await documents.put(SERVICE, {"n": 0}, None)
    results = await asyncio.gather(
        documents.put(SERVICE, {"n": 1}, etag), peer_documents.put(SERVICE, {"n": 2}, etag), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["PreconditionFailed", "str"]
    winner = next(i for i, r in enumerate(results) if isinstance(r, str))
    assert await documents.get(SERVICE) == ({"n": winner + 1}, results[winner])


async def test_concurrent_creates_have_one_winner(documents: DocumentStore, peer_documents: DocumentStore) -> None:
    results = await asyncio.gather(
        documents.put(SERVICE, {"n": 1}, None), peer_documents.put(SERVICE, {"n": 2}, None), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "str"]


async def test_breaker_documents_and_checkpoints_do_not_collide(
    docs_backend: DocumentsBackend, documents: DocumentStore
) -> None:
    stores = await docs_backend.open_stores()
    try:
        await stores.state.put_checkpoint(SERVICE, {"kind": "checkpoint"}, None)
        etag = await documents.put(SERVICE, {"kind": "breaker"}, None)  # no Conflict: another container/table
        assert await documents.get(SERVICE) == ({"kind": "breaker"}, etag)
        found = await stores.state.get_checkpoint(SERVICE)
        assert found is not None and found[0] == {"kind": "checkpoint"}
    finally:
        await stores.aclose()


async def test_sqlite_collections_are_separate(tmp_path: Path) -> None:
    one = open_sqlite_documents(tmp_path / "store.db", "circuitBreakers")
    other = open_sqlite_documents(tmp_path / "store.db", "somethingElse")
    try:
        await one.put(SERVICE, {"in": "one"}, None)
        assert await other.get(SERVICE) is None
        etag = await other.put(SERVICE, {"in": "other"}, None)
        assert await other.get(SERVICE) == ({"in": "other"}, etag)
        found = await one.get(SERVICE)
        assert found is not None and found[0] == {"in": "one"}
    finally:
        await one.aclose()
        await other.aclose()


# --- two SharedBreakers (two Agents) racing on one breaker document -------------------------------


class Recorder:
    def __init__(self) -> None:
        self.transitions: list[Transition] = []

    async def __call__(self, transition: Transition) -> None:
        self.transitions.append(transition)


def _breaker(documents: DocumentStore, clock: FakeClock, threshold: int, recorder: Recorder) -> SharedBreaker:
    config = BreakerConfig(threshold, timedelta(seconds=30), timedelta(seconds=15), timedelta(seconds=60), 2)
    return SharedBreaker(documents, SERVICE, config, clock, recorder)


async def _stored(documents: DocumentStore) -> BreakerDoc:
    found = await documents.get(SERVICE)
    assert found is not None
    return BreakerDoc.model_validate(found[0])


async def test_two_breakers_racing_lose_no_failure(documents: DocumentStore, peer_documents: DocumentStore) -> None:
    """Four failures at once from each of two Agents (eight writers: within SharedBreaker's write attempts)."""
    clock, recorder = FakeClock(T0), Recorder()
    breakers = [_breaker(d, clock, 100, recorder) for d in (documents, peer_documents)]
    await asyncio.gather(*(b.record(Permit(), ok=False) for _ in range(4) for b in breakers))
    doc = await _stored(peer_documents)
    assert doc.state is BreakerState.CLOSED and len(doc.failures) == 8
    assert recorder.transitions == []


async def test_two_breakers_racing_open_it_exactly_once(
    documents: DocumentStore, peer_documents: DocumentStore
) -> None:
    clock, recorder = FakeClock(T0), Recorder()
    breakers = [_breaker(d, clock, 6, recorder) for d in (documents, peer_documents)]
    await asyncio.gather(*(b.record(Permit(), ok=False) for _ in range(4) for b in breakers))
    assert [(t.before, t.after) for t in recorder.transitions] == [(BreakerState.CLOSED, BreakerState.OPEN)]
    doc = await _stored(documents)
    assert doc.state is BreakerState.OPEN and doc.reason == "6 failed requests within 30 s"
    # Once their cached reads (1 s) are stale, both Agents refuse; after the cool-down the two together get exactly
    # the configured probes.
    clock.advance(1)
    for b in breakers:
        assert not isinstance(await b.acquire(), Permit)
    clock.advance(14)
    results = await asyncio.gather(*(b.acquire() for _ in range(3) for b in breakers))
    assert sum(r == Permit(probe=True) for r in results) == 2
    assert (await _stored(documents)).probes_started == 2


# --- count_in_state -------------------------------------------------------------------------------


def _state(order_id: str, state: ProcessState) -> OrderStateRecord:
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
    return OrderStateRecord.new(order, T0).model_copy(update={"process_state": state})


async def _seed_states(stores: Stores) -> dict[ProcessState, int]:
    wanted = {ProcessState.PENDING: 5, ProcessState.PROCESSING: 3, ProcessState.PROCESSED: 2, ProcessState.ERROR: 1}
    for state, n in wanted.items():
        for i in range(n):
            _, created = await stores.state.create_if_absent(_state(f"{state.name.lower()}-{i}", state))
            assert created
    return wanted


async def test_count_in_state_counts_each_state_across_partitions(stores: Stores) -> None:
    for state in ProcessState:
        assert await stores.state.count_in_state(state) == 0
    wanted = await _seed_states(stores)
    for state in ProcessState:
        assert await stores.state.count_in_state(state) == wanted.get(state, 0), state


async def test_count_in_state_follows_writes(stores: Stores, peer: Stores) -> None:
    await _seed_states(stores)
    found = await stores.state.get("pending-0")
    assert found is not None
    rec, etag = found
    await peer.state.replace(rec.model_copy(update={"process_state": ProcessState.PROCESSING}), etag)
    assert await stores.state.count_in_state(ProcessState.PENDING) == 4
    assert await stores.state.count_in_state(ProcessState.PROCESSING) == 4


async def test_two_agents_at_their_default_concurrency_lose_no_failure(
    documents: DocumentStore, peer_documents: DocumentStore
) -> None:
    """Each Agent works AGENT_MAX_CONCURRENT_SESSIONS (default 8) orders at once: eight failures at once from each of
    two Agents must all be counted, and the threshold (here exactly 16) reached."""
    clock, recorder = FakeClock(T0), Recorder()
    breakers = [_breaker(d, clock, 16, recorder) for d in (documents, peer_documents)]
    await asyncio.gather(*(b.record(Permit(), ok=False) for _ in range(8) for b in breakers))
    assert [(t.before, t.after) for t in recorder.transitions] == [(BreakerState.CLOSED, BreakerState.OPEN)]
    assert (await _stored(documents)).reason == "16 failed requests within 30 s"
