"""Queue declarations: the repo's servicebus.config.json (Service Bus emulator Config.json property names)
and programmatic, idempotent declaration. Emulator format:
https://learn.microsoft.com/azure/service-bus-messaging/overview-emulator (Config.json).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client import ServiceBusAdministrationClient, ServiceBusMessage
from orderflow.embedded.config import QueueProperties, load_config_file, queues_from_config

REPO_CONFIG = Path(__file__).resolve().parents[3] / "servicebus.config.json"


def test_repo_config_declares_the_product_queues():
    queues = load_config_file(REPO_CONFIG)
    assert set(queues) == {
        "orders-inbound",
        "agent-requests",
        "agent-replies",
        "operator-alerts",
        "app-status",
    }
    inbound = queues["orders-inbound"]
    assert inbound.requires_session and inbound.requires_duplicate_detection
    assert inbound.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert (inbound.lock_duration, inbound.max_delivery_count) == (timedelta(minutes=1), 5)
    for name in ("agent-requests", "agent-replies", "app-status"):
        assert queues[name].requires_session and queues[name].requires_duplicate_detection
    assert not queues["operator-alerts"].requires_session


def test_emulator_defaults_and_unsupported_properties():
    [props] = queues_from_config({"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q"}]}]}}).values()
    assert props == QueueProperties()  # LockDuration PT1M, MaxDeliveryCount 10, no expiry
    assert QueueProperties.from_config({"DefaultMessageTimeToLive": "P10675199DT2H48M5.4775807S"}) == QueueProperties()
    with pytest.raises(ValueError):
        QueueProperties.from_config({"EnablePartitioning": True})
    with pytest.raises(ValueError):
        QueueProperties.from_config({"MaxDeliveryCount": 0})


def test_declare_queue_is_idempotent_and_shared_through_the_file(tmp_path):
    first = EmbeddedBroker(tmp_path / "bus.db")
    first.declare_queue("q", requires_session=True, lock_duration=30)
    first.declare_queue("q", requires_session=True, lock_duration=30)
    second = EmbeddedBroker(tmp_path / "bus.db", config={"UserConfig": {"Namespaces": []}})
    assert second.queue_properties("q").lock_duration == timedelta(seconds=30)
    assert second.queue_names() == ["q"]
    with pytest.raises(MessagingEntityNotFoundError):
        second.queue_properties("other")
    first.close()
    second.close()


def test_admin_client_creates_queues_and_reports_runtime_properties(broker, client, clock):
    admin = ServiceBusAdministrationClient(broker)
    admin.create_queue("stats", max_delivery_count=1)
    sender = client.get_queue_sender("stats")
    sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    sender.schedule_messages(ServiceBusMessage("later"), clock.now + timedelta(hours=1))
    receiver = client.get_queue_receiver("stats")
    [msg] = receiver.receive_messages(max_wait_time=0.05)
    receiver.abandon_message(msg)  # MaxDeliveryCount 1 → dead-lettered
    props = admin.get_queue_runtime_properties("stats")
    assert (props.active_message_count, props.scheduled_message_count, props.dead_letter_message_count) == (
        1,
        1,
        1,
    )
    assert props.total_message_count == 3
