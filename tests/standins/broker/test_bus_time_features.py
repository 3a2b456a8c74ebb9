"""Duplicate detection window, scheduled messages and time-to-live, on an injected clock.

Sources: https://learn.microsoft.com/azure/service-bus-messaging/duplicate-detection ("the message is
accepted (the send operation succeeds), but the duplicate message is instantly ignored and dropped");
.../message-sequencing#scheduled-messages ("don't materialize in the queue until the defined enqueue time");
.../message-expiration ("expired messages ... moved to the dead-letter queue" with
DeadLetteringOnMessageExpiration, reason TTLExpiredException, per service-bus-dead-letter-queues).
"""

from __future__ import annotations

from datetime import timedelta

from azure.servicebus import ServiceBusSubQueue

from orderflow.embedded.client import ServiceBusMessage

SHORT = 0.05


def _bodies(client, q: str, **kwargs) -> list[str]:
    with client.get_queue_receiver(q, **kwargs) as receiver:
        messages = receiver.receive_messages(50, max_wait_time=SHORT)
        for m in messages:
            receiver.complete_message(m)
    return [str(m) for m in messages]


def test_duplicate_inside_window_is_dropped_outside_is_accepted(client, queue, clock):
    q = queue(requires_duplicate_detection=True, duplicate_detection_history_time_window="PT10M")
    sender = client.get_queue_sender(q)
    sender.send_messages(ServiceBusMessage("first", message_id="m-1"))
    clock.advance(9 * 60)
    sender.send_messages(ServiceBusMessage("dup", message_id="m-1"))  # silently accepted and dropped
    assert _bodies(client, q) == ["first"]
    clock.advance(61)  # the window counts from the first send, not from the duplicate
    sender.send_messages(ServiceBusMessage("later", message_id="m-1"))
    assert _bodies(client, q) == ["later"]


def test_duplicate_detection_applies_within_one_batch_and_on_session_queues(client, queue):
    q = queue(requires_session=True, requires_duplicate_detection=True)
    client.get_queue_sender(q).send_messages(
        [ServiceBusMessage(b, session_id="S", message_id="same") for b in ("one", "two")]
    )
    assert _bodies(client, q, session_id="S") == ["one"]


def test_without_duplicate_detection_same_message_id_is_delivered_twice(client, queue):
    q = queue()
    client.get_queue_sender(q).send_messages([ServiceBusMessage(b, message_id="same") for b in ("one", "two")])
    assert _bodies(client, q) == ["one", "two"]


def test_scheduled_message_is_invisible_before_its_time(client, queue, clock):
    q = queue()
    due = clock.now + timedelta(minutes=5)
    client.get_queue_sender(q).send_messages(ServiceBusMessage("later", scheduled_enqueue_time_utc=due))
    assert client.broker.counts(q).scheduled == 1
    clock.advance(299)
    assert _bodies(client, q) == []
    assert len(client.get_queue_receiver(q).peek_messages(5)) == 1  # peek sees scheduled messages
    clock.advance(1)
    assert client.broker.counts(q).active == 1
    with client.get_queue_receiver(q) as receiver:
        [msg] = receiver.receive_messages(max_wait_time=SHORT)
        assert msg.enqueued_time_utc == due and msg.scheduled_enqueue_time_utc == due


def test_schedule_and_cancel_scheduled_messages(client, queue, clock):
    q = queue()
    sender = client.get_queue_sender(q)
    [keep, drop] = [
        sender.schedule_messages(ServiceBusMessage(b), clock.now + timedelta(seconds=60))[0] for b in ("keep", "drop")
    ]
    sender.cancel_scheduled_messages(drop)
    clock.advance(60)
    assert _bodies(client, q) == ["keep"] and keep < drop


def test_expired_message_is_not_delivered_and_dropped_by_default(client, queue, clock):
    q = queue()
    client.get_queue_sender(q).send_messages(ServiceBusMessage("brief", time_to_live=timedelta(seconds=30)))
    clock.advance(30)
    assert _bodies(client, q) == []
    assert client.broker.counts(q).total == 0


def test_expired_message_dead_lettered_with_ttl_reason_when_configured(client, queue, clock):
    q = queue(dead_lettering_on_message_expiration=True, default_message_time_to_live="PT1M")
    sender = client.get_queue_sender(q)
    sender.send_messages(ServiceBusMessage("queue-default"))  # expires after the queue's 1 minute
    sender.send_messages(ServiceBusMessage("own-ttl", time_to_live=timedelta(seconds=10)))  # the shorter wins
    clock.advance(10)
    receiver = client.get_queue_receiver(q)
    [alive] = receiver.receive_messages(5, max_wait_time=SHORT)  # this receive purged "own-ttl" (lazily, as SB)
    assert str(alive) == "queue-default"
    receiver.abandon_message(alive)
    [expired] = client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages(
        max_wait_time=SHORT
    )
    assert (str(expired), expired.dead_letter_reason) == ("own-ttl", "TTLExpiredException")
    assert expired.dead_letter_error_description == "The message expired and was dead lettered."
    clock.advance(50)
    assert _bodies(client, q) == []
    assert client.broker.counts(q).dead_lettered == 2


def test_ttl_of_scheduled_message_counts_from_its_enqueue_time(client, queue, clock):
    q = queue()
    due = clock.now + timedelta(seconds=100)
    client.get_queue_sender(q).send_messages(
        ServiceBusMessage("x", scheduled_enqueue_time_utc=due, time_to_live=timedelta(seconds=30))
    )
    clock.advance(120)
    assert _bodies(client, q) == ["x"]
