"""Drive a registered orchestrator step by step through the real azure-functions-durable replay engine.

The driver plays the Durable extension's part in miniature: it keeps the history (OrchestratorStarted, ExecutionStarted,
TaskScheduled/TimerCreated for each new action, then the completion events the test feeds) and replays the whole
history on every episode, as the extension does (history event field names: azure/durable_functions/models/history/).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType
from azure.durable_functions.models.history.HistoryEventType import HistoryEventType as H

START = datetime(2026, 1, 1, tzinfo=UTC)


class Driver:
    def __init__(
        self, handle: Callable[[str], str], instance_id: str, input_: Any, *, upper_schema_version: int = 0
    ) -> None:
        """`upper_schema_version` 0 makes the SDK answer ReplaySchema V1 (a list per yield); 2, what the extension
        offers (V3: one flat list, WhenAny/WhenAll as compound actions holding the children not scheduled before)."""
        self.handle = handle
        self.upper_schema_version = upper_schema_version
        self.instance_id = instance_id
        self.now = START
        self.history: list[dict[str, Any]] = []
        self.actions_seen = 0
        self.next_task_id = 0
        self.scheduled: list[dict[str, Any]] = []  # every scheduled action with its task id
        self.result: dict[str, Any] = {}
        self._input = json.dumps(input_)
        self._started = False

    def _event(self, kind: H, **fields: Any) -> dict[str, Any]:
        return {
            "EventType": int(kind),
            "EventId": fields.pop("EventId", -1),
            "IsPlayed": False,
            "Timestamp": self.now.isoformat(),
            **fields,
        }

    def episode(self, *new_events: dict[str, Any]) -> list[dict[str, Any]]:
        """Run one episode with the new events; return the actions scheduled by it."""
        for e in self.history:
            e["IsPlayed"] = True
        self.history.append(self._event(H.ORCHESTRATOR_STARTED))
        if not self._started:
            self.history.append(self._event(H.EXECUTION_STARTED, Input=self._input, Name="orchestrator", Version=""))
            self._started = True
        self.history.extend(new_events)
        context = {
            "history": self.history,
            "input": self._input,
            "instanceId": self.instance_id,
            "isReplaying": False,
            "parentInstanceId": None,
            "upperSchemaVersion": self.upper_schema_version,
        }
        state = json.loads(self.handle(json.dumps(context)))
        self.result = state
        flat = list(_atomic(a for group in state["actions"] for a in group))
        new = flat[self.actions_seen :]
        self.actions_seen = len(flat)
        out: list[dict[str, Any]] = []
        for action in new:
            if action["actionType"] == ActionType.WAIT_FOR_EXTERNAL_EVENT:
                out.append({**action, "taskId": None})
                continue
            action = {**action, "taskId": self.next_task_id}
            self.next_task_id += 1
            self.scheduled.append(action)
            out.append(action)
            if action["actionType"] == ActionType.CREATE_TIMER:
                self.history.append(self._event(H.TIMER_CREATED, EventId=action["taskId"], FireAt=action["fireAt"]))
            elif action["actionType"] in (ActionType.CALL_ACTIVITY, ActionType.CALL_ACTIVITY_WITH_RETRY):
                self.history.append(
                    self._event(H.TASK_SCHEDULED, EventId=action["taskId"], Name=action["functionName"])
                )
        self.history.append(self._event(H.ORCHESTRATOR_COMPLETED))
        return out

    # ---- completion events the test feeds -----------------------------------------------------------------
    def completed(self, task_id: int, result: Any) -> dict[str, Any]:
        return self._event(H.TASK_COMPLETED, TaskScheduledId=task_id, Result=json.dumps(result))

    def failed(self, task_id: int, reason: str) -> dict[str, Any]:
        return self._event(H.TASK_FAILED, TaskScheduledId=task_id, Reason=reason, Details="")

    def timer_fired(self, task_id: int) -> dict[str, Any]:
        action = next(a for a in self.scheduled if a["taskId"] == task_id)
        return self._event(H.TIMER_FIRED, TimerId=task_id, FireAt=action["fireAt"])

    def event_raised(self, name: str, payload: Any) -> dict[str, Any]:
        return self._event(H.EVENT_RAISED, Name=name, Input=json.dumps(payload))

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @property
    def done(self) -> bool:
        return bool(self.result.get("isDone"))

    @property
    def output(self) -> Any:
        return self.result.get("output")


def _atomic(actions: Any) -> Any:
    """The atomic actions in order, a compound's children in its place (ReplaySchema V2/V3)."""
    for action in actions:
        if action["actionType"] in (ActionType.WHEN_ANY, ActionType.WHEN_ALL):
            yield from _atomic(action.get("compoundActions") or [])
        else:
            yield action
