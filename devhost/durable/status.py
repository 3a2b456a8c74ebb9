"""The instance status payload of the HTTP API (the extension's StatusResponsePayload /
HttpApiHandler.ConvertFrom).
"""

from __future__ import annotations

import json
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T

from . import history as h
from .records import InstanceRow

HIDDEN_EVENTS = frozenset({T.ORCHESTRATOR_STARTED, T.ORCHESTRATOR_COMPLETED})


def _seconds(stamp: str) -> str:
    """`DateTime.ToString("s") + "Z"`: the second precision the extension renders."""
    return h.parse_time(stamp).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def status_payload(
    row: InstanceRow,
    *,
    show_input: bool = True,
    history: list[h.Event] | None = None,
    show_history_output: bool = False,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "name": row.name,
        "instanceId": row.instance_id,
        "runtimeStatus": row.status,
        "input": _json(row.input) if show_input else None,
        "customStatus": _json(row.custom_status),
        "output": _json(row.output),
        "createdTime": _seconds(row.created_time),
        "lastUpdatedTime": _seconds(row.last_updated_time),
    }
    if history is not None:
        payload["historyEvents"] = [
            _history_entry(e, show_history_output) for e in history if e["EventType"] not in HIDDEN_EVENTS
        ]
    return payload


def _history_entry(event: h.Event, show_output: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "EventType": h.type_name(event["EventType"]),
        "EventId": event["EventId"],
        "Timestamp": event["Timestamp"],
    }
    for key in (
        "Name",
        "InstanceId",
        "TaskScheduledId",
        "TimerId",
        "FireAt",
        "Reason",
        "Details",
        "OrchestrationStatus",
    ):
        if event.get(key) is not None:
            entry[key] = event[key]
    if show_output and event.get("Result") is not None:
        entry["Result"] = event["Result"]
    return entry
