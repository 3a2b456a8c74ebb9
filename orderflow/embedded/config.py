"""Queue declarations: the Service Bus emulator's Config.json format, mapped to typed queue properties.

`servicebus.config.json` (repo root) uses the property names of the Service Bus emulator's Config.json
(UserConfig → Namespaces → Queues → Name, Properties). Defaults are the Service Bus defaults
(https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas and the emulator's Config.json):
LockDuration PT1M, MaxDeliveryCount 10, DuplicateDetectionHistoryTimeWindow PT10M, no message expiry, Standard's
256 KB messages (MaxMessageSizeInKilobytes, an ARM property the emulator lacks, makes a queue Premium-sized).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import isodate

# Property name in Config.json → field name of QueueProperties.
_CONFIG_NAMES: dict[str, str] = {
    "RequiresSession": "requires_session",
    "RequiresDuplicateDetection": "requires_duplicate_detection",
    "DuplicateDetectionHistoryTimeWindow": "duplicate_detection_history_time_window",
    "LockDuration": "lock_duration",
    "MaxDeliveryCount": "max_delivery_count",
    "DefaultMessageTimeToLive": "default_message_time_to_live",
    "DeadLetteringOnMessageExpiration": "dead_lettering_on_message_expiration",
    "MaxMessageSizeInKilobytes": "max_message_size_in_kilobytes",
}
# Emulator properties we accept but do not implement (forwarding); an empty value is the only legal one.
_IGNORED_IF_EMPTY = frozenset({"ForwardTo", "ForwardDeadLetteredMessagesTo"})
_DURATIONS = frozenset({"duplicate_detection_history_time_window", "lock_duration", "default_message_time_to_live"})
# Service Bus expresses "never expires" as TimeSpan.MaxValue; anything this long is treated as no TTL.
_NO_EXPIRY = timedelta(days=3650)
# Message sizes (service-bus-quotas; service-bus-premium-messaging, "Large messages support"): 256 KB on Standard; on
# Premium the entity's maxMessageSizeInKilobytes, 1,024 (its default) to 102,400. The SDK's batches: 256 KB, or 1 MB
# once the link allows 1 MB or more (azure/servicebus/_servicebus_sender.py `_open`, MAX_BATCH_SIZE_PREMIUM).
STANDARD_MESSAGE_KB = 256
PREMIUM_MESSAGE_KB = (1024, 102_400)
_PREMIUM_BATCH_BYTES = 1024 * 1024


@dataclass(frozen=True)
class QueueProperties:
    """The properties of one queue that the embedded broker honours."""

    requires_session: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    default_message_time_to_live: timedelta | None = None
    dead_lettering_on_message_expiration: bool = False
    max_message_size_in_kilobytes: int = STANDARD_MESSAGE_KB

    def __post_init__(self) -> None:
        if self.max_delivery_count < 1:
            raise ValueError("MaxDeliveryCount must be at least 1")
        if self.lock_duration <= timedelta(0):
            raise ValueError("LockDuration must be positive")
        size, (low, high) = self.max_message_size_in_kilobytes, PREMIUM_MESSAGE_KB
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or not (size == STANDARD_MESSAGE_KB or low <= size <= high)
        ):
            raise ValueError(
                f"MaxMessageSizeInKilobytes must be {STANDARD_MESSAGE_KB} (Standard) or {low} to {high} (Premium), "
                f"got {size!r}"
            )

    @property
    def max_message_size_bytes(self) -> int:
        """The largest message the entity takes, its whole encoded AMQP message (what its links announce)."""
        return self.max_message_size_in_kilobytes * 1024

    @property
    def max_batch_size_bytes(self) -> int:
        """The SDK's batch limit on a link to this entity (`create_message_batch`)."""
        if self.max_message_size_bytes >= _PREMIUM_BATCH_BYTES:
            return _PREMIUM_BATCH_BYTES
        return self.max_message_size_bytes

    @classmethod
    def create(cls, **properties: Any) -> QueueProperties:
        """Build from snake_case keywords; durations may be timedelta, seconds or ISO 8601 strings."""
        known = {f.name for f in fields(cls)}
        unknown = set(properties) - known
        if unknown:
            raise TypeError(f"unknown queue properties: {sorted(unknown)}")
        return cls(**{name: _coerce(name, value) for name, value in properties.items()})

    @classmethod
    def from_config(cls, properties: Mapping[str, Any]) -> QueueProperties:
        """Build from the emulator's Config.json `Properties` object (PascalCase names)."""
        kwargs: dict[str, Any] = {}
        for key, value in properties.items():
            if key in _IGNORED_IF_EMPTY and not value:
                continue
            if key not in _CONFIG_NAMES:
                raise ValueError(f"unsupported queue property {key!r} in Service Bus config")
            kwargs[_CONFIG_NAMES[key]] = value
        return cls.create(**kwargs)

    def to_json(self) -> str:
        """Stable JSON form (durations in seconds), as stored in the broker's database."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps(
            {k: (v.total_seconds() if isinstance(v, timedelta) else v) for k, v in data.items()},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> QueueProperties:
        return cls.create(**json.loads(text))


def _coerce(name: str, value: Any) -> Any:
    if name not in _DURATIONS:
        return value
    duration = parse_duration(value)
    if name == "default_message_time_to_live" and duration is not None and duration >= _NO_EXPIRY:
        return None
    return duration


def parse_duration(value: str | float | int | timedelta | None) -> timedelta | None:
    """ISO 8601 duration (`PT10M`), a number of seconds, or a timedelta → timedelta (None stays None)."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    parsed = isodate.parse_duration(value)
    if not isinstance(parsed, timedelta):  # years/months: not meaningful for Service Bus entities
        raise ValueError(f"duration {value!r} must not use years or months")
    return parsed


def queues_from_config(config: Mapping[str, Any]) -> dict[str, QueueProperties]:
    """All queues declared in a Config.json document (every namespace), by name."""
    queues: dict[str, QueueProperties] = {}
    for namespace in config.get("UserConfig", {}).get("Namespaces", []):
        for queue in namespace.get("Queues", []):
            queues[queue["Name"]] = QueueProperties.from_config(queue.get("Properties", {}))
    return queues


def load_config_file(path: str | Path) -> dict[str, QueueProperties]:
    """Read a Config.json file and return its queues."""
    with open(path, encoding="utf-8") as handle:
        return queues_from_config(json.load(handle))
