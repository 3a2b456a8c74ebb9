"""Ports of the domain core (async `typing.Protocol`s): the orders DB, the state store, the documents, the recovery
index and the Service Bus client; shared helpers.

Store adapters: `orderflow.embedded.store` (embedded) and `orderflow.azure.cosmos` (azure-cosmos); both pass
`tests/product/contract/test_store_contract.py`. An etag is an opaque string that changes on every write. Bus adapters:
`orderflow.embedded.client_aio` and `azure.servicebus.aio`; `BusClient` covers exactly the calls the core makes, and
`orderflow.adapters` checks that both satisfy it. Received messages stay `Any`: the two sides' message classes differ.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, Self, runtime_checkable

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from orderflow.apps import KeyFilter
from orderflow.errors import NotFound, PreconditionFailed
from orderflow.records import (
    CLAIMABLE_STATES,
    SUPERVISED_STATES,
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    format_utc,
    parse_utc,
)

Versioned = tuple[OrderStateRecord, str]
Mutate = Callable[[OrderStateRecord], OrderStateRecord]


@dataclass(frozen=True)
class Page:
    """One page of a paged query: `continuation` is None on the last page; `request_charge` in RU."""

    items: list[Versioned] = field(default_factory=list)
    continuation: str | None = None
    request_charge: float = 0.0


@dataclass(frozen=True)
class KeysetCursor:
    """Keyset position of a paged state-store query: after (at, id), where `at` is a stored timestamp (`format_utc`)
    and the query is ordered by (that timestamp, id). Each page is a fresh query from this position, so a page never
    skips or repeats a record even while earlier records leave the result set (no server-side cursor to go stale).
    The continuation handed to callers is its opaque encoding."""

    at: str
    id: str

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps([self.at, self.id]).encode()).decode()

    @classmethod
    def decode(cls, token: str) -> Self:
        """The position in `token`; ValueError (its message fit for an HTTP 400) when `token` is not one that
        `encode` made."""
        try:
            at, key = _position(json.loads(base64.urlsafe_b64decode(token.encode())))
        except (ValueError, TypeError) as exc:
            shown = token if len(token) <= 80 else token[:80] + "..."
            raise ValueError(
                f"malformed continuation token {shown!r}: pass the continuation of the previous page unchanged"
            ) from exc
        return cls(at, key)


def _position(decoded: object) -> tuple[str, str]:
    """[timestamp, id] as `encode` writes them, or ValueError: a token that decodes to anything else (another
    shape, a timestamp not in the stored format) would page from a position no query issued."""
    if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(v, str) for v in decoded)):
        raise ValueError("not a [timestamp, id] pair")
    at, key = decoded
    if format_utc(parse_utc(at)) != at:
        raise ValueError(f"{at!r} is not a stored timestamp")
    return at, key


class ExpiredCursor(KeysetCursor):
    """Keyset position of `query_expired` and of the recovery index: after (completeBy, id). Its encoding is the
    Supervisor's checkpointed continuation, so it must stay as it is."""

    @property
    def complete_by(self) -> str:
        return self.at

    @classmethod
    def start(cls, window_start: datetime, continuation: str | None) -> ExpiredCursor:
        return cls(format_utc(window_start), "") if continuation is None else cls.decode(continuation)


def _complete_by(rec: OrderStateRecord) -> datetime:
    assert rec.complete_by is not None  # query_expired only returns records with a CompleteBy
    return rec.complete_by


def next_cursor(
    page: list[Versioned], more: bool, position: Callable[[OrderStateRecord], datetime] = _complete_by
) -> str | None:
    """The continuation after `page` (keyed on `position` of its last record: CompleteBy by default), or None when
    it was the last."""
    if not more or not page:
        return None
    last = page[-1][0]
    return KeysetCursor(format_utc(position(last)), last.id).encode()


@runtime_checkable
class OrdersDb(Protocol):
    async def create_if_absent(self, record: OrderRecord) -> tuple[OrderRecord, bool]:
        """Store the order unless its id exists; return the stored record and whether this call created it."""
        ...

    async def get(self, order_id: str) -> OrderRecord | None: ...

    async def set_ttl(self, order_id: str, ttl: int) -> None:
        """Give the stored order the per-item TTL `ttl` (seconds from this write; records.TTL_NEVER: never expires).
        A kept order (TTL_NEVER) stays kept: a later finite `ttl` writes nothing (`orderflow keep` may land between a
        notification's read and its TTL write). NotFound when it is not stored (or expired)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StateStore(Protocol):
    async def create_if_absent(self, rec: OrderStateRecord) -> tuple[OrderStateRecord, bool]: ...

    async def get(self, order_id: str) -> Versioned | None: ...

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        """If-Match write; returns the new etag. Raises PreconditionFailed (stale etag) or NotFound."""
        ...

    async def query_claimable(
        self,
        now: datetime,
        limit: int,
        states: tuple[ProcessState, ...] = CLAIMABLE_STATES,
        *,
        keys: KeyFilter | None = None,
    ) -> list[Versioned]:
        """In `states` (by default Pending or CompensationInProgress, records.CLAIMABLE_STATES), LockedBy null,
        RetryAt null or <= now; ordered by retryAt (nulls first) then createdAt. `keys`: only one app's orders
        (apps.KeyFilter, by the id); None: every app's."""
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

    async def count_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> int:
        """How many records are in `state` (a cross-partition count: the Starter's admission refresh and the ops
        summary only, never the submission path); only those of one app with `keys`."""
        ...

    async def query_in_state(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None = None,
        updated_before: datetime | None = None,
        *,
        keys: KeyFilter | None = None,
    ) -> Page:
        """One page of the records in `state` (the operator's list), only those last written (updatedAt) before
        `updated_before` when given, only one app's with `keys`; ordered by (updatedAt, id) and keyset-paged
        (`KeysetCursor`), so no record is skipped or repeated while others leave the state between pages. A record
        rewritten during the listing moves to its new updatedAt. `continuation` is None on the last page; a malformed
        one raises ValueError."""
        ...

    async def oldest_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> OrderStateRecord | None:
        """The record in `state` with the smallest updatedAt (ties by id), or None (the ops summary: the age of the
        oldest Pending); only one app's with `keys`."""
        ...

    async def count_expired(self, now: datetime) -> int:
        """How many supervised records (records.SUPERVISED_STATES) have CompleteBy < now: overdue work the Supervisor
        has not recovered yet (the ops summary). A CompleteBy equal to `now` is not expired yet."""
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
        return (
            rec.process_state in SUPERVISED_STATES
            and rec.complete_by == self.complete_by
            and rec.locked_by == self.locked_by
        )


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

    async def page(
        self, bucket: datetime, window_start: datetime, window_end: datetime, after: ExpiredCursor, limit: int
    ) -> tuple[list[IndexEntry], float]:
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


# -- the Service Bus client ------------------------------------------------------------------------------------------


class BusSender(Protocol):
    """A queue sender (`async with client.get_queue_sender(queue) as sender`)."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    async def send_messages(self, message: ServiceBusMessage, /) -> None: ...


class BusReceiver(Protocol):
    """A queue receiver: peek, receive, complete, abandon."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    async def peek_messages(self, max_message_count: int = ..., *, sequence_number: int = ...) -> list[Any]: ...

    async def receive_messages(
        self, max_message_count: int | None = ..., max_wait_time: float | None = ...
    ) -> list[Any]: ...

    async def complete_message(self, message: Any, /) -> None: ...

    async def abandon_message(self, message: Any, /) -> None: ...


class BusClient(Protocol):
    """The aio Service Bus client, as far as the core uses it."""

    def get_queue_sender(self, queue_name: str, /) -> BusSender: ...

    def get_queue_receiver(
        self, queue_name: str, /, *, sub_queue: ServiceBusSubQueue | None = ..., max_wait_time: float | None = ...
    ) -> BusReceiver: ...

    async def close(self) -> None: ...
