"""The embedded broker's fault-injection switch `DuplicateDelivery=true` (orderflow/embedded/broker/): every message
completed in peek-lock mode is delivered once more, as Service Bus does after a settlement it never recorded — the same
MessageId and sequence number, delivery count + 1, past duplicate detection (which acts on sends only).

Source: https://learn.microsoft.com/azure/service-bus-messaging/message-transfers-locks-settlement ("Settling receive
operations": if the settlement is lost, the message is unlocked and delivered again, at least once) and
https://learn.microsoft.com/azure/service-bus-messaging/duplicate-detection (detection applies to sent MessageIds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode, ServiceBusSubQueue

from orderflow.adapters import bus_from_connection_string
from orderflow.embedded.client import ServiceBusMessage

SHORT = 0.05


def _conn(tmp_path: Path, switch: str | None) -> str:
    option = "" if switch is None else f";DuplicateDelivery={switch}"
    return f"Endpoint=embedded://{tmp_path / 'bus.db'}{option}"


def _drain(client, queue: str, batch_size: int = 10, **receiver_args) -> list[tuple[str, int, int]]:
    """Receive and complete until the queue is empty: (MessageId, SequenceNumber, DeliveryCount) of each delivery."""
    seen: list[tuple[str, int, int]] = []
    with client.get_queue_receiver(queue, **receiver_args) as receiver:
        while batch := receiver.receive_messages(max_message_count=batch_size, max_wait_time=SHORT):
            for m in batch:
                seen.append((str(m.message_id), m.sequence_number, m.delivery_count))
                receiver.complete_message(m)
    return seen


def test_on_every_completed_message_is_delivered_exactly_once_more(tmp_path):
    with bus_from_connection_string(_conn(tmp_path, "true")) as client:
        client.broker.declare_queue("q")
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(3)])
        seen = _drain(client, "q")
        firsts = [s for s in seen if s[2] == 0]
        seconds = [s for s in seen if s[2] == 1]
        assert [s[0] for s in firsts] == ["id-0", "id-1", "id-2"]
        # The same message again (MessageId and sequence number), counted as a failed delivery; never a third time.
        assert sorted(seconds) == sorted((mid, seq, 1) for mid, seq, _ in firsts)
        assert len(seen) == 6
        assert client.broker.redelivered_counts() == {"q": 3}
        assert client.broker.counts("q").total == 0


@pytest.mark.parametrize("switch", [None, "false", "False"])
def test_off_a_complete_removes_the_message(tmp_path, switch):
    with bus_from_connection_string(_conn(tmp_path, switch)) as client:
        client.broker.declare_queue("q")
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(3)])
        assert [s[2] for s in _drain(client, "q")] == [0, 0, 0]
        assert client.broker.redelivered_counts() == {}


def test_sessions_get_it_back_first_past_duplicate_detection(tmp_path):
    """On a session queue with duplicate detection (as orders-inbound): the redelivery is not a send, so detection does
    not drop it, and FIFO puts it before the session's later message."""
    with bus_from_connection_string(_conn(tmp_path, "true")) as client:
        client.broker.declare_queue("s", requires_session=True, requires_duplicate_detection=True)
        with client.get_queue_sender("s") as sender:
            sender.send_messages([ServiceBusMessage(b, message_id=b, session_id="order-1") for b in ("a", "b")])
        seen = _drain(client, "s", 1, session_id=NEXT_AVAILABLE_SESSION)
        assert [(mid, count) for mid, _seq, count in seen] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
        assert client.broker.redelivered_counts() == {"s": 2}


def test_a_lost_complete_counts_against_max_delivery_count(tmp_path):
    """As on Service Bus: the lost settlement is a failed delivery, so at MaxDeliveryCount the message is dead-lettered
    instead of delivered again."""
    with bus_from_connection_string(_conn(tmp_path, "true")) as client:
        client.broker.declare_queue("q", max_delivery_count=1)
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("m", message_id="id"))
        assert [s[2] for s in _drain(client, "q")] == [0]
        with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            assert [m.dead_letter_reason for m in dlq.peek_messages(10)] == ["MaxDeliveryCountExceeded"]


def test_left_alone_dead_letters_and_receive_and_delete(tmp_path):
    with bus_from_connection_string(_conn(tmp_path, "true")) as client:
        client.broker.declare_queue("q")
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage("poison", message_id="p"), ServiceBusMessage("m", message_id="m")])
        with client.get_queue_receiver("q") as receiver:
            (poison,) = receiver.receive_messages(max_message_count=1, max_wait_time=SHORT)
            receiver.dead_letter_message(poison, reason="Bad")
        with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            assert [str(m.message_id) for m in receiver.receive_messages(10, max_wait_time=SHORT)] == ["m"]
            assert receiver.receive_messages(10, max_wait_time=SHORT) == []
        # Completing the dead letter (as `orderflow dlq replay` does) removes it once and for all.
        assert [s[0] for s in _drain(client, "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)] == ["p"]
        assert client.broker.redelivered_counts() == {}
        assert client.broker.counts("q").total == 0


def test_a_bad_switch_value_is_refused(tmp_path):
    with pytest.raises(ValueError, match="DuplicateDelivery must be true or false"):
        bus_from_connection_string(_conn(tmp_path, "yes"))
