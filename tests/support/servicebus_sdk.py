"""Test doubles for devhost's SDK-type Service Bus binding (tests/host/sdk): a broker message, a recording receiver
and session, a host event loop on its own thread (as devhost's loop is to the gRPC threads), and a registered
delivery."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from devhost.sdk_servicebus import DeliveryRegistry
from devhost.servicebus_trigger import Delivery

NOW = datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)


@dataclass
class BrokerMessage:
    """The received-message surface of our broker client that devhost reads (orderflow/embedded/message.py)."""

    body: Any = b"hello"
    message_id: str = "m-1"
    session_id: str | None = None
    correlation_id: str | None = "corr-1"
    reply_to: str | None = "replies"
    reply_to_session_id: str | None = None
    subject: str | None = "order.submitted"
    content_type: str | None = "application/json"
    to: str | None = None
    application_properties: dict[Any, Any] | None = field(default_factory=lambda: {"tenant": "contoso", "n": 7})
    delivery_count: int = 2
    enqueued_time_utc: datetime | None = NOW
    sequence_number: int | None = 42
    lock_token: str | None = field(default_factory=lambda: str(uuid.uuid4()))
    locked_until_utc: datetime | None = NOW + timedelta(minutes=1)
    time_to_live: timedelta | None = timedelta(hours=1)
    scheduled_enqueue_time_utc: datetime | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None


class FakeSession:
    """The aio session surface (`receiver.session`) the Settlement service uses."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.state: bytes | None = None
        self.locked_until_utc = NOW + timedelta(minutes=5)

    async def get_state(self) -> bytes | None:
        return self.state

    async def set_state(self, state: bytes) -> None:
        self.state = state

    async def renew_lock(self) -> datetime:
        self.locked_until_utc += timedelta(minutes=5)
        return self.locked_until_utc


class RecordingReceiver:
    """Records each settlement call and the thread it ran on; `fail_with` makes the next call raise."""

    def __init__(self, session_id: str | None = None) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.threads: set[int] = set()
        self.fail_with: Exception | None = None
        self.session = FakeSession(session_id) if session_id else None

    async def _record(self, name: str, message: Any, **kwargs: Any) -> None:
        self.threads.add(threading.get_ident())
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append((name, message, kwargs))

    async def complete_message(self, message: Any) -> None:
        await self._record("complete", message)

    async def abandon_message(self, message: Any) -> None:
        await self._record("abandon", message)

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        await self._record("dead_letter", message, reason=reason, error_description=error_description)

    async def defer_message(self, message: Any) -> None:
        await self._record("defer", message)

    async def renew_message_lock(self, message: Any) -> datetime:
        await self._record("renew", message)
        return NOW + timedelta(minutes=2)


class HostLoop:
    """An asyncio loop running on a background thread, like devhost's main loop seen from the gRPC threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="host-loop", daemon=True)

    def __enter__(self) -> HostLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)


def in_flight(
    registry: DeliveryRegistry, msg: BrokerMessage | None = None, receiver: RecordingReceiver | None = None
) -> Delivery:
    """Register a delivery the way the trigger runner's on_delivery hook does."""
    message = msg or BrokerMessage()
    delivery = Delivery(message=message, receiver=receiver or RecordingReceiver(message.session_id))
    registry.add(delivery)
    return delivery
