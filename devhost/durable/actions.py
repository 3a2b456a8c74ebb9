"""Orchestrator actions: decode the SDK's `actions` JSON into atomic actions, to see what an episode asks for.

Shapes: azure/durable_functions/models/actions/*.py and OrchestratorState.to_json. ReplaySchema V1 sends a list of
lists (one list per yield); V2/V3 send one flat list in which WhenAny/WhenAll are compound actions holding the
children not scheduled before (`compoundActions`). How the extension replays them: shim.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from azure.durable_functions.models.actions.ActionType import ActionType as A

from .retry import RetryPolicy

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
