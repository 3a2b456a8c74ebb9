"""Operator alerts name their message exactly and have their own MessageId per source message (issue 8, item 3).

- Every alert about a message carries that message's queue, MessageId, SessionId and SequenceNumber whole: a NUL or
  any other control character survives the alert model, its JSON, the broker and the log.
- An alert's own MessageId is `OperatorAlert.message_id()`: two different source messages (or orders/attempts) never
  share one, while a redelivery of the same message (or the Supervisor's sweep re-sending an owed alert) maps to the
  same one. Issue 8 saw `PoisonMessage:None:InvalidJson` four times.

Call sites covered: submission poison and conflict (orderflow/submission.py), agent replies (triggers/agent_replies.py),
and terminal alerts (orderflow/notifications.py, used by the Scheduler's finish and the Supervisor's escalation).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from support.integration_support import ALERTS_QUEUE, Pipeline, encode, order_body
from support.replies_support import REPLIES_QUEUE, ScriptedDurableApi, deliver, reply_body
from support.submission_trigger import run_submission_trigger

from orderflow.messages import AlertKind, OperatorAlert
from orderflow.notifications import notify_terminal
from orderflow.records import ProcessState
from orderflow.submission import submit
from triggers import agent_replies as replies_trigger

NUL_ID = "bad\x00tail"


async def alert_messages(p: Pipeline) -> list[tuple[str, OperatorAlert]]:
    async with p.services.bus.get_queue_receiver(ALERTS_QUEUE) as receiver:
        msgs = await receiver.peek_messages(max_message_count=100)
    return [(str(m.message_id), OperatorAlert.model_validate_json(b"".join(m.body))) for m in msgs]


# ---- the alert's own MessageId ------------------------------------------------------------------------------------


async def test_different_poison_messages_never_share_an_alert_message_id(pipeline: Pipeline) -> None:
    for n in range(4):  # issue 8: four InvalidJson alerts, one MessageId
        await submit(pipeline.services, b"not json", f"s-{n}", f"m-{n}", n + 1)
    ids = [message_id for message_id, _ in await alert_messages(pipeline)]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(i.startswith("PoisonMessage:") and len(i) <= 128 for i in ids)


async def test_a_redelivered_message_raises_the_same_alert_message_id(pipeline: Pipeline) -> None:
    for _ in range(2):  # the same message, delivered twice (same MessageId, SessionId, SequenceNumber)
        await submit(pipeline.services, b"not json", "s-1", "m-1", 5)
    pipeline.clock.advance(60)  # a later redelivery: raisedAt differs, the alert is the same
    await submit(pipeline.services, b"not json", "s-1", "m-1", 5)
    ids = [message_id for message_id, _ in await alert_messages(pipeline)]
    assert len(ids) == 3 and len(set(ids)) == 1


async def test_messages_whose_ids_differ_only_after_a_nul_get_different_alert_ids(pipeline: Pipeline) -> None:
    await submit(pipeline.services, b"not json", "s\x00one", "m\x00one")
    await submit(pipeline.services, b"not json", "s\x00two", "m\x00two")
    ids = {message_id for message_id, _ in await alert_messages(pipeline)}
    assert len(ids) == 2


async def test_conflict_alerts_of_two_messages_differ(pipeline: Pipeline) -> None:
    assert await submit(pipeline.services, encode(order_body("o-1")), "o-1", "m-first")
    await submit(pipeline.services, encode(order_body("o-1", quantity=3)), "o-1", "m-second", 2)
    await submit(pipeline.services, encode(order_body("o-1", quantity=4)), "o-1", "m-third", 3)
    conflicts = [(i, a) for i, a in await alert_messages(pipeline) if a.kind is AlertKind.ORDER_CONFLICT]
    assert [a.details["messageId"] for _, a in conflicts] == ["m-second", "m-third"]
    assert len({i for i, _ in conflicts}) == 2


def test_terminal_alert_ids_are_per_order_and_attempt_and_ignore_the_time() -> None:
    def alert(order_id: str, attempt: int, at: int) -> OperatorAlert:
        return OperatorAlert(
            kind=AlertKind.ORDER_FAILED,
            order_id=order_id,
            reason="charge-payment: PaymentDeclined",
            details={"attempt": attempt, "failureCount": 0},
            raised_at=datetime(2026, 1, 1, 0, 0, at, tzinfo=UTC),
        )

    assert alert("o-1", 1, 0).message_id() == alert("o-1", 1, 30).message_id()  # the sweep re-sending it
    assert len({alert("o-1", 1, 0).message_id(), alert("o-2", 1, 0).message_id(), alert("o-1", 2, 0).message_id()}) == 3


async def test_the_supervisor_sweep_resending_an_owed_alert_keeps_its_message_id(pipeline: Pipeline) -> None:
    """notify_terminal is what both the Scheduler's finish and the Supervisor's sweep call for an Error record."""
    await submit(pipeline.services, encode(order_body("o-err")), "o-err", "m-err")
    found = await pipeline.services.state.get("o-err")
    assert found is not None
    record = found[0].model_copy(
        update={"process_state": ProcessState.ERROR, "attempt": 3, "last_error": "FailureThresholdReached: 3 attempts"}
    )
    for _ in range(2):  # the first send "crashed" before notifiedAt was written; the sweep sends it again
        with pytest.raises(Exception):  # noqa: B017 - mark_notified refuses: the stored record is Pending
            await notify_terminal(pipeline.services, record)
    alerts = await alert_messages(pipeline)
    threshold = [(i, a) for i, a in alerts if a.kind is AlertKind.FAILURE_THRESHOLD]
    assert len(threshold) == 2 and threshold[0][0] == threshold[1][0]


# ---- whole ids, with a NUL ----------------------------------------------------------------------------------------


async def test_a_submission_alert_carries_the_ids_whole(pipeline: Pipeline) -> None:
    await submit(pipeline.services, encode(order_body(NUL_ID)), NUL_ID, f"{NUL_ID}:m", 42)
    [(_, alert)] = await alert_messages(pipeline)  # through the broker and back
    assert alert.details["messageId"] == f"{NUL_ID}:m"
    assert alert.details["sessionId"] == NUL_ID
    assert (alert.details["queue"], alert.details["sequenceNumber"]) == ("orders-inbound", 42)


async def test_an_agent_reply_alert_carries_the_ids_whole(replies: Pipeline, durable_api: ScriptedDurableApi) -> None:
    body = json.dumps(reply_body(f"{NUL_ID}:1", NUL_ID)).encode()
    message = await deliver(replies, body, session_id=NUL_ID, message_id=f"{NUL_ID}:1:reserve-inventory:reply")
    handler = replies_trigger.agent_replies._function.get_user_function()  # type: ignore[attr-defined]
    await handler(message=message, client=durable_api.binding())
    [(_, alert)] = await alert_messages(replies)
    assert alert.details["messageId"] == f"{NUL_ID}:1:reserve-inventory:reply"
    assert alert.details["sessionId"] == NUL_ID == alert.order_id
    assert alert.details["queue"] == REPLIES_QUEUE
    assert alert.details["sequenceNumber"] == message.sequence_number


async def test_the_sdk_binding_alert_names_the_dead_lettered_message_by_sequence_number(pipeline: Pipeline) -> None:
    """The SDK-type binding hands the function a message decoded by the extension (azurefunctions-extensions-bindings-
    servicebus utils.get_decoded_message → uamqp), whose string properties stop at a NUL, in Azure as here; the
    broker keeps the whole ids. The alert's SequenceNumber is exact, so it still names the dead-lettered message."""

    done = await run_submission_trigger(pipeline, encode(order_body(NUL_ID)), NUL_ID, f"{NUL_ID}:m")
    received, sdk_message, actions = done.received, done.sdk_message, done.actions
    assert (sdk_message.message_id, sdk_message.session_id) != (f"{NUL_ID}:m", NUL_ID)  # cut by the decoder
    assert [c[0] for c in actions.calls] == ["deadletter"]
    [(_, alert)] = await alert_messages(pipeline)
    assert alert.details["sequenceNumber"] == received.sequence_number
