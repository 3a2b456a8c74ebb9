"""How the Supervisor finds expired work (seed 001, "Supervision"): by query or through the recovery index.

`query` mode runs the state store's CompleteBy query (on Cosmos DB a cross-partition query). `index` mode reads the
recovery index: a container partitioned by CompleteBy time bucket (`RecoveryIndexBucketSeconds`), written before
every state write that sets a CompleteBy; a window scan is one single-partition query per bucket. The state record
stays the truth: each hit is verified with a point read, and a stale entry is skipped and deleted; entries expire by
the container's TTL. Both modes page by the same keyset (CompleteBy, orderId), so the Supervisor's loop is the same.
Costs and what makes an entry stale: docs/modules-product.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from orderflow.ports import ExpiredCursor, IndexEntry, Page, RecoveryIndex, StateStore, Versioned, bucket_of
from orderflow.records import format_utc, parse_utc

log = logging.getLogger("orderflow.supervisor")


async def index_deadline(index: RecoveryIndex | None, order_id: str, complete_by: datetime, locked_by: str) -> None:
    """The index entry of a CompleteBy the caller is about to write, written first (in both scan modes): a crash in
    between leaves at most a stale entry, never a missing one. No-op without an index."""
    if index is not None:
        await index.add(IndexEntry(order_id, complete_by, locked_by))


# A range wider than this many buckets starts with one query for its earliest entry instead of bucket by bucket.
MAX_BUCKETS_WITHOUT_JUMP = 24


class ExpiredSource(Protocol):
    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page: ...


@dataclass
class ScanCost:
    """What one Supervisor run read: queries issued, documents they returned, point reads, stale entries."""

    queries: int = 0
    documents: int = 0
    point_reads: int = 0
    stale: int = 0


class QueryScan:
    """`query` mode: the state store's CompleteBy query, counted."""

    def __init__(self, state: StateStore, cost: ScanCost) -> None:
        self._state = state
        self.cost = cost

    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page:
        page = await self._state.query_expired(window_start, window_end, page_size, continuation)
        self.cost.queries += 1
        self.cost.documents += len(page.items)
        return page


class IndexedScan:
    """`index` mode: the recovery index, bucket by bucket, each hit verified against the state record."""

    def __init__(self, state: StateStore, index: RecoveryIndex, cost: ScanCost) -> None:
        self._state = state
        self._index = index
        self.cost = cost

    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        width = timedelta(seconds=self._index.bucket_seconds)
        after = ExpiredCursor.start(window_start, continuation)
        charge = 0.0
        while True:  # stale entries are skipped, not returned: go on until a live one or the end
            entries, ru = await self._entries(window_start, window_end, page_size + 1, after, width)
            charge += ru
            more = len(entries) > page_size
            examined = entries[:page_size]
            items = [found for found in [await self._verify(e) for e in examined] if found is not None]
            last = examined[-1] if more else None
            after = after if last is None else ExpiredCursor(format_utc(last.complete_by), last.order_id)
            if items or last is None:
                return Page(items=items, continuation=None if last is None else after.encode(), request_charge=charge)

    async def _verify(self, entry: IndexEntry) -> Versioned | None:
        """The state record if the entry still describes it; else the entry is stale: removed, None."""
        found = await self._state.get(entry.order_id)
        self.cost.point_reads += 1
        if found is not None and entry.matches(found[0]):
            return found
        self.cost.stale += 1
        try:
            await self._index.remove(entry)
        except Exception:  # a stale entry left behind is skipped again, then expires
            log.warning("stale recovery-index entry %s not removed", entry.id, exc_info=True)
        return None

    async def _entries(
        self, start: datetime, end: datetime, wanted: int, after: ExpiredCursor, width: timedelta
    ) -> tuple[list[IndexEntry], float]:
        """Up to `wanted` entries of [start, end) after the cursor, in (CompleteBy, orderId) order. Bucket by bucket;
        where more than MAX_BUCKETS_WITHOUT_JUMP buckets are left and the last one read was empty (or at the start),
        one query for the earliest entry jumps over the empty stretch."""
        charge = 0.0
        seconds = int(width.total_seconds())
        at = max(start, parse_utc(after.complete_by))
        bucket = bucket_of(at, seconds)
        entries: list[IndexEntry] = []
        empty = True  # the bucket before this one gave nothing (or this is the first)
        while bucket < end and len(entries) < wanted:
            if empty and (end - bucket) / width > MAX_BUCKETS_WITHOUT_JUMP:
                first, ru = await self._index.first_at_or_after(max(bucket, at), end)
                self.cost.queries += 1
                charge += ru
                if first is None:
                    break
                bucket = max(bucket, bucket_of(first, seconds))
            got, ru = await self._index.page(bucket, start, end, after, wanted - len(entries))
            self.cost.queries += 1
            self.cost.documents += len(got)
            charge += ru
            entries.extend(got)
            empty = not got
            bucket += width
        return entries, charge


def expired_source(state: StateStore, index: RecoveryIndex | None, mode: str, cost: ScanCost) -> ExpiredSource:
    """The Supervisor's source of expired records for `SupervisorScanMode`."""
    if mode == "index":
        if index is None:
            raise ValueError("SupervisorScanMode is index but no recovery index is open")
        return IndexedScan(state, index, cost)
    return QueryScan(state, cost)
