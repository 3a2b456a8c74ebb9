"""How the Supervisor finds expired work (seed 001, "Supervision"): by query or through the recovery index.

`query` mode runs the state store's CompleteBy query (on Cosmos DB a cross-partition query). `index` mode reads the
recovery index: a container partitioned by CompleteBy time bucket (`RecoveryIndexBucketSeconds`). A writer adds the
entry of a CompleteBy before the state write that sets it (`index_deadline`) and removes the entries that write left
behind after it (`update_indexed`, `superseded`), so the index holds the live entries and what a crash left. A
window scan is one single-partition query per bucket; each hit is verified with a point read, and a stale entry is
skipped and deleted; entries expire by the container's TTL. Both modes page by the same keyset (CompleteBy,
orderId), so the Supervisor's loop is the same. Costs and what makes an entry stale: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from orderflow.ports import ExpiredCursor, IndexEntry, Mutate, Page, RecoveryIndex, StateStore, Versioned, bucket_of
from orderflow.records import SUPERVISED_STATES, OrderStateRecord, format_utc, parse_utc

log = logging.getLogger("orderflow.supervisor")


async def index_deadline(
    index: RecoveryIndex | None, order_id: str, complete_by: datetime, locked_by: str
) -> IndexEntry | None:
    """The index entry of a CompleteBy the caller is about to write, written first: a crash in between leaves at
    most a stale entry, never a missing one. Returns it (for `superseded`); None without an index (query mode)."""
    if index is None:
        return None
    entry = IndexEntry(order_id, complete_by, locked_by)
    await index.add(entry)
    return entry


def entry_of(rec: OrderStateRecord) -> IndexEntry | None:
    """The entry that describes the record now: supervised (Processing, CompensationInProgress) with a CompleteBy.
    None for a record the Supervisor has nothing to look for in."""
    if rec.process_state not in SUPERVISED_STATES or rec.complete_by is None:
        return None
    return IndexEntry(rec.order_id, rec.complete_by, rec.locked_by)


async def superseded(
    index: RecoveryIndex | None, before: OrderStateRecord | None, after: OrderStateRecord, *ahead: IndexEntry | None
) -> None:
    """Call after a state write succeeded, `after` the record as it now is (written, or found unchanged): remove the
    entries that no longer describe it, `before`'s (the record that write replaced: its CompleteBy moved, its lock
    changed or it left the supervised states) and those written `ahead` for it that it did not use (a decision that
    ended the order). No call when every one still matches (a repeated write, a write that kept CompleteBy and lock).
    A failed removal is logged, never raised: the entry is stale, the scan's verification and the TTL catch it."""
    if index is None:
        return
    live = entry_of(after)
    candidates = [entry_of(before) if before is not None else None, *ahead]
    # By id (order and CompleteBy): never the id of the live entry, which the write ahead of `after` overwrote.
    stale = {
        e.id: e for e in candidates if e is not None and not e.matches(after) and (live is None or e.id != live.id)
    }
    if not stale:
        return
    outcomes = await asyncio.gather(*(index.remove(e) for e in stale.values()), return_exceptions=True)
    for entry, outcome in zip(stale.values(), outcomes, strict=True):
        if isinstance(outcome, Exception):
            log.warning("superseded recovery-index entry %s not removed", entry.id, exc_info=outcome)
        elif isinstance(outcome, BaseException):
            raise outcome


async def update_indexed(
    state: StateStore,
    index: RecoveryIndex | None,
    order_id: str,
    mutate: Mutate,
    *ahead: IndexEntry | None,
) -> Versioned:
    """`state.update_with_retry`, then `superseded` against the record the successful try read (the one its write
    replaced). A mutation that raises writes nothing and removes nothing."""
    read: list[OrderStateRecord] = []

    def applied(rec: OrderStateRecord) -> OrderStateRecord:
        read[:] = [rec]
        return mutate(rec)

    rec, etag = await state.update_with_retry(order_id, applied)
    await superseded(index, read[0] if read else None, rec, *ahead)
    return rec, etag


# A range wider than this many buckets starts with one query for its earliest entry instead of bucket by bucket.
MAX_BUCKETS_WITHOUT_JUMP = 24


class ExpiredSource(Protocol):
    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page: ...

    async def first_expired(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        """A CompleteBy at or before that of the first expired record in [start, end) (None: there is none), and
        the request charge: where the Supervisor's next window starts after an empty one."""
        ...


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

    async def first_expired(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        page = await self.query_expired(start, end, 1)
        if not page.items:
            return None, page.request_charge
        return page.items[0][0].complete_by or start, page.request_charge


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

    async def first_expired(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        """The earliest entry's CompleteBy, unverified (one query, no point read): a stale entry only makes the next
        window start earlier than it had to; it never passes a live one."""
        first, ru = await self._index.first_at_or_after(start, end)
        self.cost.queries += 1
        return first, ru

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
