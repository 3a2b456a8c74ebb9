"""The agent_replies trigger (issue 8, item 2): every reply the Scheduler cannot use is completed with an operator alert
naming the field, never retried into the dead-letter queue; only a failure that may pass is raised for redelivery.

The trigger runs as the worker runs it: each reply is sent to the embedded broker's `agent-replies`, received, and
turned into the `func.ServiceBusMessage` the Python worker builds from the host's trigger metadata
(`devhost.servicebus_trigger.function_message`). `raise_event` is the real `DurableOrchestrationClient` against a
scripted HTTP server that answers as told and records every request, so "before any HTTP call" is observable and each
answer is read by the real SDK code (models/DurableOrchestrationClient.py `raise_event`, utils/http_utils.py).

Completing vs retrying: the trigger uses the plain binding with auto-complete, so returning completes the message and
raising abandons it (redelivery, then MaxDeliveryCountExceeded). The tests assert which one happens.
"""

from __future__ import annotations

import json

import pytest
from support.integration_support import ALERTS_QUEUE, Pipeline
from support.replies_support import ScriptedDurableApi, deliver, reply_body

from orderflow.messages import AlertKind, OperatorAlert
from triggers import agent_replies as trigger

# The registered function as the worker calls it: keyword arguments, the durable client as its binding JSON (the SDK's
# middleware, azure/durable_functions/decorators/durable_app.py `_add_rich_client`, builds the real client from it).
HANDLER = trigger.agent_replies._function.get_user_function()  # type: ignore[attr-defined]


async def alert_messages(p: Pipeline) -> list[tuple[str, OperatorAlert]]:
    """(the alert's own MessageId, the alert) for every alert sent, peeked."""
    async with p.services.bus.get_queue_receiver(ALERTS_QUEUE) as receiver:
        msgs = await receiver.peek_messages(max_message_count=100)
    return [(str(m.message_id), OperatorAlert.model_validate_json(b"".join(m.body))) for m in msgs]


# ---- an instanceId that breaks the rules: completed with an alert, before any HTTP call ---------------------------

BAD_INSTANCE_IDS = {
    # instanceId, the reply's orderId (so that only the instance-id rules fail, where they can)
    "empty": ("", "o-1"),
    "slash": ("x/y:1", "x/y"),
    "question mark": ("x?y", "x?y"),
    "hash": ("x#y", "x#y"),
    "dot-dot": ("../x:1", "../x"),
    "backslash": ("x\\y:1", "x\\y"),
    "leading @": ("@o:1", "@o"),
    "NUL": ("o\x00:1", "o\x00"),
    "newline": ("o\n:1", "o\n"),
    "101 characters": ("o" * 99 + ":1", "o" * 99),
    "not <orderId>:<attempt>": ("o-1:2", "o-1"),
    "another order": ("o-2:1", "o-1"),
    "no attempt": ("o-1", "o-1"),
}


@pytest.mark.parametrize(("instance_id", "order_id"), list(BAD_INSTANCE_IDS.values()), ids=list(BAD_INSTANCE_IDS))
async def test_an_unusable_instance_id_is_completed_with_an_alert_before_any_http_call(
    replies: Pipeline, durable_api: ScriptedDurableApi, instance_id: str, order_id: str
) -> None:
    session_id = order_id if order_id.isprintable() and order_id else "o-1"
    body = json.dumps(reply_body(instance_id, order_id)).encode()
    message = await deliver(replies, body, session_id=session_id, message_id="m-bad-id")

    await HANDLER(message=message, client=durable_api.binding())  # returns: the message is completed, not retried

    assert durable_api.requests == []
    [(_, alert)] = await alert_messages(replies)
    assert (alert.kind, alert.reason) == (AlertKind.POISON_MESSAGE, "InvalidAgentReply:instanceId")
    assert repr(instance_id) in alert.details["description"]
    assert (alert.details["messageId"], alert.details["sessionId"]) == ("m-bad-id", session_id)


async def test_a_reply_on_another_orders_session_is_completed_with_an_alert(
    replies: Pipeline, durable_api: ScriptedDurableApi
) -> None:
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-9", message_id="m-session"
    )
    await HANDLER(message=message, client=durable_api.binding())
    assert durable_api.requests == []
    [(_, alert)] = await alert_messages(replies)
    assert alert.reason == "InvalidAgentReply:sessionId"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "InvalidAgentReply:body"),
        (
            json.dumps({k: v for k, v in reply_body("o-1:1", "o-1").items() if k != "orderId"}).encode(),
            "InvalidAgentReply:orderId",
        ),
        (json.dumps(reply_body("o-1:1", "o-1", step="fly-to-the-moon")).encode(), "InvalidAgentReply:step"),
    ],
)
async def test_a_reply_that_is_not_an_agent_reply_is_completed_with_an_alert_naming_the_field(
    replies: Pipeline, durable_api: ScriptedDurableApi, body: bytes, reason: str
) -> None:
    message = await deliver(replies, body, session_id="o-1", message_id="m-schema")
    await HANDLER(message=message, client=durable_api.binding())
    assert durable_api.requests == []
    [(_, alert)] = await alert_messages(replies)
    assert alert.reason == reason


# ---- what raise_event answered: raised, late, refused for good, or worth a redelivery -----------------------------


async def test_a_valid_reply_is_raised_to_its_instance(replies: Pipeline, durable_api: ScriptedDurableApi) -> None:
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-1", message_id="m-ok"
    )
    await HANDLER(message=message, client=durable_api.binding())
    assert durable_api.requests == [
        "/runtime/webhooks/durabletask/instances/o-1:1/raiseEvent/AgentReply:reserve-inventory"
    ]
    assert await alert_messages(replies) == []


@pytest.mark.parametrize("answer", [(404, b"", None), (410, b"", None)], ids=["404 unknown", "410 finished"])
async def test_a_late_reply_is_completed_without_an_alert(
    replies: Pipeline, durable_api: ScriptedDurableApi, answer: tuple[int, bytes, str | None]
) -> None:
    durable_api.answer = answer
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-1", message_id="m-late"
    )
    await HANDLER(message=message, client=durable_api.binding())
    assert len(durable_api.requests) == 1
    assert await alert_messages(replies) == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            (400, b'{"Message": "Only application/json request content is supported"}', "application/json"),
            "RaiseEventRejected:400",
        ),
        ((403, b"", None), "RaiseEventRejected:403"),
        ((413, b"", None), "RaiseEventRejected:413"),
    ],
    ids=["400", "403", "413"],
)
async def test_an_answer_that_can_never_succeed_is_completed_with_an_alert(
    replies: Pipeline, durable_api: ScriptedDurableApi, answer: tuple[int, bytes, str | None], reason: str
) -> None:
    durable_api.answer = answer
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-1", message_id="m-refused"
    )
    await HANDLER(message=message, client=durable_api.binding())
    assert len(durable_api.requests) == 1
    [(_, alert)] = await alert_messages(replies)
    assert (alert.reason, alert.details["messageId"]) == (reason, "m-refused")


@pytest.mark.parametrize(
    "answer",
    [
        (500, b'{"Message": "Something went wrong while processing your request"}', "application/json"),
        (503, b"", None),
        (429, b"", None),
        (408, b"", None),
        (502, b"<html>Bad Gateway</html>", "text/html"),  # not JSON: the client cannot read the status at all
    ],
    ids=["500", "503", "429", "408", "non-JSON body"],
)
async def test_a_failure_that_may_pass_is_raised_for_redelivery(
    replies: Pipeline, durable_api: ScriptedDurableApi, answer: tuple[int, bytes, str | None]
) -> None:
    durable_api.answer = answer
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-1", message_id="m-transient"
    )
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raised, re-raised as it is
        await HANDLER(message=message, client=durable_api.binding())
    assert await alert_messages(replies) == []


async def test_an_unreachable_host_is_raised_for_redelivery(replies: Pipeline, durable_api: ScriptedDurableApi) -> None:
    durable_api.base = "http://127.0.0.1:9"  # discard port: connection refused
    message = await deliver(
        replies, json.dumps(reply_body("o-1:1", "o-1")).encode(), session_id="o-1", message_id="m-down"
    )
    with pytest.raises(OSError):  # aiohttp.ClientConnectorError is an OSError
        await HANDLER(message=message, client=durable_api.binding())
    assert await alert_messages(replies) == []
