"""One request from receipt to settlement: poison → alert + dead-letter, deadline, reply before complete."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from support.agent_fakes import (
    ALERTS,
    REPLIES,
    REQUESTS,
    START,
    FakeBus,
    FakeClock,
    FakeMessage,
    agent_config,
    make_request,
    raw_message,
    request_message,
)

from agent.errors import Classification, ErrorCode
from agent.handler import Disposition, Outbox, RequestHandler
from agent.remote import CallResult
from agent.request_parsing import message_body
from orderflow.messages import AgentReply, OperatorAlert, StepName


@dataclass
class RecordingCaller:
    results: list[CallResult]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        self.calls.append((step, body))
        return self.results[min(len(self.calls), len(self.results)) - 1]


OK = CallResult(Classification.SUCCESS, 200, {"confirmation": "reserve-1"})


async def received(bus: FakeBus, message: Any) -> tuple[Any, FakeMessage]:
    await bus.send(REQUESTS, message)
    receiver = bus.get_queue_receiver(REQUESTS, max_wait_time=0.1)
    await receiver.__aenter__()
    [msg] = await receiver.receive_messages(1, 0.1)
    return receiver, msg


def handler_for(bus: FakeBus, clock: FakeClock, caller: RecordingCaller) -> RequestHandler:
    outbox = Outbox(bus.get_queue_sender(REPLIES), bus.get_queue_sender(ALERTS), REPLIES, REQUESTS)
    return RequestHandler(caller, outbox, agent_config().retry_policy(), clock)


async def test_success_replies_then_completes(bus: FakeBus, clock: FakeClock) -> None:
    caller = RecordingCaller([OK])
    request = make_request(step=StepName.RESERVE_INVENTORY)
    receiver, msg = await received(bus, request_message(request))
    assert await handler_for(bus, clock, caller).handle(receiver, msg) is Disposition.SUCCEEDED
    [reply_msg] = bus.queue(REPLIES).active
    reply = AgentReply.model_validate_json(reply_msg.raw)
    assert reply.outcome == "succeeded" and reply.result == {"confirmation": "reserve-1"}
    assert (reply.instance_id, reply.attempt, reply.step) == ("order-1:1", 1, StepName.RESERVE_INVENTORY)
    assert reply_msg.session_id == "order-1" and reply_msg.message_id == "order-1:1:reserve-inventory:reply"
    assert bus.events[-2:] == [
        f"send:{REPLIES}:order-1:1:reserve-inventory:reply",
        f"complete:{REQUESTS}:order-1:1:reserve-inventory",
    ]
    assert caller.calls == [
        (
            "reserve-inventory",
            {"orderId": "order-1", "idempotencyKey": "order-1:reserve-inventory", "payload": {"items": 2}},
        )
    ]


async def test_no_complete_when_the_reply_cannot_be_sent_before_the_deadline(bus: FakeBus, clock: FakeClock) -> None:
    receiver, msg = await received(bus, request_message(make_request()))
    bus.send_failures[REPLIES] = 1000  # the bus stays down past the request's deadline (30 s)
    with pytest.raises(ConnectionError):
        await handler_for(bus, clock, RecordingCaller([OK])).handle(receiver, msg)
    assert not any(e.startswith("complete:") for e in bus.events)
    assert bus.queue(REQUESTS).active == [msg]
    assert clock.now() <= START + timedelta(seconds=30)  # no try after the deadline: the reply is of no use then


async def test_a_bus_outage_is_waited_out_without_giving_the_request_back(bus: FakeBus, clock: FakeClock) -> None:
    """Issue 24 (the bus-outage drill): a reply the bus refuses for a while is sent again in place, with waits
    doubling from 0.5 s, until the deadline. Before, the handler raised at once: the worker abandoned the request, and
    each redelivery cost a delivery (agent-requests' MaxDeliveryCount 5 dead-letters it) and a second remote call."""
    caller = RecordingCaller([OK])
    receiver, msg = await received(bus, request_message(make_request()))
    bus.send_failures[REPLIES] = 3
    assert await handler_for(bus, clock, caller).handle(receiver, msg) is Disposition.SUCCEEDED
    assert clock.sleeps[-3:] == [0.5, 1.0, 2.0]
    assert len(caller.calls) == 1 and len(bus.queue(REPLIES).active) == 1
    assert bus.queue(REQUESTS).completed == [msg]
    assert not any(e.startswith("abandon:") for e in bus.events)


async def test_deadline_already_passed_replies_failed_without_calling(bus: FakeBus, clock: FakeClock) -> None:
    caller = RecordingCaller([OK])
    receiver, msg = await received(bus, request_message(make_request(deadline=START - timedelta(seconds=1))))
    assert await handler_for(bus, clock, caller).handle(receiver, msg) is Disposition.FAILED
    reply = AgentReply.model_validate_json(bus.queue(REPLIES).active[0].raw)
    assert caller.calls == []
    assert reply.outcome == "failed" and reply.error_code == ErrorCode.DEADLINE_EXCEEDED and not reply.permanent
    assert bus.queue(REQUESTS).completed == [msg]


async def test_permanent_failure_replies_failed_permanent(bus: FakeBus, clock: FakeClock) -> None:
    rejected = CallResult(Classification.PERMANENT, 422, {"errorCode": "PaymentDeclined"}, error="HTTP 422")
    receiver, msg = await received(bus, request_message(make_request(step=StepName.CHARGE_PAYMENT)))
    await handler_for(bus, clock, RecordingCaller([rejected])).handle(receiver, msg)
    reply = AgentReply.model_validate_json(bus.queue(REPLIES).active[0].raw)
    assert reply.outcome == "failed" and reply.permanent and reply.error_code == "PaymentDeclined"


def _valid() -> dict[str, Any]:
    return json.loads(make_request().to_json())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "InvalidJson"),
        ("[1, 2]", "InvalidJson"),
        (json.dumps({**_valid(), "type": "SubmitOrder"}), "UnknownType"),
        (json.dumps({**_valid(), "schemaVersion": 3}), "UnsupportedSchemaVersion"),
        (json.dumps({k: v for k, v in _valid().items() if k != "step"}), "InvalidField:step"),
        (json.dumps({**_valid(), "step": "teleport"}), "InvalidField:step"),
        (json.dumps({**_valid(), "deadline": "soon"}), "InvalidField:deadline"),
        (json.dumps({**_valid(), "deadline": "2030-01-01T00:00:30"}), "InvalidField:deadline"),
        (json.dumps({**_valid(), "attempt": 0}), "InvalidField:attempt"),
        (
            json.dumps({**_valid(), "idempotencyKey": "order-1:1:reserve-inventory"}),
            "InvalidField:idempotencyKey",
        ),
        (json.dumps({**_valid(), "replyTo": "somewhere-else"}), "InvalidField:replyTo"),
        (json.dumps({**_valid(), "surprise": 1}), "InvalidField:surprise"),
    ],
)
async def test_poison_request_is_dead_lettered_with_an_alert(
    bus: FakeBus, clock: FakeClock, body: str, reason: str
) -> None:
    caller = RecordingCaller([OK])
    receiver, msg = await received(bus, raw_message(body))
    assert await handler_for(bus, clock, caller).handle(receiver, msg) is Disposition.DEAD_LETTERED
    assert bus.queue(REQUESTS).dead == [msg] and msg.dead_letter_reason == reason
    assert msg.dead_letter_error_description
    [alert_msg] = bus.queue(ALERTS).active
    alert = OperatorAlert.model_validate_json(alert_msg.raw)
    assert (alert.kind, alert.reason, alert.order_id) == ("PoisonMessage", reason, "order-1")
    assert alert.details["messageId"] == "poison-1" and alert.details["queue"] == REQUESTS
    assert alert.details["sessionId"] == msg.session_id  # the exact ids of the request the alert is about
    assert alert_msg.message_id == alert.message_id()  # unique per source message (OperatorAlert.message_id)
    assert caller.calls == [] and bus.queue(REPLIES).active == []
    assert bus.events.index(f"send:{ALERTS}:{alert_msg.message_id}") < bus.events.index(
        f"dead-letter:{REQUESTS}:poison-1"
    )  # alert first: a crash in between re-sends it (deduplicated)


async def test_two_poison_requests_of_one_order_raise_two_alerts(bus: FakeBus, clock: FakeClock) -> None:
    """An alert's MessageId is unique per source message: operator-alerts could get duplicate detection one day,
    and two poisoned requests of the same order with the same reason must then still raise two alerts."""
    handler = handler_for(bus, clock, RecordingCaller([]))
    await bus.send(REQUESTS, raw_message("{not json", message_id="poison-1"))
    receiver, first_msg = await received(bus, raw_message("{not json", message_id="poison-2"))
    [second_msg] = await receiver.receive_messages(1, 0.1)
    for msg in (first_msg, second_msg):
        assert await handler.handle(receiver, msg) is Disposition.DEAD_LETTERED
    first, second = bus.queue(ALERTS).active
    assert first.message_id != second.message_id
    assert [OperatorAlert.model_validate_json(m.raw).details["messageId"] for m in (first, second)] == [
        "poison-1",
        "poison-2",
    ]


async def test_request_in_another_session_is_poison(bus: FakeBus, clock: FakeClock) -> None:
    message = raw_message(make_request(order_id="order-2").to_json(), session_id="order-1")
    receiver, msg = await received(bus, message)
    assert await handler_for(bus, clock, RecordingCaller([OK])).handle(receiver, msg) is Disposition.DEAD_LETTERED
    assert msg.dead_letter_reason == "InvalidField:orderId"


def test_message_body_reads_sdk_data_bodies() -> None:
    @dataclass
    class Msg:
        body: Any

    assert message_body(Msg(iter([b"ab", b"c"]))) == b"abc"  # azure-servicebus: data body = iterable of bytes
    assert message_body(Msg(b"xyz")) == b"xyz"
    assert message_body(Msg("txt")) == b"txt"


def test_a_non_data_body_is_poison() -> None:
    from orderflow.messages import InvalidMessage

    @dataclass
    class Msg:
        body: Any

    with pytest.raises(InvalidMessage) as err:
        message_body(Msg(42))  # an AMQP value body, not data
    assert err.value.reason == "InvalidBody"


@pytest.mark.parametrize(("allowed", "calls"), [(0, 1), (1, 2), (None, 5), (99, 5)])
async def test_the_requests_retry_allowance_caps_the_agents_own_limit(
    bus: FakeBus, clock: FakeClock, allowed: int | None, calls: int
) -> None:
    # Seed 000/001, Scheduling: the request carries CompleteBy and the allowed number of retries. The Agent's own
    # limit (agent_config: 4 retries → 5 calls) applies when the request allows more or says nothing.
    busy = CallResult(Classification.TRANSIENT, 503, {}, error="HTTP 503")
    caller = RecordingCaller([busy])
    receiver, msg = await received(bus, request_message(make_request(max_retries=allowed)))
    assert await handler_for(bus, clock, caller).handle(receiver, msg) is Disposition.FAILED
    assert len(caller.calls) == calls
