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
        # Issue 25: each submitting app's own inbound queue, and a second local app (the tenant-isolation drill).
        "app-orders",
        "partner-orders",
        "partner-status",
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


def test_a_queue_is_standard_sized_unless_it_declares_a_premium_message_size():
    # service-bus-quotas: 256 KB on Standard; service-bus-premium-messaging ("Large messages support"): a Premium
    # entity's maxMessageSizeInKilobytes, 1,024 (the default) to 102,400. The SDK's batch on such a link is 1 MB
    # (azure/servicebus/_servicebus_sender.py `_open`: MAX_BATCH_SIZE_PREMIUM once the link allows that much).
    standard = QueueProperties()
    assert (standard.max_message_size_bytes, standard.max_batch_size_bytes) == (256 * 1024, 256 * 1024)
    premium = QueueProperties.from_config({"MaxMessageSizeInKilobytes": 102_400})
    assert (premium.max_message_size_bytes, premium.max_batch_size_bytes) == (100 * 1024 * 1024, 1024 * 1024)
    assert QueueProperties.from_json(premium.to_json()) == premium
    assert QueueProperties.from_json('{"lock_duration": 60}') == standard  # a broker file from before the property
    for wrong in (0, 512, 1023, 102_401, "1024", True):
        with pytest.raises(ValueError, match="MaxMessageSizeInKilobytes must be 256"):
            QueueProperties.from_config({"MaxMessageSizeInKilobytes": wrong})
