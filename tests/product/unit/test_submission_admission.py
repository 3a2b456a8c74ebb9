"""Admission control on the submission path (orderflow/submission.py, triggers/submission.py; issue 11): past
MaxPendingOrders a NEW order is answered `rejected` / `backlog full` on the app's reply queue and nothing is written;
an order already stored is never refused; the trigger completes a refused message (a decision, not poison).

On the embedded store and broker (tests/support/integration_support.py's in-process deployment, FakeClock). The
backlog figure is the `admission` document the Starter refreshes (orderflow/admission.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from support.integration_support import (
    REPLY_QUEUE,
    MetricPoints,
    Pipeline,
    RecordingStartNew,
    counter_value,
    encode,
    open_pipeline,
    order_body,
)

from orderflow import admission, runtime
from orderflow import function_names as fn
from orderflow.adapters import bus_from_connection_string
from orderflow.admission import BACKLOG_FULL, Figures
from orderflow.apps import SubmittingApps
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.messages import OrderStatus
from orderflow.records import ProcessState, format_utc
from orderflow.submission import Accepted, Refused, Rejected, submit

ORDERS_QUEUE = "orders-inbound"
BOUND = 3


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    p = await open_pipeline(tmp_path)
    apps = replace(p.services.tunables.apps, max_pending=BOUND)
    p.services = replace(p.services, tunables=replace(p.services.tunables, apps=apps))
    yield p
    await p.aclose()


async def set_backlog(p: Pipeline, pending: int) -> None:
    """What the Starter's refresh writes: the Pending figure, refreshed now."""
    found = await p.services.state.get_checkpoint(admission.DOCUMENT)
    figures = Figures(processing=0, pending=pending, refreshed_at=format_utc(p.clock.now()))
    await p.services.state.put_checkpoint(admission.DOCUMENT, figures.to_data(), None if found is None else found[1])


async def status_ids(p: Pipeline, order_id: str) -> list[str]:
    async with p.services.bus.get_queue_receiver(REPLY_QUEUE, session_id=order_id) as receiver:
        return [str(m.message_id) for m in await receiver.peek_messages(max_message_count=100)]


async def assert_nothing_stored(p: Pipeline, order_id: str) -> None:
    assert await p.services.orders.get(order_id) is None
    assert await p.services.state.get(order_id) is None


async def test_a_new_order_past_the_bound_is_rejected_and_nothing_is_written(
    pipeline: Pipeline, metric_points: MetricPoints
) -> None:
    await set_backlog(pipeline, BOUND)
    rejected_before = counter_value(metric_points, "orderflow.admission.rejected", reason=BACKLOG_FULL)

    outcome = await submit(pipeline.services, encode(order_body("o-new")), "o-new", "m-1", 42)

    assert isinstance(outcome, Refused) and outcome.reason == BACKLOG_FULL == "backlog full"
    assert outcome.order.order_id == "o-new"
    [status] = await pipeline.statuses("o-new")
    assert (status.order_id, status.state, status.reason, status.attempt) == (
        "o-new",
        OrderStatus.REJECTED,
        "backlog full",
        0,
    )
    assert await status_ids(pipeline, "o-new") == ["o-new:rejected:42"]  # names the delivery (its SequenceNumber)
    await assert_nothing_stored(pipeline, "o-new")
    assert await pipeline.alerts() == []  # a decision, not an operator's problem
    assert counter_value(metric_points, "orderflow.admission.rejected", reason=BACKLOG_FULL) == rejected_before + 1


async def test_each_refused_delivery_is_answered(pipeline: Pipeline) -> None:
    """A client that resubmits while the backlog is still full (a new MessageId, a new SequenceNumber) is answered
    again: the status MessageId names the delivery, so duplicate detection on the reply queue does not drop it."""
    await set_backlog(pipeline, BOUND + 10)
    assert isinstance(await submit(pipeline.services, encode(order_body("o-1")), "o-1", "m-1", 7), Refused)
    assert isinstance(await submit(pipeline.services, encode(order_body("o-1")), "o-1", "m-2", 8), Refused)
    assert await status_ids(pipeline, "o-1") == ["o-1:rejected:7", "o-1:rejected:8"]
    await assert_nothing_stored(pipeline, "o-1")


async def test_an_order_already_stored_is_never_refused(pipeline: Pipeline) -> None:
    assert isinstance(await submit(pipeline.services, encode(order_body("o-old")), "o-old"), Accepted)
    await set_backlog(pipeline, BOUND + 100)
    pipeline.clock.advance(2)  # past the gate's cache: it sees the full backlog

    again = await submit(pipeline.services, encode(order_body("o-old")), "o-old", "m-again", 9)
    refused = await submit(pipeline.services, encode(order_body("o-other")), "o-other", "m-x", 10)

    assert isinstance(again, Accepted) and not again.created  # a resubmission: answered as before
    assert [s.state for s in await pipeline.statuses("o-old")] == [OrderStatus.RECEIVED]
    assert isinstance(refused, Refused)  # the backlog is indeed full for a new order


async def test_an_order_whose_state_record_exists_is_accepted_when_full(pipeline: Pipeline) -> None:
    """A finished order resubmitted past the bound still gets its terminal status, not `rejected`."""
    assert isinstance(await submit(pipeline.services, encode(order_body("o-done")), "o-done"), Accepted)
    await pipeline.services.state.update_with_retry(
        "o-done", lambda r: r.model_copy(update={"process_state": ProcessState.PROCESSED})
    )
    await set_backlog(pipeline, BOUND)
    pipeline.clock.advance(2)

    outcome = await submit(pipeline.services, encode(order_body("o-done")), "o-done", "m-late", 11)

    assert isinstance(outcome, Accepted)
    assert OrderStatus.REJECTED not in [s.state for s in await pipeline.statuses("o-done")]


async def test_below_the_bound_orders_are_accepted_and_counted_until_it(pipeline: Pipeline) -> None:
    await set_backlog(pipeline, BOUND - 2)

    first = await submit(pipeline.services, encode(order_body("o-a")), "o-a", "m-a", 1)
    second = await submit(pipeline.services, encode(order_body("o-b")), "o-b", "m-b", 2)
    third = await submit(pipeline.services, encode(order_body("o-c")), "o-c", "m-c", 3)

    assert isinstance(first, Accepted) and first.created and isinstance(second, Accepted)
    assert (await pipeline.services.state.get("o-a")) is not None
    assert isinstance(third, Refused)  # 1 in the figure + this process's 2 acceptances since = the bound
    await assert_nothing_stored(pipeline, "o-c")

    pipeline.clock.advance(1)
    await set_backlog(pipeline, 0)  # the Starter claimed the backlog: a new figure
    pipeline.clock.advance(1)
    assert isinstance(await submit(pipeline.services, encode(order_body("o-c")), "o-c", "m-c2", 4), Accepted)
    assert [s.state for s in await pipeline.statuses("o-c")] == [OrderStatus.REJECTED, OrderStatus.RECEIVED]


async def test_an_invalid_order_is_still_rejected_as_poison_when_full(pipeline: Pipeline) -> None:
    await set_backlog(pipeline, BOUND)
    outcome = await submit(pipeline.services, encode(order_body("o-bad", quantity=0)), "o-bad", "m-bad", 5)
    assert isinstance(outcome, Rejected)  # validation comes first: dead-lettered with a reason, as before


# Through the trigger (triggers/submission.py): the real function, a message received from the embedded broker's
# orders-inbound, and ServiceBusMessageActions settling it on that broker.


class BrokerMessageActions:
    """The binding's ServiceBusMessageActions (blocking calls), settling through the receiver that received it."""

    def __init__(self, receiver: Any) -> None:
        self.receiver = receiver
        self.calls: list[str] = []

    def complete(self, message: Any) -> None:
        self.calls.append("complete")
        self.receiver.complete_message(message)

    def abandon(self, message: Any) -> None:
        self.calls.append("abandon")
        self.receiver.abandon_message(message)

    def deadletter(
        self, message: Any, deadletter_reason: str | None = None, deadletter_error_description: str | None = None
    ) -> None:
        self.calls.append("deadletter")
        self.receiver.dead_letter_message(
            message, reason=deadletter_reason, error_description=deadletter_error_description
        )


class FakeDurableClient:
    def __init__(self) -> None:
        self.start_new = RecordingStartNew()


@pytest.fixture(scope="module")
def submission_function() -> Any:
    """The trigger's code as the worker calls it, from its blueprint (`app.get_functions()` may be called once per
    app), under the Durable client middleware (which builds the client from the binding's JSON)."""
    import triggers.submission

    builder = triggers.submission.submission
    assert builder._function.get_function_name() == fn.SUBMISSION
    return builder._function.get_user_function().__wrapped__


async def deliver(
    p: Pipeline, function: Any, order_id: str, message_id: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], FakeDurableClient]:
    """Send the order to orders-inbound, receive it (peek-lock, its session) and run the trigger on it."""
    monkeypatch.setattr(runtime, "_services", {})  # the original is restored after the test
    runtime.use_services(p.services)  # what the trigger's get_services() returns on this loop
    client = bus_from_connection_string(p.bus_connection)
    try:
        with client.get_queue_sender(ORDERS_QUEUE) as sender:
            sender.send_messages(
                ServiceBusMessage(encode(order_body(order_id)), message_id=message_id, session_id=order_id)
            )
        receiver = client.get_queue_receiver(ORDERS_QUEUE, session_id=order_id)
        try:
            [message] = await asyncio.to_thread(receiver.receive_messages, 1, 5)
            actions, durable = BrokerMessageActions(receiver), FakeDurableClient()
            await function(message=message, message_actions=actions, client=durable)
        finally:
            receiver.close()
    finally:
        client.close()
    return actions.calls, durable


def bus_path(p: Pipeline) -> str:
    return str(p.bus_connection.split("embedded://", 1)[1].split(";", 1)[0])


async def test_the_trigger_completes_a_refused_message(
    pipeline: Pipeline, submission_function: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await set_backlog(pipeline, BOUND)

    calls, durable = await deliver(pipeline, submission_function, "o-flood", "m-flood", monkeypatch)

    assert calls == ["complete"]  # not dead-lettered, not abandoned
    counts = EmbeddedBroker(bus_path(pipeline)).counts(ORDERS_QUEUE)
    assert (counts.active, counts.dead_lettered, counts.locked, counts.deferred) == (0, 0, 0, 0)  # gone
    assert durable.start_new.calls == []  # nothing to start
    [status] = await pipeline.statuses("o-flood")
    assert (status.state, status.reason) == (OrderStatus.REJECTED, "backlog full")
    await assert_nothing_stored(pipeline, "o-flood")


async def test_the_trigger_accepts_and_starts_below_the_bound(
    pipeline: Pipeline, submission_function: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await set_backlog(pipeline, 0)

    calls, durable = await deliver(pipeline, submission_function, "o-fine", "m-fine", monkeypatch)

    assert calls == ["complete"]
    assert durable.start_new.instances == ["o-fine:1"]  # the fast path
    counts = EmbeddedBroker(bus_path(pipeline)).counts(ORDERS_QUEUE)
    assert (counts.active, counts.dead_lettered) == (0, 0)
    assert [s.state for s in await pipeline.statuses("o-fine")] == [OrderStatus.RECEIVED]


async def test_the_trigger_leaves_a_pending_order_to_the_starter_while_another_app_waits(
    pipeline: Pipeline, submission_function: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25, fair share: while another app's orders wait in Pending, a new order of this app is neither claimed at
    creation nor by the fast path's `start_one` after it: it waits for the Starter's round-robin (a slot is free)."""
    apps = SubmittingApps(names=("app", "partner"), legacy="app", max_pending=BOUND)
    pipeline.services = replace(pipeline.services, tunables=replace(pipeline.services.tunables, apps=apps))
    found = await pipeline.services.state.get_checkpoint(admission.DOCUMENT)
    figures = Figures(0, 2, format_utc(pipeline.clock.now()), pending_by_app={"app": 0, "partner": 2})
    await pipeline.services.state.put_checkpoint(
        admission.DOCUMENT, figures.to_data(), None if found is None else found[1]
    )

    calls, durable = await deliver(pipeline, submission_function, "o-wait", "m-wait", monkeypatch)

    assert calls == ["complete"] and durable.start_new.instances == []
    assert (await pipeline.services.state.get("o-wait"))[0].process_state is ProcessState.PENDING  # type: ignore[index]
