"""Contract of the RecoveryIndex port (issue 12 part 4), on every adapter: the embedded SQLite store (table
`recovery_index`) and azure-cosmos against the Cosmos protocol server (container RecoveryIndexContainerName,
partition key /bucket).

An entry is one (orderId, CompleteBy) pair; its partition is the CompleteBy time bucket (`bucket_of`). `add` creates or
overwrites (idempotent); `page` reads one bucket: entries with window_start <= CompleteBy < window_end after a
(completeBy, orderId) cursor, ordered by (completeBy, orderId), at most `limit`; `first_at_or_after` finds the earliest
CompleteBy of any bucket in [start, end); `remove` deletes if present (idempotent).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.cosmos.aio import CosmosClient

from orderflow.adapters import open_recovery_index
from orderflow.azure.cosmos import CosmosNames, cosmos_recovery_index, ensure_containers
from orderflow.embedded.store import SqliteRecoveryIndex, open_sqlite_recovery_index
from orderflow.ports import ExpiredCursor, IndexEntry, RecoveryIndex, bucket_of
from orderflow.records import format_utc

ANY_KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"  # the protocol server accepts any key (as in conftest.py)
BUCKET = 300  # seconds: the RecoveryIndexBucketSeconds default
WIDTH = timedelta(seconds=BUCKET)
B0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)  # a bucket start (12:00 is a multiple of 300 s)
US = timedelta(microseconds=1)
FAR = B0 + timedelta(days=3650)

# @vercel/cosmosdb-server answers a query sent with a partition key (x-ms-documentdb-partitionkey) over the whole
# container: it checks no partition (handler/query-documents.js runs the query on every document of the collection).
# Cosmos DB scopes it to the partition. The product's page query relies on that scope alone (_INDEX_PAGE_SQL has no
# `c.bucket = @bucket` term), so on the protocol server a page returns other buckets' entries too.
PARTITION_SCOPE_UNSUPPORTED = (
    "cosmosdb-server ignores the partition key of a query (handler/query-documents.js queries every document); "
    "Cosmos DB scopes it to the bucket. Passes on the server if _INDEX_PAGE_SQL also filters c.bucket = @bucket"
)


@dataclass
class IndexBackend:
    """`open()` gives a new, independent connection to the same index each time."""

    name: str
    open: Callable[[], Awaitable[RecoveryIndex]]
    charges_request_units: bool


def _sqlite_index(tmp_path: Path) -> IndexBackend:
    path = tmp_path / "store.db"

    async def open_() -> RecoveryIndex:
        return open_sqlite_recovery_index(path, BUCKET)

    return IndexBackend("sqlite", open_, charges_request_units=False)


async def _cosmos_index(endpoint: str) -> IndexBackend:
    tag = uuid.uuid4().hex[:12]
    names = CosmosNames(
        f"orders-{tag}",
        "orders",
        f"state-{tag}",
        "orderState",
        "supervisorCheckpoints",
        "circuitBreakers",
        f"recoveryIndex-{tag}",
    )
    client = CosmosClient(endpoint, credential=ANY_KEY)
    try:
        await ensure_containers(client, names)  # creates the index container with the others
    finally:
        await client.close()

    async def open_() -> RecoveryIndex:
        return cosmos_recovery_index(CosmosClient(endpoint, credential=ANY_KEY), names, BUCKET)

    return IndexBackend("cosmos", open_, charges_request_units=True)


@pytest.fixture(params=["sqlite", pytest.param("cosmos", marks=pytest.mark.cosmos)])
async def index_backend(request: pytest.FixtureRequest, tmp_path: Path) -> IndexBackend:
    if request.param == "sqlite":
        return _sqlite_index(tmp_path)
    return await _cosmos_index(request.getfixturevalue("cosmos_endpoint"))


@pytest.fixture
async def index(index_backend: IndexBackend) -> AsyncIterator[RecoveryIndex]:
    opened = await index_backend.open()
    try:
        yield opened
    finally:
        await opened.aclose()


def entry(order_id: str, at: datetime, attempt: int = 1) -> IndexEntry:
    return IndexEntry(order_id, at, f"{order_id}:{attempt}")


def cursor_after(e: IndexEntry) -> ExpiredCursor:
    return ExpiredCursor(format_utc(e.complete_by), e.order_id)


async def whole_bucket(index: RecoveryIndex, bucket: datetime, limit: int = 1000) -> list[IndexEntry]:
    """Every entry of one bucket (window = the bucket itself, from the start)."""
    got, _ = await index.page(bucket, bucket, bucket + WIDTH, ExpiredCursor.start(bucket, None), limit)
    return got


def ordered(entries: list[IndexEntry]) -> list[IndexEntry]:
    return sorted(entries, key=lambda e: (e.complete_by, e.order_id))


# --- the port and its partitioning ----------------------------------------------------------------


async def test_index_satisfies_the_port(index: RecoveryIndex) -> None:
    assert isinstance(index, RecoveryIndex)
    assert index.bucket_seconds == BUCKET


def test_bucket_of_is_the_start_of_the_width_holding_the_time() -> None:
    assert bucket_of(B0, BUCKET) == B0  # a bucket start belongs to its own bucket
    assert bucket_of(B0 + WIDTH - US, BUCKET) == B0
    assert bucket_of(B0 - US, BUCKET) == B0 - WIDTH
    assert bucket_of(B0 + timedelta(seconds=299, microseconds=999_999), BUCKET) == B0
    assert bucket_of(B0 + timedelta(hours=1, seconds=17), 3600) == B0 + timedelta(hours=1)
    assert bucket_of(B0, BUCKET).tzinfo == UTC


def test_entry_id_is_order_and_complete_by() -> None:
    e = entry("o-1", B0 + timedelta(seconds=30, microseconds=5))
    assert e.id == "o-1|2024-05-01T12:00:30.000005Z"
    assert entry("o-1", B0).id != entry("o-1", B0 + US).id  # another CompleteBy of one order: another entry


# --- add ----------------------------------------------------------------------------------------------


async def test_add_is_idempotent(index: RecoveryIndex) -> None:
    e = entry("o-1", B0 + timedelta(seconds=30))
    await index.add(e)
    await index.add(e)
    assert await whole_bucket(index, B0) == [e]


async def test_add_of_the_same_id_overwrites(index: RecoveryIndex) -> None:
    """Same order and CompleteBy under another lock (a later attempt with the same deadline): one entry, the last."""
    at = B0 + timedelta(seconds=30)
    await index.add(entry("o-1", at, attempt=1))
    await index.add(entry("o-1", at, attempt=2))
    assert await whole_bucket(index, B0) == [entry("o-1", at, attempt=2)]


async def test_each_complete_by_of_an_order_is_its_own_entry(index: RecoveryIndex) -> None:
    """The claim lease, then a step deadline: both entries exist (the earlier is stale, the Supervisor judges)."""
    lease, deadline = B0 + timedelta(seconds=30), B0 + timedelta(seconds=40)
    await index.add(entry("o-1", lease))
    await index.add(entry("o-1", deadline))
    assert await whole_bucket(index, B0) == [entry("o-1", lease), entry("o-1", deadline)]


async def test_a_peer_connection_sees_the_entries(index_backend: IndexBackend, index: RecoveryIndex) -> None:
    e = entry("o-1", B0 + timedelta(seconds=1))
    await index.add(e)
    peer = await index_backend.open()
    try:
        assert await whole_bucket(peer, B0) == [e]
        await peer.remove(e)
    finally:
        await peer.aclose()
    assert await whole_bucket(index, B0) == []


# --- page ---------------------------------------------------------------------------------------------


async def test_page_orders_by_complete_by_then_order_id(index: RecoveryIndex) -> None:
    same = B0 + timedelta(seconds=100)
    entries = [
        entry("o-b", same),
        entry("o-a", same),
        entry("o-c", same),
        entry("o-z", B0 + timedelta(seconds=5)),
        entry("o-a", B0 + timedelta(seconds=250)),
        entry("o-m", same + US),
        entry("o-n", same - US),
    ]
    for e in random.Random(7).sample(entries, len(entries)):
        await index.add(e)
    assert await whole_bucket(index, B0) == ordered(entries)


async def test_page_window_is_start_inclusive_end_exclusive(index: RecoveryIndex) -> None:
    start, end = B0 + timedelta(seconds=60), B0 + timedelta(seconds=120)
    inside = [entry("at-start", start), entry("mid", start + timedelta(seconds=30)), entry("last", end - US)]
    outside = [entry("before", start - US), entry("at-end", end), entry("after", end + timedelta(seconds=1))]
    for e in inside + outside:
        await index.add(e)
    got, _ = await index.page(B0, start, end, ExpiredCursor.start(start, None), 100)
    assert got == ordered(inside)


async def test_page_is_after_the_cursor_and_at_most_limit(index: RecoveryIndex) -> None:
    """Keyset paging: limit 2 at a time, each page after the last one's (completeBy, orderId), reads every entry once,
    in order, including ties on CompleteBy split across pages."""
    tie = B0 + timedelta(seconds=90)
    entries = [entry(f"o-{i}", tie) for i in range(5)] + [
        entry(f"p-{i}", B0 + timedelta(seconds=10 * i + 1)) for i in range(6)
    ]
    for e in entries:
        await index.add(e)
    seen: list[IndexEntry] = []
    after = ExpiredCursor.start(B0, None)
    for _ in range(20):
        got, _ = await index.page(B0, B0, B0 + WIDTH, after, 2)
        assert len(got) <= 2
        seen.extend(got)
        if len(got) < 2:
            break
        after = cursor_after(got[-1])
    assert seen == ordered(entries)
    # A cursor inside a tie: only the same CompleteBy with a greater orderId, then later CompleteBys.
    got, _ = await index.page(B0, B0, B0 + WIDTH, ExpiredCursor(format_utc(tie), "o-2"), 100)
    assert got == [e for e in ordered(entries) if (e.complete_by, e.order_id) > (tie, "o-2")]


async def test_the_window_start_cursor_includes_an_entry_at_the_start(index: RecoveryIndex) -> None:
    """`ExpiredCursor.start(window_start, None)` is (window_start, ""): an entry exactly at window_start is read."""
    await index.add(entry("o-1", B0))
    got, _ = await index.page(B0, B0, B0 + WIDTH, ExpiredCursor.start(B0, None), 10)
    assert got == [entry("o-1", B0)]


async def test_a_page_of_an_empty_bucket_is_empty(index: RecoveryIndex) -> None:
    got, _ = await index.page(B0, B0, B0 + WIDTH, ExpiredCursor.start(B0, None), 10)
    assert got == []


async def test_page_returns_only_the_buckets_entries(
    request: pytest.FixtureRequest, index_backend: IndexBackend, index: RecoveryIndex
) -> None:
    """A window spanning three buckets, read bucket by bucket: each page holds its own bucket's entries only."""
    if index_backend.name == "cosmos":
        request.applymarker(pytest.mark.xfail(reason=PARTITION_SCOPE_UNSUPPORTED, strict=True))
    by_bucket = {
        b: [entry(f"o-{i}-{k}", b + timedelta(seconds=k * 70)) for k in range(3)]
        for i, b in enumerate((B0, B0 + WIDTH, B0 + 2 * WIDTH))
    }
    for entries in by_bucket.values():
        for e in entries:
            await index.add(e)
    start, end = B0, B0 + 3 * WIDTH
    for bucket, entries in by_bucket.items():
        got, _ = await index.page(bucket, start, end, ExpiredCursor.start(start, None), 100)
        assert got == entries, bucket


async def test_an_entry_lands_in_the_bucket_of_its_complete_by(index: RecoveryIndex) -> None:
    """On both sides of a bucket boundary: the entry is read from its own bucket (a point delete by its bucket finds
    it, whatever the query scope)."""
    last_of_b0, first_of_b1 = entry("o-early", B0 + WIDTH - US), entry("o-late", B0 + WIDTH)
    await index.add(last_of_b0)
    await index.add(first_of_b1)
    await index.remove(last_of_b0)  # removes by (bucket of its CompleteBy, id): must hit the partition it was put in
    await index.remove(first_of_b1)
    assert await whole_bucket(index, B0) == [] and await whole_bucket(index, B0 + WIDTH) == []


async def test_page_and_first_report_the_request_charge(index_backend: IndexBackend, index: RecoveryIndex) -> None:
    await index.add(entry("o-1", B0 + timedelta(seconds=1)))
    _, page_charge = await index.page(B0, B0, B0 + WIDTH, ExpiredCursor.start(B0, None), 10)
    _, first_charge = await index.first_at_or_after(B0, FAR)
    if index_backend.charges_request_units:
        assert page_charge > 0 and first_charge > 0
    else:
        assert page_charge == 0 and first_charge == 0


# --- first_at_or_after --------------------------------------------------------------------------------


async def test_first_at_or_after_finds_the_earliest_across_buckets(index: RecoveryIndex) -> None:
    times = [
        B0 + timedelta(days=400, seconds=7),
        B0 + timedelta(days=2, minutes=13),
        B0 + timedelta(minutes=1),
        B0 + timedelta(days=30),
        B0 - timedelta(days=5),
    ]
    for i, at in enumerate(times):
        await index.add(entry(f"o-{i}", at))
    assert await _first(index, B0 - timedelta(days=3650), FAR) == B0 - timedelta(days=5)
    assert await _first(index, B0, FAR) == B0 + timedelta(minutes=1)
    assert await _first(index, B0 + timedelta(minutes=1, microseconds=1), FAR) == B0 + timedelta(days=2, minutes=13)
    assert await _first(index, B0 + timedelta(days=3), FAR) == B0 + timedelta(days=30)
    assert await _first(index, B0 + timedelta(days=31), FAR) == B0 + timedelta(days=400, seconds=7)


async def test_first_at_or_after_is_start_inclusive_end_exclusive(index: RecoveryIndex) -> None:
    at = B0 + timedelta(days=9, seconds=11)
    await index.add(entry("o-1", at))
    assert await _first(index, at, at + US) == at
    assert await _first(index, at + US, FAR) is None
    assert await _first(index, B0, at) is None  # the end excludes it


async def test_first_at_or_after_of_an_empty_index_is_none(index: RecoveryIndex) -> None:
    assert await _first(index, B0 - timedelta(days=3650), FAR) is None


async def test_first_at_or_after_no_longer_sees_a_removed_entry(index: RecoveryIndex) -> None:
    early, late = entry("o-1", B0 + timedelta(hours=1)), entry("o-2", B0 + timedelta(days=3))
    await index.add(early)
    await index.add(late)
    await index.remove(early)
    assert await _first(index, B0, FAR) == late.complete_by


async def _first(index: RecoveryIndex, start: datetime, end: datetime) -> datetime | None:
    found, _ = await index.first_at_or_after(start, end)
    return found


# --- remove -------------------------------------------------------------------------------------------


async def test_remove_is_idempotent(index: RecoveryIndex) -> None:
    keep, gone = entry("o-keep", B0 + timedelta(seconds=10)), entry("o-gone", B0 + timedelta(seconds=20))
    await index.add(keep)
    await index.add(gone)
    await index.remove(gone)
    await index.remove(gone)  # already gone: no error
    await index.remove(entry("o-never", B0 + timedelta(seconds=30)))  # never added: no error
    assert await whole_bucket(index, B0) == [keep]


async def test_remove_deletes_only_that_complete_by(index: RecoveryIndex) -> None:
    lease, deadline = entry("o-1", B0 + timedelta(seconds=30)), entry("o-1", B0 + timedelta(seconds=40))
    await index.add(lease)
    await index.add(deadline)
    await index.remove(lease)
    assert await whole_bucket(index, B0) == [deadline]


async def test_remove_ignores_the_lock(index: RecoveryIndex) -> None:
    """An entry is identified by (orderId, CompleteBy); the lock it names is data, not identity."""
    at = B0 + timedelta(seconds=30)
    await index.add(entry("o-1", at, attempt=1))
    await index.remove(entry("o-1", at, attempt=2))
    assert await whole_bucket(index, B0) == []


# --- the factory ----------------------------------------------------------------------------------------


async def test_open_recovery_index_on_an_embedded_endpoint(tmp_path: Path) -> None:
    index = open_recovery_index(
        {"CosmosDb__accountEndpoint": f"embedded://{tmp_path / 'store.db'}", "RecoveryIndexBucketSeconds": "60"}
    )
    try:
        assert isinstance(index, SqliteRecoveryIndex) and index.bucket_seconds == 60
        at = B0 + timedelta(seconds=61)
        await index.add(entry("o-1", at))
        got, _ = await index.page(B0 + timedelta(seconds=60), B0, FAR, ExpiredCursor.start(B0, None), 10)
        assert got == [entry("o-1", at)]  # partitioned by 60 s buckets: 12:01:01 is in the 12:01 bucket
    finally:
        await index.aclose()
