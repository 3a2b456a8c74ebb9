"""Orchestrator actions: decode the SDK's `actions` JSON and compare a replay with what history recorded.

Shapes: azure/durable_functions/models/actions/*.py and OrchestratorState.to_json. ReplaySchema V1 sends a
list of
lists (one list per yield); V2/V3 send one flat list in which WhenAny/WhenAll are compound actions holding the
children not scheduled before (`compoundActions`). Flattening both gives the actions in scheduling order,
which is
the order in which the SDK hands out sequence numbers (DurableOrchestrationContext._add_to_open_tasks).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A

from .retry import RetryPolicy

ID_CONSUMING = frozenset(
    {
        A.CALL_ACTIVITY,
        A.CALL_ACTIVITY_WITH_RETRY,
        A.CALL_SUB_ORCHESTRATOR,
        A.CALL_SUB_ORCHESTRATOR_WITH_RETRY,
        A.CREATE_TIMER,
    }
)
ENTITY_ACTIONS = frozenset({A.CALL_ENTITY, A.SIGNAL_ENTITY})


@dataclass(frozen=True)
class Action:
    """One decoded atomic action."""

    kind: A
    name: str | None = None
    input: str | None = None
    retry: RetryPolicy | None = None
    fire_at: str | None = None
    instance_id: str | None = None
    is_canceled: bool = False
    # CallSubOrchestrator(WithRetry)Action's `version` (azure-functions-durable-python #582): None = not given.
    version: str | None = None

    @property
    def signature(self) -> dict[str, Any]:
        """What must stay the same across replays (type and target), stored per instance."""
        return {"kind": int(self.kind), "name": self.name}

    @property
    def consumes_id(self) -> bool:
        return self.kind in ID_CONSUMING


def describe(signature: dict[str, Any]) -> str:
    """Human form of a signature, e.g. "CallActivity 'load_order'"."""
    kind = "".join(p.capitalize() for p in A(signature["kind"]).name.split("_"))
    return f"{kind} '{signature['name']}'" if signature.get("name") else kind


def flatten(raw_actions: Iterable[Any]) -> list[Action]:
    """Decode V1 (list of lists) or V2/V3 (flat with compounds) actions into atomic actions in order."""
    out: list[Action] = []
    for item in raw_actions:
        if isinstance(item, list):
            out.extend(flatten(item))
        elif item.get("actionType") in (A.WHEN_ANY, A.WHEN_ALL):
            out.extend(flatten(item.get("compoundActions") or []))
        else:
            out.append(_decode(item))
    return out


def _decode(item: dict[str, Any]) -> Action:
    kind = A(item["actionType"])
    retry = item.get("retryOptions")
    name = item.get("functionName") or item.get("externalEventName")
    if kind in ENTITY_ACTIONS:
        name = item.get("instanceId") or name
    return Action(
        kind=kind,
        name=name,
        input=item.get("input"),
        retry=RetryPolicy.from_json(retry) if retry else None,
        fire_at=item.get("fireAt"),
        instance_id=item.get("instanceId"),
        is_canceled=bool(item.get("isCanceled", False)),
        version=item.get("version"),
    )


def nondeterminism(recorded: list[dict[str, Any]], replayed: list[Action], *, finished: bool) -> str | None:
    """The mismatch between the recorded signatures and a replay, or None when the replay is deterministic.

    Mirrors DTFx NonDeterministicOrchestrationException: an action at a position history already holds must be
    the same type and target; a replay that no longer schedules a recorded action is also a mismatch.
    """
    for position, (expected, actual) in enumerate(zip(recorded, replayed, strict=False)):
        if expected != actual.signature:
            return _message(position, describe(expected), describe(actual.signature))
    if len(replayed) < len(recorded) and finished:
        position = len(replayed)
        return _message(position, describe(recorded[position]), "nothing")
    return None


def _message(position: int, expected: str, actual: str) -> str:
    return (
        f"Non-Deterministic workflow detected: history recorded {expected} at action position {position}, "
        f"but the replay scheduled {actual}. Was a change made to the orchestrator code after this instance "
        f"had already started running?"
    )
