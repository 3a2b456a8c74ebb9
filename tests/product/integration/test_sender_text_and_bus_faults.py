"""Integration: hostile sender text and bus failures on the submission path, through the real submission trigger.

- A poison message is dead-lettered with a reason and a description within 4,096 characters (the limit of the Service
  Bus SDK the host settles with: Azure.Messaging.ServiceBus ServiceBusReceiver.DeadLetterMessageAsync,
  ArgumentOutOfRangeException; Azure/azure-sdk-for-net PR #32396), and its operator alert is sent, within the
  queue's message size (256 KB on Standard: learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas).
- Deeply nested JSON is dead-lettered `InvalidJson` with an alert, not abandoned until MaxDeliveryCountExceeded.
- Log lines quote a sender's MessageId and reason escaped: a newline cannot forge a line.
- A bus that is busy, timed out or disconnected while the submission sends a status or an alert (or while the store
  is written) is waited out inside the delivery, as a store outage is (orderflow/submission.py, receive_patiently).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
)
from support.bus_scenarios import put_token_refused
from support.integration_support import (
    ALERTS_QUEUE,
    REPLY_QUEUE,
    Pipeline,
    encode,
    order_body,
)
from support.submission_trigger import RecordingActions, run_submission_trigger

from orderflow import admission
from orderflow.embedded._core import MAX_MESSAGE_SIZE_BYTES
from orderflow.messages import AlertKind, OrderStatus
from orderflow.runtime import Services
from orderflow.submission import Accepted, Rejected, receive_patiently

BIG = 204_800
FORGING_ID = "m-1\nINFO orderflow.submission: order o-x accepted\x1b[2K[/]"


async def deliver(p: Pipeline, body: bytes, session_id: str, message_id: str) -> RecordingActions:
    return (await run_submission_trigger(p, body, session_id, message_id)).actions


async def alert_bodies(p: Pipeline) -> list[bytes]:
    async with p.services.bus.get_queue_receiver(ALERTS_QUEUE) as receiver:
        return [b"".join(m.body) for m in await receiver.peek_messages(max_message_count=100)]


async def test_a_huge_field_name_is_dead_lettered_with_a_bounded_reason_and_alerted(pipeline: Pipeline) -> None:
    body = encode({**order_body("o-big"), "a" * BIG: 1})
    actions = await deliver(pipeline, body, "o-big", "m-big")
    [(settled, kwargs)] = actions.calls
    assert settled == "deadletter"
    assert (
        kwargs["deadletter_reason"].startswith("InvalidField:aaa")
        and f"({BIG} characters)" in kwargs["deadletter_error_description"]
    )
    [alert] = await alert_bodies(pipeline)
    assert len(alert) < 16 * 1024 < MAX_MESSAGE_SIZE_BYTES
    sent = json.loads(alert)
    assert sent["kind"] == AlertKind.POISON_MESSAGE.value and sent["reason"] == kwargs["deadletter_reason"]
    assert sent["details"]["messageId"] == "m-big"


async def test_deeply_nested_json_is_dead_lettered_invalid_json_with_an_alert(pipeline: Pipeline) -> None:
    actions = await deliver(pipeline, b"[" * 100_000 + b"]" * 100_000, "s-deep", "m-deep")
    assert actions.calls == [
        (
            "deadletter",
            {"deadletter_reason": "InvalidJson", "deadletter_error_description": "body is nested too deeply to parse"},
        )
    ]
    [alert] = await alert_bodies(pipeline)
    assert json.loads(alert)["reason"] == "InvalidJson"


async def test_a_message_id_with_a_newline_cannot_forge_a_log_line(
    pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    body = encode({**order_body("o-log"), "x\nERROR forged": 1})
    with caplog.at_level(logging.INFO):
        actions = await deliver(pipeline, body, "o-log", FORGING_ID)
    assert [c[0] for c in actions.calls] == ["deadletter"]
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("orderflow")]
    assert any("dead-lettering message" in line for line in lines)
    assert all("\n" not in line and "\x1b" not in line for line in lines), lines


# ---- bus failures are waited out inside the delivery --------------------------------------------------------------


class FlakyBus:
    """The bus, whose first `failures` sends to `queue` raise `error`."""

    def __init__(self, inner: Any, queue: str, error: ServiceBusError, failures: int) -> None:
        self._inner, self.queue, self.error, self.failures = inner, queue, error, failures

    def get_queue_sender(self, queue: str, **kwargs: Any) -> Any:
        sender = self._inner.get_queue_sender(queue, **kwargs)
        if queue != self.queue:
            return sender
        bus = self

        class Sender:
            async def __aenter__(self) -> Any:
                self.inner = await sender.__aenter__()
                return self

            async def __aexit__(self, *exc: object) -> None:
                await sender.__aexit__(*exc)

            async def send_messages(self, message: Any, **kw: Any) -> None:
                if bus.failures > 0:
                    bus.failures -= 1
                    raise bus.error
                await self.inner.send_messages(message, **kw)

        return Sender()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FlakyState:
    """The state store, whose first `failures` creates raise `error`."""

    def __init__(self, inner: Any, error: Exception, failures: int) -> None:
        self._inner, self.error, self.failures = inner, error, failures

    async def create_if_absent(self, rec: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return await self._inner.create_if_absent(rec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


BUS_ERRORS = [
    ServiceBusServerBusyError(message="server busy"),
    OperationTimeoutError(message="timed out"),
    ServiceBusConnectionError(message="connection lost"),
    ServiceBusCommunicationError(message="no route"),
]


def _services(p: Pipeline, *, bus: Any = None, state: Any = None) -> Services:
    s = p.services
    return Services(orders=s.orders, state=state or s.state, bus=bus or s.bus, tunables=s.tunables, clock=s.clock)


def _sleeper(p: Pipeline, waits: list[float]) -> Any:
    async def sleep(seconds: float) -> None:  # the clock moves as the wait would
        waits.append(seconds)
        p.clock.advance(seconds)

    return sleep


@pytest.mark.parametrize("error", BUS_ERRORS, ids=lambda e: type(e).__name__)
async def test_a_status_send_failing_on_a_bus_transient_error_is_retried_inside_the_delivery(
    pipeline: Pipeline, error: ServiceBusError
) -> None:
    waits: list[float] = []
    services = _services(pipeline, bus=FlakyBus(pipeline.services.bus, REPLY_QUEUE, error, failures=3))
    outcome = await receive_patiently(services, encode(order_body("o-st")), "o-st", sleep=_sleeper(pipeline, waits))
    assert isinstance(outcome, Accepted) and waits == [0.5, 1.0, 2.0]
    assert [s.state for s in await pipeline.statuses("o-st")] == [OrderStatus.RECEIVED]


@pytest.mark.parametrize("error", BUS_ERRORS, ids=lambda e: type(e).__name__)
async def test_an_alert_send_failing_on_a_bus_transient_error_is_retried_inside_the_delivery(
    pipeline: Pipeline, error: ServiceBusError
) -> None:
    waits: list[float] = []
    services = _services(pipeline, bus=FlakyBus(pipeline.services.bus, ALERTS_QUEUE, error, failures=2))
    outcome = await receive_patiently(services, b"not json", "s-al", "m-al", sleep=_sleeper(pipeline, waits))
    assert isinstance(outcome, Rejected) and outcome.reason == "InvalidJson" and waits == [0.5, 1.0]
    assert len(await alert_bodies(pipeline)) == 1


async def test_a_store_write_failing_on_a_bus_transient_error_is_retried_inside_the_delivery(
    pipeline: Pipeline,
) -> None:
    waits: list[float] = []
    state = FlakyState(pipeline.services.state, ServiceBusServerBusyError(message="server busy"), failures=2)
    outcome = await receive_patiently(
        _services(pipeline, state=state), encode(order_body("o-sw")), "o-sw", sleep=_sleeper(pipeline, waits)
    )
    assert isinstance(outcome, Accepted) and waits == [0.5, 1.0]
    assert await pipeline.services.state.get("o-sw") is not None


@pytest.mark.parametrize(
    "error",
    [
        MessagingEntityNotFoundError(message="no such queue"),
        # A missing queue as the real SDK raises it over AMQP: the put-token's 404 (orderflow/errors.py
        # is_missing_entity; tests/support/bus_scenarios.py entity_not_found).
        put_token_refused(404),
    ],
    ids=["entity-not-found", "put-token-404"],
)
async def test_a_missing_queue_gives_the_delivery_back_at_once(pipeline: Pipeline, error: ServiceBusError) -> None:
    waits: list[float] = []
    services = _services(pipeline, bus=FlakyBus(pipeline.services.bus, REPLY_QUEUE, error, failures=1))
    with pytest.raises(type(error)):
        await receive_patiently(services, encode(order_body("o-nf")), "o-nf", sleep=_sleeper(pipeline, waits))
    assert waits == []


async def test_a_refused_received_status_keeps_the_fast_path_claim_and_its_admission_slot(pipeline: Pipeline) -> None:
    """Issue 24 (the bus-outage drill): the `received` status is retried on its own, after the writes. Before, a bus
    refusing it made the whole submission run again: the retry found the record it had just created claimed for
    attempt 1, so it answered no claim (the trigger started no Scheduler: the order waited a claim lease for the
    Supervisor's restart, 60 s on Azure) and gave back the admission slot that record holds."""
    waits: list[float] = []
    busy = ServiceBusServerBusyError(message="server busy")
    services = _services(pipeline, bus=FlakyBus(pipeline.services.bus, REPLY_QUEUE, busy, failures=2))
    outcome = await receive_patiently(
        services, encode(order_body("o-fp")), "o-fp", claim=True, sleep=_sleeper(pipeline, waits)
    )
    assert isinstance(outcome, Accepted) and outcome.claimed is not None and outcome.claimed.attempt == 1
    assert waits == [0.5, 1.0]
    found = await pipeline.services.state.get("o-fp")
    assert found is not None and found[0].locked_by == "o-fp:1"
    await admission.flush(pipeline.services)
    assert (await admission.read_figures(pipeline.services))[0].processing == 1  # the slot stays with its record
    assert [s.state for s in await pipeline.statuses("o-fp")] == [OrderStatus.RECEIVED]
