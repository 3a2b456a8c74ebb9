"""History events in the JSON shape the Durable extension sends to out-of-process workers.

Field names follow DTFx `HistoryEvent` subclasses as the Python SDK reads them
(azure/durable_functions/models/history/HistoryEvent.py, models/TaskOrchestrationExecutor.py):
EventType (HistoryEventType int), EventId, IsPlayed, Timestamp; TaskScheduledId / TimerId / Name link a
completion
to the task the SDK opened; TaskFailed carries Reason and Details.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from azure.durable_functions.models.history import HistoryEventType as T
from dateutil.parser import isoparse

Event = dict[str, Any]

COMPLETION_TYPES = frozenset(
    {
        T.TASK_COMPLETED,
        T.TASK_FAILED,
        T.TIMER_FIRED,
        T.EVENT_RAISED,
        T.SUB_ORCHESTRATION_INSTANCE_COMPLETED,
        T.SUB_ORCHESTRATION_INSTANCE_FAILED,
    }
)


def format_time(moment: datetime) -> str:
    """UTC ISO-8601 with microseconds and a Z, as the SDK formats datetimes
    (constants.DATETIME_STRING_FORMAT).
    """
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse an ISO-8601 timestamp; naive values are taken as UTC."""
    moment: datetime = isoparse(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def event(event_type: T, now: datetime, event_id: int = -1, **fields: Any) -> Event:
    """One history event; `IsPlayed` is false when recorded and set on replay (see `as_replayed`)."""
    return {
        "EventType": int(event_type),
        "EventId": event_id,
        "IsPlayed": False,
        "Timestamp": format_time(now),
        **fields,
    }


def execution_started(
    now: datetime,
    name: str,
    orchestration_input: str | None,
    *,
    version: str | None,
    parent_instance_id: str | None = None,
) -> Event:
    """ExecutionStarted; `Version` is the instance's orchestration version (None when it has none), which the SDK's
    `context.version` returns (DurableOrchestrationContext._extract_version_from_history)."""
    return event(
        T.EXECUTION_STARTED,
        now,
        Name=name,
        Input=orchestration_input,
        Version=version,
        ParentInstance=parent_instance_id,
    )


def task_completed(now: datetime, task_id: int, result: str | None) -> Event:
    return event(T.TASK_COMPLETED, now, TaskScheduledId=task_id, Result=result)


def task_failed(now: datetime, task_id: int, reason: str, details: str) -> Event:
    return event(T.TASK_FAILED, now, TaskScheduledId=task_id, Reason=reason, Details=details)


def timer_fired(now: datetime, timer_id: int, fire_at: str) -> Event:
    return event(T.TIMER_FIRED, now, TimerId=timer_id, FireAt=fire_at)


def event_raised(now: datetime, name: str, payload: str | None) -> Event:
    return event(T.EVENT_RAISED, now, Name=name, Input=payload)


def sub_orchestration_completed(now: datetime, task_id: int, result: str | None) -> Event:
    return event(T.SUB_ORCHESTRATION_INSTANCE_COMPLETED, now, TaskScheduledId=task_id, Result=result)


def sub_orchestration_failed(now: datetime, task_id: int, reason: str | None, details: str | None) -> Event:
    return event(T.SUB_ORCHESTRATION_INSTANCE_FAILED, now, TaskScheduledId=task_id, Reason=reason, Details=details)


def as_replayed(events: list[Event]) -> list[Event]:
    """Copies flagged IsPlayed, for events of earlier episodes: what the SDK receives for them (the engine builds
    the same JSON from recorded texts, timeline.played_text)."""
    return [{**e, "IsPlayed": True} for e in events]


def type_name(event_type: int) -> str:
    """'TaskScheduled' for 4 and so on: the names the HTTP API shows in historyEvents."""
    return "".join(part.capitalize() for part in T(event_type).name.split("_"))
