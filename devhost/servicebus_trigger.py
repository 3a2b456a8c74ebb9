"""serviceBusTrigger on queues, with and without sessions, written against the azure-servicebus aio surface so it runs
on the embedded broker and on Azure Service Bus alike.

Semantics of the Functions Service Bus extension (functions-bindings-service-bus-trigger and host.json reference):
peek-lock, completed on success (autoCompleteMessages, the default) or settled by the function with
`auto_complete_messages=False`, and abandoned on an exception unless the function settled it, whatever
autoCompleteMessages says; a session locked by one consumer at a time, its messages in order, up to
`maxConcurrentSessions`, released after `sessionIdleTimeout`; without sessions up to `maxConcurrentCalls` at once; the
message or session lock renewed up to `maxAutoLockRenewalDuration` at half its remaining time (at once below 0.4 s),
a session lock also while the consumer waits for the session's next message. Details, sources: docs/modules-host.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import azure.functions as func
from azure.functions.meta import Datum
from azure.functions.servicebus import ServiceBusMessageInConverter
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusError,
    SessionLockLostError,
)

from orderflow.clock import SystemClock
from orderflow.clock import WaitingClock as Clock
from orderflow.session_locks import keep_lock_renewed

from .config import ServiceBusOptions

log = logging.getLogger("devhost.servicebus")

# How long one receive call waits before the loop re-checks for shutdown. The wait itself is woken by the broker's
# notification, so this bound costs nothing while idle.
RECEIVE_WAIT_S = 30.0


def _text(value: Any) -> Datum | None:
    return None if value is None else Datum(str(value), "string")


def _iso(value: datetime | None) -> Datum | None:
    return None if value is None else Datum(value.astimezone(UTC).isoformat(), "string")


def function_message(msg: Any) -> func.ServiceBusMessage:
    """Build the `func.ServiceBusMessage` the Python worker builds: the body Datum plus the trigger metadata the host
    sends (field names from azure/functions/servicebus.py ServiceBusMessageInConverter.decode_single_message)."""
    body = b"".join(msg.body) if not isinstance(msg.body, (bytes, bytearray)) else bytes(msg.body)
    props = {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (msg.application_properties or {}).items()
    }
    ttl = getattr(msg, "time_to_live", None)
    metadata = {
        "MessageId": _text(msg.message_id),
        "SessionId": _text(msg.session_id),
        "CorrelationId": _text(msg.correlation_id),
        "ReplyTo": _text(msg.reply_to),
        "Subject": _text(msg.subject),
        "Label": _text(msg.subject),
        "ContentType": _text(msg.content_type),
        # The host is .NET: its DeliveryCount starts at 1 on the first delivery, while the AMQP header (and so the
        # Python SDK's `delivery_count`, azure/servicebus/_common/message.py) counts prior attempts from 0.
        "DeliveryCount": Datum(int(msg.delivery_count or 0) + 1, "int"),
        "SequenceNumber": Datum(int(msg.sequence_number or 0), "int"),
        "EnqueuedTimeUtc": _iso(msg.enqueued_time_utc),
        "ScheduledEnqueueTimeUtc": _iso(getattr(msg, "scheduled_enqueue_time_utc", None)),
        "LockedUntil": _iso(getattr(msg, "locked_until_utc", None)),
        "LockToken": _text(getattr(msg, "lock_token", None)),
        "TimeToLive": _text(str(ttl) if ttl else None),
        "ApplicationProperties": Datum(json.dumps(props, default=str), "json"),
        "UserProperties": Datum(json.dumps(props, default=str), "json"),
        "DeadLetterReason": _text(getattr(msg, "dead_letter_reason", None)),
        "DeadLetterErrorDescription": _text(getattr(msg, "dead_letter_error_description", None)),
    }
    metadata = {k: v for k, v in metadata.items() if v is not None}
    return ServiceBusMessageInConverter.decode(Datum(body, "bytes"), trigger_metadata=metadata)


@dataclass
class Delivery:
    """A message handed to a function, with the receiver that holds its lock (for SDK-type settlement)."""

    message: Any
    receiver: Any
    settled: bool = False


class ServiceBusTriggerRunner:
    """Feeds one function from one queue. `invoke(delivery)` runs the function and raises if it failed."""

    def __init__(
        self,
        name: str,
        queue: str,
        *,
        client: Any,
        sessions: bool,
        auto_complete: bool,
        options: ServiceBusOptions,
        invoke: Callable[[Delivery], Awaitable[None]],
        on_delivery: Callable[[Delivery], None] | None = None,
        on_done: Callable[[Delivery], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.queue = queue
        self.client = client
        self.sessions = sessions
        self.auto_complete = auto_complete
        self.options = options
        self._invoke = invoke
        self._on_delivery = on_delivery or (lambda d: None)
        self._on_done = on_done or (lambda d: None)
        self.clock: Clock = clock or SystemClock()
        self.processed = 0
        self.failed = 0

    async def run(self, stop: asyncio.Event) -> None:
        count = self.options.max_concurrent_sessions if self.sessions else self.options.max_concurrent_calls
        loop = self._session_loop if self.sessions else self._plain_loop
        workers = [asyncio.create_task(loop(stop), name=f"sb:{self.name}:{i}") for i in range(max(1, count))]
        try:
            await stop.wait()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _plain_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with self.client.get_queue_receiver(self.queue) as receiver:
                    while not stop.is_set():
                        for msg in await receiver.receive_messages(max_message_count=1, max_wait_time=RECEIVE_WAIT_S):
                            await self._handle(receiver, msg)
            except asyncio.CancelledError:
                raise
            except ServiceBusError:
                log.exception("receiver for %s failed; reconnecting", self.queue)
                await asyncio.sleep(1.0)  # reconnect backoff after a broker error, not a polling interval

    async def _session_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                receiver = self.client.get_queue_receiver(
                    self.queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=RECEIVE_WAIT_S
                )
                async with receiver:
                    # The session lock is renewed for as long as the session is held, idle waits included.
                    session = receiver.session
                    renewer = asyncio.create_task(
                        self._renew_until(session.renew_lock, lambda s=session: s.locked_until_utc)
                    )
                    try:
                        while not stop.is_set():
                            batch = await receiver.receive_messages(
                                max_message_count=1, max_wait_time=self.options.session_idle_timeout_s
                            )
                            if not batch:
                                break  # session idle: release it so other consumers can take it
                            for msg in batch:
                                await self._handle(receiver, msg)
                    finally:
                        renewer.cancel()
                        await asyncio.gather(renewer, return_exceptions=True)
            except OperationTimeoutError:
                continue  # no session with messages within the wait: try again
            except asyncio.CancelledError:
                raise
            except ServiceBusError:
                log.exception("session receiver for %s failed; reconnecting", self.queue)
                await asyncio.sleep(1.0)

    async def _handle(self, receiver: Any, msg: Any) -> None:
        delivery = Delivery(message=msg, receiver=receiver)
        self._on_delivery(delivery)
        # Without sessions the message's own lock is renewed while the function has it; a session's messages are
        # locked by the session lock, which `_session_loop` renews.
        renewer = (
            None
            if self.sessions
            else asyncio.create_task(
                self._renew_until(lambda: receiver.renew_message_lock(msg), lambda: msg.locked_until_utc)
            )
        )
        try:
            await self._invoke(delivery)
        except Exception as exc:  # noqa: BLE001 - any failure of the function counts
            self.failed += 1
            log.warning(
                "function %s failed on message %s (delivery %s): %s", self.name, msg.message_id, msg.delivery_count, exc
            )
            # The processor abandons a failed message the function left unsettled, whatever autoCompleteMessages says
            # (Azure.Messaging.ServiceBus ReceiverManager.ProcessOneMessage; docs/modules-host.md).
            if not delivery.settled:
                await self._settle(receiver.abandon_message, msg)
        else:
            self.processed += 1
            if self.auto_complete and not delivery.settled:
                await self._settle(receiver.complete_message, msg)
        finally:
            if renewer is not None:
                renewer.cancel()
            self._on_done(delivery)

    async def _settle(self, action: Callable[[Any], Awaitable[None]], msg: Any) -> None:
        try:
            await action(msg)
        except ServiceBusError as exc:  # lock lost: the broker redelivers; at-least-once
            log.warning("could not settle message %s on %s: %s", msg.message_id, self.queue, exc)

    async def _renew_until(
        self, renew: Callable[[], Awaitable[Any]], locked_until: Callable[[], datetime | None]
    ) -> None:
        """Renew a lock until cancelled, for at most maxAutoLockRenewalDuration (orderflow.session_locks)."""
        await keep_lock_renewed(
            renew,
            locked_until,
            self.clock,
            lost=(MessageLockLostError, SessionLockLostError),
            transient=(ServiceBusError,),
            log=log,
            what=f"a message or session on {self.queue}",
            max_duration_s=self.options.max_auto_lock_renewal_s,
        )
