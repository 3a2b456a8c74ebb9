"""Ports of the domain core: the orders DB and the state store (async `typing.Protocol`s), shared helpers.

Adapters: `orderflow.store.sqlite_store` (embedded) and `orderflow.store.cosmos_store` (azure-cosmos).
Both pass `tests/contract/test_store_contract.py`. An etag is an opaque string that changes on every write.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from orderflow.records import (
    CLAIMABLE_STATES,
    SUPERVISED_STATES,
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    format_utc,
)
from orderflow.store.errors import NotFound, PreconditionFailed

Versioned = tuple[OrderStateRecord, str]
Mutate = Callable[[OrderStateRecord], OrderStateRecord]


@dataclass(frozen=True)
class Page:
    """One page of a paged query: `continuation` is None on the last page; `request_charge` in RU."""

    items: list[Versioned] = field(default_factory=list)
    continuation: str | None = None
    request_charge: float = 0.0


@dataclass(frozen=True)
class ExpiredCursor:
    """Keyset position of `query_expired`: after (completeBy, id). Both adapters page this way, so a page
    never skips or repeats a record even while the Supervisor moves earlier records out of the result set."""

    complete_by: str
    id: str

    @classmethod
    def start(cls, window_start: datetime, continuation: str | None) -> ExpiredCursor:
        return cls(format_utc(window_start), "") if continuation is None else cls.decode(continuation)

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps([self.complete_by, self.id]).encode()).decode()

    @classmethod
    def decode(cls, token: str) -> ExpiredCursor:
        try:
            complete_by, key = json.loads(base64.urlsafe_b64decode(token.encode()))
            return cls(str(complete_by), str(key))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"malformed continuation token {token!r}") from exc


def next_cursor(page: list[Versioned], more: bool) -> str | None:
    """The continuation after `page`, or None when it was the last."""
    if not more or not page:
        return None
    last = page[-1][0]
    assert last.complete_by is not None  # query_expired only returns records with a CompleteBy
    return ExpiredCursor(format_utc(last.complete_by), last.id).encode()


@runtime_checkable
class OrdersDb(Protocol):
    async def create_if_absent(self, record: OrderRecord) -> tuple[OrderRecord, bool]:
        """Store the order unless its id exists; return the stored record and whether this call created it."""
        ...

    async def get(self, order_id: str) -> OrderRecord | None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StateStore(Protocol):
    async def create_if_absent(self, rec: OrderStateRecord) -> tuple[OrderStateRecord, bool]: ...

    async def get(self, order_id: str) -> Versioned | None: ...

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        """If-Match write; returns the new etag. Raises PreconditionFailed (stale etag) or NotFound."""
        ...

    async def query_claimable(self, now: datetime, limit: int,
                              states: tuple[ProcessState, ...] = CLAIMABLE_STATES) -> list[Versioned]:
        """In `states` (by default Pending or CompensationInProgress, records.CLAIMABLE_STATES), LockedBy null,
        RetryAt null or <= now; ordered by retryAt (nulls first) then createdAt."""
        ...

    async def query_unnotified(self, updated_before: datetime, limit: int) -> list[Versioned]:
        """Terminal records (records.TERMINAL_STATES) whose notification is still owed (notifiedAt null), last
        written before `updated_before`; at most `limit`."""
        ...

    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page:
        """Processing or CompensationInProgress (records.SUPERVISED_STATES) with window_start <= CompleteBy <
        window_end, ordered by CompleteBy, one page."""
        ...

    async def count_in_state(self, state: ProcessState) -> int:
        """How many records are in `state` (a cross-partition count: the Starter's admission refresh only, never
        the submission path)."""
        ...

    async def get_checkpoint(self, name: str) -> tuple[dict[str, Any], str] | None: ...

    async def put_checkpoint(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        """Create (etag None; Conflict if present) or If-Match replace (PreconditionFailed); new etag."""
        ...

    async def update_with_retry(self, order_id: str, mutate: Mutate, attempts: int = 5) -> Versioned: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class IndexEntry:
    """One recovery-index entry: the order had (or has) CompleteBy `complete_by` under lock `locked_by`. The state
    record is the truth; an entry may be stale (a later CompleteBy, another attempt, a finished order)."""

    order_id: str
    complete_by: datetime
    locked_by: str | None

    @property
    def id(self) -> str:
        return f"{self.order_id}|{format_utc(self.complete_by)}"

    def matches(self, rec: OrderStateRecord) -> bool:
        """Whether the record is still what this entry says: supervised (Processing or CompensationInProgress), this
        CompleteBy, this lock."""
        return (rec.process_state in SUPERVISED_STATES and rec.complete_by == self.complete_by
                and rec.locked_by == self.locked_by)


def bucket_of(at: datetime, width_seconds: int) -> datetime:
    """The start of the CompleteBy time bucket (one index partition) that holds `at`."""
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % width_seconds, tz=at.tzinfo)


@runtime_checkable
class RecoveryIndex(Protocol):
    """The recovery index (issue 12): entries partitioned by CompleteBy time bucket, so that a Supervisor scan reads
    single partitions. Written before every state write that sets a CompleteBy; verified against the record."""

    bucket_seconds: int

    async def add(self, entry: IndexEntry) -> None:
        """Create or overwrite the entry (idempotent)."""
        ...

    async def page(self, bucket: datetime, window_start: datetime, window_end: datetime, after: ExpiredCursor,
                   limit: int) -> tuple[list[IndexEntry], float]:
        """Entries of one bucket with window_start <= CompleteBy < window_end, after the cursor (completeBy, orderId),
        ordered by (completeBy, orderId); at most `limit`; and the request charge (a single-partition query)."""
        ...

    async def first_at_or_after(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        """The earliest CompleteBy of any entry in [start, end) (to jump over empty stretches), and the charge."""
        ...

    async def remove(self, entry: IndexEntry) -> None:
        """Delete the entry if present (idempotent)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class DocumentStore(Protocol):
    """Small shared documents with etags (one per id), e.g. the circuit breakers: every process that can reach the
    container sees the same document, and a write is create-if-absent or If-Match."""

    async def get(self, name: str) -> tuple[dict[str, Any], str] | None: ...

    async def put(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        """Create (etag None; Conflict if present) or If-Match replace (PreconditionFailed); the new etag."""
        ...

    async def aclose(self) -> None: ...


class UpdateWithRetry:
    """Mixin: read → mutate → If-Match replace, re-reading on 412, for any adapter with get/replace.

    `mutate` may raise (Fenced, IllegalTransition, NotDue...): that propagates and nothing is written.
    A mutate that returns the record unchanged writes nothing and returns the current etag.
    """

    async def get(self, order_id: str) -> Versioned | None:
        raise NotImplementedError

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        raise NotImplementedError

    async def update_with_retry(self, order_id: str, mutate: Mutate, attempts: int = 5) -> Versioned:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        last: PreconditionFailed | None = None
        for _ in range(attempts):
            current = await self.get(order_id)
            if current is None:
                raise NotFound(f"state record {order_id!r} does not exist")
            rec, etag = current
            updated = mutate(rec)
            if updated == rec:
                return rec, etag
            try:
                return updated, await self.replace(updated, etag)
            except PreconditionFailed as exc:
                last = exc
        assert last is not None
        raise last
