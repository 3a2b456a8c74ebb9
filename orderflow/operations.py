"""Operator operations: what the CLI (`orderflow`, orderflow/cli/) and the HTTP API (triggers/ops_api.py) do, in
one place, over the app's own ports (state store, orders DB, bus, breaker documents) and the Durable status API.

Every answer is plain JSON (camelCase), the same for both front ends. A refusal is an `OpsError` with an HTTP status
and one line of text: an unknown order (404), a move its state does not allow (409), bad input (400). Nothing here
writes outside the state machine: a resubmit is `state_machine.resubmit` under an If-Match write, a cancel is the
CancelOrder handler's own use case (`submission.cancel_order`), applied at once to an order the state store holds.

An order is addressed by its key (orderflow/apps.py): `<app>.<orderId>`, or the bare orderId of the legacy app. Every
answer about an order names its app and the orderId the app chose (`clientOrderId`); the list filters by app.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from azure.servicebus import ServiceBusMessage

from orderflow import alarms, apps, deadletters, telemetry
from orderflow.alarms import AlarmConfig
from orderflow.apps import APP_NAME_PATTERN, SubmittingApps
from orderflow.breaker import BreakerConfig, show_breakers
from orderflow.messages import ORDER_ID_PATTERN, CancelOrder
from orderflow.ports import BusClient
from orderflow.records import OrderStateRecord, ProcessState, format_utc, instance_id, parse_utc
from orderflow.retention import keep_order
from orderflow.runtime import Services, Tunables
from orderflow.state_machine import IllegalTransition, resubmit
from orderflow.submission import CancelTooLate, Inbound, Rejected, cancel_order
from orderflow.supervisor import CHECKPOINT
from orderflow.text import first_line
from orderflow.workflow import CANCEL_EVENT

PAGE_SIZE_MAX = 200
# olderThan / --older-than: ASCII digits and a unit, at most about a century or more per unit, so that now - olderThan
# is a date (a longer one is refused, not an OverflowError). orderflow/openapi.py documents this very pattern.
OLDER_THAN_PATTERN = r"^(?:[0-9]{1,9}s|[0-9]{1,8}m|[0-9]{1,6}h|[0-9]{1,5}d)$"
OLDER_THAN_MAX = "999999999s, 99999999m, 999999h or 99999d"
DURATION = re.compile(OLDER_THAN_PATTERN.replace("$", r"\Z"))
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CANCELLABLE = (ProcessState.PENDING, ProcessState.PROCESSING)
PER_APP_STATES = (ProcessState.PENDING, ProcessState.PROCESSING)  # the summary's counts per app


def _inner(pattern: re.Pattern[str]) -> str:
    return pattern.pattern.removeprefix("\\A").removesuffix("\\Z")


# An order key as operators address an order (orderflow/apps.py): `<app>.<orderId>`, or the legacy app's bare orderId.
ORDER_KEY_PATTERN = re.compile(f"\\A(?:{_inner(APP_NAME_PATTERN)}\\{apps.SCOPE})?{_inner(ORDER_ID_PATTERN)}\\Z")
# DurableOrchestrationClient.raise_event(instance_id, event_name, event_data)
RaiseEvent = Callable[[str, str, Any], Awaitable[None]]
log = logging.getLogger("orderflow.ops")


NOT_LISTENED = (
    "not read: this identity holds no Listen right on {queue} and ServiceBusNamespaceResourceId is not "
    "set (the exact count, with Reader on the queue); see the Service Bus metric DeadletteredMessages "
    "(workbook tile Dead-lettered messages)"
)


def app_listens(tunables: Tunables) -> frozenset[str]:
    """The queues the function app's identity holds Service Bus Data Receiver on (infra/app/rbac.bicep): the ones its
    triggers receive from, every app's inbound queue among them. A peek, dead letters included, needs that right; the
    runtime counts the summary reads on Azure (`Services.queue_counts`) do not."""
    return frozenset({tunables.orders_queue, tunables.agent_replies_queue}) | tunables.apps.inbound_queues()


class OpsError(Exception):
    """A refusal to report as one line: `status` is the HTTP status the API answers with."""

    status = 400
    code = "BadRequest"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}


class BadRequest(OpsError):
    pass


class UnknownOrder(OpsError):
    status, code = 404, "NotFound"


class WrongState(OpsError):
    status, code = 409, "Conflict"


class DurableStatuses(Protocol):
    """The Durable status of one orchestration instance, as the Durable HTTP API's GET /instances/{id}?showHistory=
    true answers it (a dict), or None when there is no such instance."""

    async def status(self, instance: str) -> dict[str, Any] | None: ...


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `2h`, `3d` (the CLI's --older-than, the API's olderThan)."""
    if DURATION.match(text) is None:
        raise BadRequest(
            f"olderThan (--older-than) {text[:40]!r} is not a duration like 90s, 15m, 2h or 3d "
            f"(at most {OLDER_THAN_MAX})"
        )
    return timedelta(seconds=int(text[:-1]) * UNITS[text[-1]])


def parse_state(text: str) -> ProcessState:
    for state in ProcessState:
        if text.lower() == state.value.lower():
            return state
    raise BadRequest(f"state {text!r} is not one of {', '.join(s.value for s in ProcessState)}")


def check_order_id(key: str) -> str:
    """An order key (`ORDER_KEY_PATTERN`), or BadRequest saying what one looks like."""
    if not ORDER_KEY_PATTERN.match(key):
        raise BadRequest(
            f"order {key[:100]!r} is not a valid order key: <app>.<orderId>, or the legacy app's bare orderId (app: "
            "1-24 of a-z 0-9 - starting with a letter; orderId: 1-64 of A-Z a-z 0-9 _ -)"
        )
    return key


def check_app(name: str, known: SubmittingApps) -> str:
    """`name` if it is one of the submitting apps, else BadRequest naming the field."""
    if name not in known.names:
        raise BadRequest(
            f"app (--app) {name[:40]!r} is not a submitting app (SubmittingApps: {', '.join(known.names)})"
        )
    return name


def app_of(rec: OrderStateRecord, known: SubmittingApps) -> str | None:
    """The order's app: the record's own `app`, else its key's owner (a record written before per-app queues), else
    the app its key names (one since removed from SubmittingApps); None for an unscoped key with no legacy app."""
    return known.owner_of(rec.order_id, rec.app, rec.reply_to) or rec.app or apps.key_scope(rec.order_id)


def identity(rec: OrderStateRecord, known: SubmittingApps) -> dict[str, Any]:
    """Who an order is: its key (`orderId`, how operators address it), its app, and the orderId the app chose."""
    return {"orderId": rec.order_id, "app": app_of(rec, known), "clientOrderId": apps.client_order_id(rec.order_id)}


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round((now - then).total_seconds(), 3)


def order_row(rec: OrderStateRecord, now: datetime, known: SubmittingApps) -> dict[str, Any]:
    """One line of `orders`: which order, where it is and since when."""
    return {
        **identity(rec, known),
        "processState": rec.process_state.value,
        "attempt": rec.attempt,
        "failureCount": rec.failure_count,
        "lockedBy": rec.locked_by,
        "completeBy": None if rec.complete_by is None else format_utc(rec.complete_by),
        "updatedAt": format_utc(rec.updated_at),
        "ageSeconds": _age(now, rec.updated_at),
        "lastError": rec.last_error,
    }


@dataclass
class Operations:
    services: Services
    durable: DurableStatuses | None = None
    breaker_services: Sequence[str] = ()  # remote services whose breakers the summary shows (default: the app's)
    # The queues whose dead letters this caller may peek (Listen), from the tunables; None: try every queue. Only
    # for peeking: with `services.queue_counts` (Azure) every depth is the queue's runtime count instead.
    listens: Callable[[Tunables], frozenset[str]] | None = None
    # The alarms' thresholds (orderflow/alarms.py); None: from the tunables and this process's app settings.
    alarm_config: AlarmConfig | None = None

    @property
    def now(self) -> datetime:
        return self.services.clock.now()

    @property
    def apps(self) -> SubmittingApps:
        return self.services.tunables.apps

    async def _record(self, order_id: str) -> tuple[Any, str]:
        found = await self.services.state.get(check_order_id(order_id))
        if found is None:
            raise UnknownOrder(f"no order {order_id!r} in the state store")
        return found

    async def order(self, order_id: str) -> dict[str, Any]:
        """The state record, the stored order, and each attempt's orchestration status and history (`order_id`: the
        order's key)."""
        rec, etag = await self._record(order_id)
        stored = await self.services.orders.get(order_id)
        attempts = await asyncio.gather(*(self._attempt(order_id, n) for n in range(1, rec.attempt + 1)))
        return {
            **identity(rec, self.apps),
            "etag": etag,
            "state": rec.to_doc(),
            "order": None if stored is None else stored.order,
            "attempts": list(attempts),
        }

    async def _attempt(self, order_id: str, attempt: int) -> dict[str, Any]:
        instance = instance_id(order_id, attempt)
        entry: dict[str, Any] = {"attempt": attempt, "instanceId": instance, "orchestration": None}
        if self.durable is None:
            entry["orchestrationError"] = "no Durable status API configured"
            return entry
        try:
            entry["orchestration"] = await self.durable.status(instance)
        except Exception as exc:  # noqa: BLE001 - the record is still worth showing without it
            entry["orchestrationError"] = f"{type(exc).__name__}: {exc}"
        else:
            if entry["orchestration"] is None:
                entry["orchestrationError"] = "no such instance (never started, or purged)"
        return entry

    async def orders(
        self,
        state: str,
        older_than: str | None = None,
        page_size: int = 50,
        continuation: str | None = None,
        app: str | None = None,
    ) -> dict[str, Any]:
        """One page of the orders in `state` (oldest change first), optionally only those unchanged for
        `older_than`, only those of `app` (one of SubmittingApps)."""
        wanted = parse_state(state)
        keys = None if app is None else self.apps.keys_of(check_app(app, self.apps))
        if not 1 <= page_size <= PAGE_SIZE_MAX:
            raise BadRequest(f"pageSize (--page-size) must be 1..{PAGE_SIZE_MAX}, got {page_size}")
        now = self.now
        before = None if older_than is None else now - parse_duration(older_than)
        try:
            page = await self.services.state.query_in_state(wanted, page_size, continuation, before, keys=keys)
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        return {
            "state": wanted.value,
            "app": app,
            "items": [order_row(rec, now, self.apps) for rec, _ in page.items],
            "continuation": page.continuation,
        }

    async def resubmit(self, order_id: str, by: str, reason: str) -> dict[str, Any]:
        """Error → Pending, CompensationFailed → CompensationInProgress, with a fresh failure budget, audited: `by` is
        who the front end says acts (the HTTP API: the signed-in principal; the CLI: --by or the OS user)."""
        if not by.strip() or not reason.strip():
            raise BadRequest("a resubmit needs who (by) and why (reason)")
        await self._record(order_id)
        try:
            rec, _ = await self.services.state.update_with_retry(
                order_id, lambda r: resubmit(r, self.now, by.strip()[:256], reason.strip()[:256])
            )
        except IllegalTransition as exc:
            raise WrongState(str(exc)) from exc
        return {
            **identity(rec, self.apps),
            "processState": rec.process_state.value,
            "resubmission": rec.resubmissions[-1].model_dump(mode="json", by_alias=True),
        }

    async def keep(self, order_id: str, by: str, reason: str) -> dict[str, Any]:
        """Keep the order from expiring (orderflow/retention.py: ttl -1 on its state record and stored order), in any
        state, audited on the record (who, when, why); repeatable."""
        if not by.strip() or not reason.strip():
            raise BadRequest("a keep needs who (by) and why (reason)")
        await self._record(order_id)
        rec = await keep_order(self.services, order_id, by.strip()[:256], reason.strip()[:256])
        kept = rec.kept.model_dump(mode="json", by_alias=True) if rec.kept is not None else None
        return {**identity(rec, self.apps), "processState": rec.process_state.value, "ttl": rec.ttl, "kept": kept}

    async def cancel(
        self, order_id: str, by: str, reason: str | None = None, tell: RaiseEvent | None = None
    ) -> dict[str, Any]:
        """Apply the order's cancel through the CancelOrder handler's use case (`submission.cancel_order`) as its own
        app's cancel (the app's orderId, its status queue): Pending → Cancelled at once, Processing →
        cancelRequestedAt, and `tell` raises `CancelOrder` on the running attempt (which otherwise honours the record
        at its next decision point). No bus send: the function app holds no send right on an app's inbound queue. The
        record's cancelReason names `by`. Refused (409) when the order is past cancelling or belongs to no submitting
        app, 404 when the state store does not hold it (yet: a client's own CancelOrder, in the order's session, waits
        for its submission)."""
        rec, _ = await self._record(order_id)
        if rec.process_state not in CANCELLABLE:
            raise WrongState(
                f"order {order_id} is {rec.process_state.value}: only a Pending or Processing order can be cancelled"
            )
        if rec.cancel_requested_at is not None:
            return _cancel_answer(rec, self.apps, already=True)
        owner = self.apps.owner_of(order_id, rec.app, rec.reply_to)
        if owner is None:
            raise WrongState(f"order {order_id} belongs to no submitting app (SubmittingApps): no app to cancel it for")
        client_id = apps.client_order_id(order_id)
        try:
            body = cancel_body(client_id, apps.status_queue(owner), cancel_reason(by, reason), self.now)
        except ValueError as exc:
            raise BadRequest(str(exc).splitlines()[0]) from exc
        done = await cancel_order(
            self.services,
            body.encode(),
            client_id,
            f"{client_id}:cancel:ops",
            source=Inbound.of_app(owner),
        )
        if isinstance(done, CancelTooLate):
            raise WrongState(f"order {order_id}: {done.reason}")
        if isinstance(done, Rejected):
            raise WrongState(f"order {order_id}: cancel refused: {done.description}")
        if done.tell and tell is not None:
            try:
                await tell(done.tell, CANCEL_EVENT, {"orderId": order_id})
            except Exception:  # noqa: BLE001 - the record carries the cancel; the event only makes it sooner
                log.warning("cancel of %s: event to %s not delivered; the record carries it", order_id, done.tell)
        after, _ = await self._record(order_id)
        return _cancel_answer(after, self.apps, already=not done.changed)

    async def summary(self, dead_letter_cap: int = 1000) -> dict[str, Any]:
        """Counts per state, the oldest Pending and Processing, the expired supervised records, dead-letter depth per
        queue (the exact runtime count from `services.queue_counts` when set, else peeked, at most `dead_letter_cap`,
        on the queues the caller `listens` to; an unreadable queue says why), breaker states, the Supervisor's last
        run and the alarms, evaluated as the alarm timer does (every figure is also set as a metric)."""
        now, state = self.now, self.services.state
        counts = await asyncio.gather(*(state.count_in_state(s) for s in ProcessState))
        per_app = await self._per_app()
        oldest, processing, expired = await asyncio.gather(
            state.oldest_in_state(ProcessState.PENDING),
            state.oldest_in_state(ProcessState.PROCESSING),
            state.count_expired(now),
        )
        due = oldest if oldest is None or _due(oldest, now) else await alarms.oldest_due_pending(state, now)
        queues = sorted(self.services.tunables.internal_queues() | self.services.tunables.allowed_reply_queues)
        depths = dict(zip(queues, await self._depths(queues, dead_letter_cap), strict=True))
        checkpoint = await state.get_checkpoint(CHECKPOINT)
        per_state = {s.value: n for s, n in zip(ProcessState, counts, strict=True)}
        for name, n in per_state.items():
            telemetry.set_orders_in_state(name, n)
        for queue, found in depths.items():
            if "count" in found:
                telemetry.set_deadletter_depth(queue, found["count"])
        snap = alarms.Snapshot(now, per_state[ProcessState.PENDING.value], due, processing, depths)
        return {
            "generatedAt": format_utc(now),
            "states": per_state,
            "apps": per_app,
            "oldestPending": self._oldest(oldest, now),
            "oldestProcessing": self._oldest(processing, now),
            "expiredSupervised": expired,
            "deadLetters": depths,
            "breakers": await self._breakers(),
            "supervisor": None if checkpoint is None else _supervisor(checkpoint[0], now),
            "alarms": [a.to_json() for a in await alarms.stored(state, self.alarm_settings(), snap)],
        }

    def _oldest(self, rec: OrderStateRecord | None, now: datetime) -> dict[str, Any] | None:
        if rec is None:
            return None
        return {
            **identity(rec, self.apps),
            "since": format_utc(rec.updated_at),
            "ageSeconds": _age(now, rec.updated_at),
        }

    def alarm_settings(self) -> AlarmConfig:
        return self.alarm_config or AlarmConfig.from_env(self.services.tunables)

    async def alarm_tick(self) -> list[alarms.Alarm]:
        """The alarm timer's run (triggers/alarms.py): the figures, read as the summary reads them (dead letters
        counted up to one past the highest threshold), then `alarms.run`."""
        config = self.alarm_settings()

        async def depths(queues: Sequence[str]) -> list[dict[str, Any]]:
            return await self._depths(queues, config.sender_dead_letters + 1)

        snap = await alarms.snapshot(self.services.state, self.now, config, depths)
        return await alarms.run(self.services.state, config, snap)

    async def _per_app(self) -> dict[str, dict[str, int]]:
        """Each submitting app's Pending and Processing orders, by key (apps.KeyFilter)."""
        names, state = self.apps.names, self.services.state
        counts = await asyncio.gather(
            *(state.count_in_state(s, keys=self.apps.keys_of(a)) for a in names for s in PER_APP_STATES)
        )
        per_app = iter(counts)
        return {a: {s.value: next(per_app) for s in PER_APP_STATES} for a in names}

    async def _depths(self, queues: Sequence[str], cap: int) -> list[dict[str, Any]]:
        counts = self.services.queue_counts
        if counts is not None:
            found = await counts.dead_letter_depths(queues)
            return [found[q] for q in queues]
        return list(await asyncio.gather(*(self._depth(q, cap) for q in queues)))

    async def _depth(self, queue: str, cap: int) -> dict[str, Any]:
        if self.listens is not None and queue not in self.listens(self.services.tunables):
            return {"error": NOT_LISTENED.format(queue=queue)}
        return await _depth_or_error(self.services.bus, queue, cap)

    async def _breakers(self) -> list[dict[str, Any]]:
        if self.services.breakers is None:
            return []
        names = list(self.breaker_services or (self.services.tunables.remote_service,))
        return await show_breakers(names, self.services.breakers, BreakerConfig.from_env(), self.services.clock)


async def _depth_or_error(bus: BusClient, queue: str, cap: int) -> dict[str, Any]:
    try:
        return (await deadletters.depth(bus, queue, cap)).to_json()
    except Exception as exc:  # noqa: BLE001 - one unreadable queue must not hide the others
        return {"error": f"{type(exc).__name__}: {first_line(exc)}"}


def _due(rec: OrderStateRecord, now: datetime) -> bool:
    return rec.retry_at is None or rec.retry_at <= now


def _cancel_answer(rec: OrderStateRecord, known: SubmittingApps, *, already: bool) -> dict[str, Any]:
    """The cancel route's answer; `messageId` stays null (no message is sent)."""
    at = rec.cancel_requested_at
    return {
        **identity(rec, known),
        "processState": rec.process_state.value,
        "messageId": None,
        "cancelRequestedAt": None if at is None else format_utc(at),
        "alreadyRequested": already,
    }


def _supervisor(data: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    last = dict(data.get("lastRun") or {})
    at = last.get("at")
    return {
        "position": data.get("position"),
        "lastRun": last or None,
        "lastRunAgeSeconds": None if at is None else _age(now, parse_utc(at)),
    }


def cancel_reason(by: str, reason: str | None) -> str:
    """The record's cancelReason for an operator's cancel: who, and why when given (at most 256 characters, the
    CancelOrder's bound; the reason is cut, never the name)."""
    head = f"cancelled by {by.strip()[:200]}"
    return head if not reason or not reason.strip() else f"{head}: {reason.strip()}"[:256]


def cancel_body(order_id: str, reply_to: str, reason: str | None = None, requested_at: datetime | None = None) -> str:
    """A CancelOrder's JSON body (validated: ValueError on an invalid orderId, replyTo or reason)."""
    return CancelOrder(
        order_id=order_id, reply_to=reply_to, reason=reason, requested_at=requested_at or datetime.now(UTC)
    ).to_json()


def cancel_message(
    order_id: str, reply_to: str, reason: str | None = None, requested_at: datetime | None = None
) -> ServiceBusMessage:
    """A CancelOrder as a client sends it on its app's inbound queue (`apps.inbound_queue`; `order_id` is the app's own
    orderId, apps.client_order_id): SessionId = orderId (after the order's SubmitOrder), MessageId =
    `<orderId>:cancel:<hash of the body>` (each cancel is its own message; an identical resend is absorbed by duplicate
    detection)."""
    body = cancel_body(order_id, reply_to, reason, requested_at)
    message_id = f"{order_id}:cancel:{hashlib.sha256(body.encode()).hexdigest()[:12]}"
    return ServiceBusMessage(body, session_id=order_id, message_id=message_id, content_type="application/json")
