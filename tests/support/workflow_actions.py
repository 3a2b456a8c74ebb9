"""Scheduler actions and Agent replies for the tests that drive the workflow through the replay engine
(support/orchestration_driver.py): find an activity call among an episode's actions, list the calls, build a reply
event, tell whether a timer was cancelled. Order "o-1", attempt 1."""

from __future__ import annotations

from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType

from orderflow.messages import AgentReply
from support.orchestration_driver import Driver

ORDER = "o-1"
INSTANCE = f"{ORDER}:1"
CALLS = (ActionType.CALL_ACTIVITY, ActionType.CALL_ACTIVITY_WITH_RETRY)


def reply(
    step: str,
    outcome: str = "succeeded",
    *,
    instance: str = INSTANCE,
    permanent: bool = False,
    error: str | None = None,
    error_code: str | None = None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Agent's reply event, built through the model so that it states the schemaVersion its content needs."""
    return AgentReply.model_validate(
        {
            "type": "AgentReply",
            "instanceId": instance,
            "orderId": ORDER,
            "attempt": int(instance.rsplit(":", 1)[1]),
            "step": step,
            "outcome": outcome,
            "permanent": permanent,
            "errorCode": error_code or ("Declined" if error else None),
            "error": error,
            "result": result or {},
            "completedAt": "2026-01-01T00:00:01Z",
        }
    ).to_dict()


def activity(actions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The (first) call of activity `name` among `actions`; every Scheduler activity is called with retry options."""
    found = [a for a in actions if a["actionType"] == ActionType.CALL_ACTIVITY_WITH_RETRY and a["functionName"] == name]
    assert found, f"expected a call of {name}, got {actions}"
    assert all(a["retryOptions"]["maxNumberOfAttempts"] == 3 for a in found)
    return found[0]


def calls(actions: list[dict[str, Any]]) -> list[str]:
    return [a["functionName"] for a in actions if a["actionType"] in CALLS]


def timer_cancelled(d: Driver, timer: dict[str, Any]) -> bool:
    timers = [a for group in d.result["actions"] for a in group if a.get("fireAt") == timer["fireAt"]]
    return bool(timers) and all(t["isCanceled"] for t in timers)
