"""Submission: validate a SubmitOrder, then write the order and its state record, each idempotent by orderId.

Invalid input → `Rejected` with a reason naming the field, nothing written. Same orderId, same immutable data (stable
hash) → accepted again, `received` sent again (and the terminal status, when the order is terminal); a crash between
the two create-if-absent writes is repaired by the redelivery. Same orderId, other data → `Rejected("OrderConflict")`,
the stored order never overwritten. A `CancelOrder` on the same queue and session (seed 002) → `cancel_order`,
by the record's state: Pending, Processing, Processed (or failed), unknown order; a repeat changes nothing and tells
no one again. What each input and each state gives: docs/modules-product.md."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orderflow import admission, apps, telemetry, tracing
from orderflow.admission import BACKLOG_FULL, backlog_gate
from orderflow.messages import (
    AlertKind,
    CancelOrder,
    InvalidMessage,
    OrderStatus,
    SubmitOrder,
    inbound_type,
    parse_cancel_order,
    parse_submit_order,
)
from orderflow.notifications import entered_end, send_terminal_status
from orderflow.outbound import about_message, raise_alert, send_status
from orderflow.patience import LONGEST_WAIT as LONGEST_WAIT  # re-exported: the patience's bound (tests, host.json)
from orderflow.patience import patiently
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState, instance_id
from orderflow.recovery_index import index_deadline, superseded, update_indexed
from orderflow.runtime import Services
from orderflow.starter import claims_allowed, workflow_input
from orderflow.state_machine import TERMINAL_STATES, CancelRefused, Wrote, cancel
from orderflow.state_machine import claim as claim_record
from orderflow.text import bounded, quote
from orderflow.workflow import WorkflowInput


@dataclass(frozen=True)
class Accepted:
    order: SubmitOrder
    created: bool  # False: a duplicate of an order already stored
    # The fast path (`receive(..., claim=True)`): the state record was created already claimed for attempt 1 (one
    # write instead of a Pending create and a claim); the caller starts this Scheduler.
    claimed: WorkflowInput | None = None
    state: OrderStateRecord | None = None  # the stored state record (what `acknowledge_order` answers with)
    key: str = ""  # the order key (orderflow/apps.py), set by `_store`


@dataclass(frozen=True)
class Refused:
    """Admission control said no (`backlog full`): answered `rejected` on the reply queue, nothing written. The caller
    completes the message: a decision, not poison."""

    order: SubmitOrder
    reason: str


@dataclass(frozen=True)
class Rejected:
    reason: str
    description: str
    order_id: str | None = None


@dataclass(frozen=True)
class CancelDone:
    """A cancel applied (or a repeat, `changed` False). `tell`: the running attempt to raise `CancelOrder` on."""

    order_id: str
    state: ProcessState
    changed: bool
    tell: str | None = None


@dataclass(frozen=True)
class CancelTooLate:
    """Refused (Processed, failed): answered `rejected` with the reason; the record is unchanged. Completed."""

    order_id: str
    reason: str


@dataclass(frozen=True)
class Inbound:
    """Where a message arrived: the queue, and the app that alone may send there (orderflow/apps.py). The app is
    read from the queue, never from the message: Service Bus does not stamp a message with its sender."""

    app: str
    queue: str

    @classmethod
    def of_app(cls, app: str) -> Inbound:
        """The app's own inbound queue `<app>-orders`."""
        return cls(app, apps.inbound_queue(app))

    @classmethod
    def shared(cls, services: Services) -> Inbound:
        """The shared queue of before per-app queues (OrdersQueueName): the legacy app's (LegacyOrdersApp)."""
        legacy = services.tunables.apps.legacy
        if legacy is None:
            raise ValueError("no LegacyOrdersApp: the shared orders queue belongs to no app and is not read")
        return cls(legacy, services.tunables.orders_queue)

    def key(self, services: Services, order_id: str) -> str:
        """The order key of this app's `order_id` (apps.SubmittingApps.order_key)."""
        return services.tunables.apps.order_key(self.app, order_id)


def validate(body: bytes, session_id: str | None, services: Services, source: Inbound | None = None) -> SubmitOrder:
    order = parse_submit_order(body)
    check_routing(order, session_id, source or Inbound.shared(services))
    return order


def check_routing(order: SubmitOrder | CancelOrder, session_id: str | None, source: Inbound) -> None:
    """The message's session is its order, and replyTo is the sending app's own status queue: an app can never
    direct statuses into another app's queue, nor into the pipeline's own."""
    if session_id is not None and session_id != order.order_id:
        raise InvalidMessage(
            "InvalidField:sessionId",
            f"field 'sessionId' must equal orderId {order.order_id!r}, got {quote(session_id)}",
        )
    own = apps.status_queue(source.app)
    if order.reply_to != own:
        raise InvalidMessage(
            "InvalidField:replyTo",
            f"field 'replyTo' {order.reply_to!r} is not app {source.app!r}'s status queue {own!r}",
        )


log = logging.getLogger("orderflow.submission")

# How long one delivery keeps retrying a transient store or bus failure before it gives the message back: well inside
# host.json's maxAutoLockRenewalDuration (5 min), so the lock is never lost while it waits. orders-inbound's
# MaxDeliveryCount (5) then multiplies it: a store outage of up to ~20 min delays submissions instead of
# dead-lettering them (issue 15, the store-outage drill: every delivery used to be abandoned at once and redelivered
# at once, and 5 deliveries within 2 s dead-lettered every order submitted during an outage).
PATIENCE = timedelta(seconds=240)


async def receive_patiently(
    services: Services,
    body: bytes,
    session_id: str | None,
    message_id: str | None = None,
    sequence_number: int | None = None,
    *,
    claim: bool = False,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    patience: timedelta = PATIENCE,
    source: Inbound | None = None,
) -> Accepted | Rejected | Refused | CancelDone | CancelTooLate:
    """`receive`, retried on a transient failure of the store or the bus (`orderflow.errors.is_transient`:
    throttled, busy, unavailable, timed out, connection lost) with waits doubling from 0.5 s to 8 s for at most
    `patience` (`orderflow.patience`); then, or on any other failure, it raises (the trigger abandons the message).
    Every step of `receive` is idempotent, so a retry repairs a half-done one. An accepted order is acknowledged
    (`acknowledge_order`) after its writes, in the same patience, retried on its own: a bus that refuses the
    `received` status does not redo the writes, and a record the fast path created claimed keeps its claim and its
    admission slot."""
    until = services.clock.now() + patience
    what = f"submission of {session_id!r}"
    outcome = await patiently(
        lambda: receive(
            services, body, session_id, message_id, sequence_number, claim=claim, acknowledge=False, source=source
        ),
        services.clock,
        until,
        what=what,
        sleep=sleep,
        logger=log,
    )
    if isinstance(outcome, Accepted):
        await patiently(
            lambda: acknowledge_order(services, outcome), services.clock, until, what=what, sleep=sleep, logger=log
        )
    return outcome


async def receive(
    services: Services,
    body: bytes,
    session_id: str | None,
    message_id: str | None = None,
    sequence_number: int | None = None,
    *,
    claim: bool = False,
    acknowledge: bool = True,
    source: Inbound | None = None,
) -> Accepted | Rejected | Refused | CancelDone | CancelTooLate:
    """One inbound message, by its `type`: a SubmitOrder (`submit`) or a CancelOrder (`cancel_order`), of the app
    whose queue it arrived on (`source`; None: the shared queue, the legacy app's). `claim`: the submission
    trigger's fast path; `acknowledge` False: the caller acknowledges (see `submit`)."""
    try:
        kind = inbound_type(body)
    except InvalidMessage:
        kind = "SubmitOrder"  # `submit` rejects it with the reason that names the field
    if kind == "CancelOrder":
        return await cancel_order(services, body, session_id, message_id, sequence_number, source=source)
    return await submit(
        services, body, session_id, message_id, sequence_number, claim=claim, acknowledge=acknowledge, source=source
    )


async def cancel_order(
    services: Services,
    body: bytes,
    session_id: str | None,
    message_id: str | None = None,
    sequence_number: int | None = None,
    *,
    source: Inbound | None = None,
) -> Rejected | CancelDone | CancelTooLate:
    """Apply a client's cancel to the order's state record (etag-guarded). The caller settles the message and, for
    `CancelDone.tell`, raises the event. A cancel acts only on the sending app's own orders: it names an orderId of
    that app (its key), so another app's order is not found, and the answer is exactly that of an unknown order."""
    source = source or Inbound.shared(services)
    where = _about(source, message_id, session_id, sequence_number)
    try:
        request = parse_cancel_order(body)
        check_routing(request, session_id, source)
    except InvalidMessage as exc:
        return await _reject(
            services, exc.reason, exc.description, order_id=None, kind=AlertKind.POISON_MESSAGE, where=where
        )
    order_id, now = source.key(services, request.order_id), services.clock.now()
    before = await services.state.get(order_id)
    if before is not None and not _owned(services, source, before[0].order_id, before[0].app, before[0].reply_to):
        before = None  # another app's order (a record from before per-app queues): answered as an unknown one
    if before is None:
        return await _reject(
            services,
            "UnknownOrder",
            f"field 'orderId': no order {request.order_id!r} to cancel",
            order_id=order_id,
            kind=AlertKind.POISON_MESSAGE,
            where=where,
        )
    wrote = Wrote(lambda r: cancel(r, now, request.reason))
    try:
        rec, _ = await update_indexed(services.state, services.index, order_id, wrote)
    except CancelRefused as exc:
        await send_status(
            services.bus,
            request.reply_to,
            order_id=order_id,
            state=OrderStatus.REJECTED,
            attempt=before[0].attempt,
            reason=f"cancel refused: {exc}",
            now=now,
            message_id=f"{request.order_id}:{OrderStatus.REJECTED.value}:cancel:{message_id or sequence_number}",
        )
        return CancelTooLate(order_id=order_id, reason=str(exc))
    if rec.process_state in TERMINAL_STATES and rec.notified_at is None:
        await entered_end(services, rec)  # Cancelled: nothing was sent, nothing to undo
    tell = rec.locked_by if wrote.changed and rec.process_state is ProcessState.PROCESSING else None
    return CancelDone(order_id=order_id, state=rec.process_state, changed=wrote.changed, tell=tell)


async def submit(
    services: Services,
    body: bytes,
    session_id: str | None,
    message_id: str | None = None,
    sequence_number: int | None = None,
    *,
    claim: bool = False,
    acknowledge: bool = True,
    source: Inbound | None = None,
) -> Accepted | Rejected | Refused:
    """Validate and store one order, then acknowledge it (`acknowledge_order`; unless the caller will, after the
    admission bookkeeping: `acknowledge=False`). The caller settles the message: complete on Accepted, dead-letter
    on Rejected.
    Alerts name the message (queue, MessageId, SessionId, SequenceNumber, whole) and, when the body parsed, the
    order.

    `claim` (the submission trigger's fast path): when the circuit breaker is closed and admission control grants a
    Processing slot, a new order's state record is created already claimed for attempt 1 — Pending → Processing
    applied in memory by the state machine's own `claim`, one write instead of two — and `Accepted.claimed` tells the
    caller to start its Scheduler. Otherwise (no slot, breaker not closed, an order already stored) it is created
    Pending as without `claim`, for the Starter."""
    source = source or Inbound.shared(services)
    where = _about(source, message_id, session_id, sequence_number)
    try:
        order = parse_submit_order(body)
    except InvalidMessage as exc:
        return await _reject(
            services, exc.reason, exc.description, order_id=None, kind=AlertKind.POISON_MESSAGE, where=where
        )
    key = source.key(services, order.order_id)
    try:
        check_routing(order, session_id, source)
    except InvalidMessage as exc:
        return await _reject(
            services, exc.reason, exc.description, order_id=key, kind=AlertKind.POISON_MESSAGE, where=where
        )
    now = services.clock.now()
    gate = backlog_gate(services, source.app)
    admitted = await gate.admit(services)  # counted at once; given back below unless this call creates the record
    if not admitted and await services.state.get(key) is None:
        # Admission control (orderflow/admission.py): a new order past the backlog bound is answered, not stored. The
        # status MessageId names this delivery: a later resubmission that is refused again is answered again.
        await send_status(
            services.bus,
            order.reply_to,
            order_id=key,
            state=OrderStatus.REJECTED,
            attempt=0,
            reason=BACKLOG_FULL,
            now=now,
            message_id=f"{order.order_id}:{OrderStatus.REJECTED.value}:{sequence_number or message_id}",
        )
        telemetry.count_rejected(BACKLOG_FULL)
        return Refused(order=order, reason=BACKLOG_FULL)
    created = False
    outcome: Accepted | Rejected | None = None
    slot = claim and not admission.others_waiting(services, source.app) and await fast_path_slot(services)
    try:
        outcome, created = await _store(services, order, source, key, now, where, claim_slot=slot)
    finally:
        claimed = isinstance(outcome, Accepted) and outcome.claimed is not None
        if admitted and (not created or claimed):
            gate.release()  # an order already stored, a conflict, a failure, or created claimed: not a new Pending
        if slot and not claimed:
            await admission.release(services, 1)  # the record existed, or the write failed: no claim was made
    if acknowledge and isinstance(outcome, Accepted):
        await acknowledge_order(services, outcome)
    return outcome


async def fast_path_slot(services: Services) -> bool:
    """Whether the fast path may claim at creation: the breaker is closed (half-open probes are the Starter's) and
    admission control granted a Processing slot."""
    if await claims_allowed(services) is not None:
        return False
    return await admission.reserve(services, 1) == 1


async def _store(
    services: Services,
    order: SubmitOrder,
    source: Inbound,
    key: str,
    now: datetime,
    where: dict[str, Any],
    *,
    claim_slot: bool = False,
) -> tuple[Accepted | Rejected, bool]:
    """Write the order and its state record (each create-if-absent, under the app's order key `key`) and answer;
    whether the state record is new. With `claim_slot`, a new state record is created claimed for attempt 1 (see
    `submit`). A record of another order under the key, or of another app (from before per-app queues), is a
    conflict: never touched."""
    stored, order_created = await services.orders.create_if_absent(OrderRecord.from_order(order, now, key, source.app))
    theirs = not _owned(services, source, stored.order_id, stored.app, stored.order.get("replyTo"))
    if stored.order_hash != order.immutable_hash() or theirs:
        return await _reject(
            services,
            "OrderConflict",
            f"order {order.order_id} exists with different data (hash {stored.order_hash[:12]}…)",
            order_id=key,
            kind=AlertKind.ORDER_CONFLICT,
            where=where,
        ), False
    new = OrderStateRecord.new(order, now, key, source.app)
    traceparent = tracing.current_traceparent()  # the submission's span: every later hop joins this trace
    if traceparent is not None:
        new = new.model_copy(update={"traceparent": traceparent})
    ahead = None
    if claim_slot:
        first = instance_id(key, 1)
        new = claim_record(new, first, now + services.tunables.claim_lease, now)
        ahead = await index_deadline(services.index, key, new.complete_by or now, first)
    state, state_created = await services.state.create_if_absent(new)
    await superseded(services.index, None, state, ahead)  # the record existed: the entry ahead describes nothing
    if state.order_hash != order.immutable_hash() or not _owned(services, source, key, state.app, state.reply_to):
        return await _reject(
            services,
            "OrderConflict",
            f"state record of {order.order_id} belongs to other data",
            order_id=key,
            kind=AlertKind.ORDER_CONFLICT,
            where=where,
        ), False
    claimed = workflow_input(services, state) if claim_slot and state_created else None
    accepted = Accepted(order=order, created=order_created or state_created, claimed=claimed, state=state, key=key)
    return accepted, state_created


async def acknowledge_order(services: Services, accepted: Accepted) -> None:
    """Answer an accepted order on its reply queue: `received`, sent on every acceptance (stable MessageId: duplicate
    detection absorbs repeats), so a crash after the writes and before this send is repaired by the redelivery too.
    A resubmission of a finished order (a client retrying after a timeout, past the duplicate window) gets its
    terminal status again — same state, reason, attempt and MessageId as the original, so a repeat inside the window
    is absorbed. No operator alert: that was raised when the order ended."""
    order, state = accepted.order, accepted.state
    await send_status(
        services.bus,
        order.reply_to,
        order_id=order.order_id,  # the app's own orderId (what `send_status` sends either way)
        state=OrderStatus.RECEIVED,
        attempt=0,
        reason="order accepted",
        now=services.clock.now(),
    )
    if state is not None and state.process_state in TERMINAL_STATES:
        await send_terminal_status(services, state)


def _owned(services: Services, source: Inbound, key: str, app: str | None, reply_to: str | None) -> bool:
    """Whether a stored order (its key, `app` and `replyTo`) is the sending app's (apps.SubmittingApps.owner_of: a
    record from before per-app queues, with a bare key, is the app's whose status queue it replies to)."""
    return services.tunables.apps.owner_of(key, app, reply_to) == source.app


def _about(source: Inbound, message_id: object, session_id: object, sequence_number: object) -> dict[str, Any]:
    """The alert details of a message: where it came from (queue, app) and which it was (outbound.about_message)."""
    return {**about_message(source.queue, message_id, session_id, sequence_number), "app": source.app}


async def _reject(
    services: Services, reason: str, description: str, *, order_id: str | None, kind: AlertKind, where: dict[str, Any]
) -> Rejected:
    """Alert, and answer the dead-letter reason and description, each within Service Bus's 4,096 characters."""
    reason, description = bounded(reason), bounded(description)
    await raise_alert(
        services.bus,
        services.tunables.alerts_queue,
        kind=kind,
        order_id=order_id,
        reason=reason,
        now=services.clock.now(),
        details={"description": description, **where},
    )
    return Rejected(reason=reason, description=description, order_id=order_id)
