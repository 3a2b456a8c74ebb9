"""The floor of each per-order count of `python -m benchmarks azure_cost` (issue 27), from the happy path's own
figures: the least that this design's necessary work asks of Azure, the issue's target, and what the count pays above
its floor. A floor is computed from the run (messages, writes, activities, events), so a change of design moves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._azure_cost_figures import RU_RULES

# Issue 27's targets per happy order (None: the issue sets none).
TARGETS: dict[str, float | None] = {
    "servicebus": 30,
    "servicebus_client": None,
    "cosmos_ru": 60,
    "cosmos_operations": None,
    "executions": 10,
    "episodes": 6,
    "dts_actions": None,
}
WRITES = ("create", "replace", "upsert", "delete")
FLOOR_CONTAINERS = ("orders", "state")  # the order and its state record; the admission and breaker documents are not
SESSION_QUEUES = 3  # orders-inbound, agent-requests, agent-replies: each order's messages hold one session on each


def _row(name: str, label: str, measured: float, floor: float, floor_is: str, above: str) -> dict[str, Any]:
    target = TARGETS[name]
    return {
        "count": name,
        "label": label,
        "measured": round(measured, 2),
        "floor": round(floor, 2),
        "target": target,
        "meets_target": None if target is None else measured <= target,
        "floor_is": floor_is,
        "above_floor": above,
    }


def floors(happy: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per count: measured, floor, target, what the floor is and what the count pays above it."""
    sb, cosmos, durable = happy["servicebus"], happy["cosmos"], happy["durable"]
    client = sb["client"]
    necessary = [
        (op, n)
        for container, ops in cosmos["by_container"].items()
        if container in FLOOR_CONTAINERS
        for op, n in ops.items()
        if op in WRITES
    ]
    writes_ru, writes = sum(RU_RULES[op] * n for op, n in necessary), sum(n for _, n in necessary)
    events = durable["history_events_by_type"].get("EVENT_RAISED", 0)
    fired = durable["history_events_by_type"].get("TIMER_FIRED", 0)
    activities = durable["activities"]
    episodes_floor = durable["instances"] + activities + events + fired
    by_function = happy["functions"]["by_function"]
    triggers = sum(n for name, n in by_function.items() if name not in ("order_workflow", "activities"))
    return [
        _row(
            "servicebus",
            "Service Bus operations (devhost + Agent)",
            sb["operations"],
            sb["messages_sent"] + 2 * sb["messages_received"],
            "each message sent once, received once, completed once",
            f"session holds: on each of the {SESSION_QUEUES} session queues an accept, the receive that waits "
            "sessionIdleTimeout and finds the session idle, and a release (the Functions host's session processor); "
            f"{sum(sb['empty'].values()):g} calls found nothing",
        ),
        _row(
            "servicebus_client",
            "Service Bus operations of the client app",
            client["operations"],
            client["messages_sent"] + 2 * client["messages_received"],
            "the order sent once; each status received once and completed once",
            "the client's session hold on its reply queue (accept, idle receive, release)",
        ),
        _row(
            "cosmos_ru",
            "Cosmos DB RU (estimate)",
            cosmos["ru"],
            writes_ru,
            "the writes alone (creates 5.5 RU, If-Match replaces 11 RU): the state record's create and one write "
            "per decision (the Supervisor reads each step's CompleteBy from it), the order's create and its TTL",
            "point reads before each If-Match write and of the stored order (1 RU each), the admission document's "
            "reads and write (coalesced within a process), the breaker document's cached read",
        ),
        _row(
            "cosmos_operations",
            "Cosmos DB operations",
            cosmos["operations"],
            writes,
            "the order's and its state record's writes alone",
            "point reads (the etag of each If-Match write, the stored order, the breaker and admission documents)",
        ),
        _row(
            "executions",
            "Function executions",
            happy["functions"]["executions"],
            triggers + episodes_floor + activities,
            "the triggers (the submission, one per Agent reply), the episodes' floor, one per activity",
            "episodes above their floor",
        ),
        _row(
            "episodes",
            "Durable orchestrator episodes",
            durable["episodes"],
            episodes_floor,
            "the start, then one per activity result and one per raised event or fired timer: Durable replays the "
            "orchestrator for each new event (events that arrive together share one)",
            "replays that no new event asked for",
        ),
        _row(
            "dts_actions",
            "Durable Task Scheduler actions",
            durable["dts_actions"],
            durable["instances"] + 2 * activities + events + fired,
            "the start, two per activity (schedule, result), one per raised event or fired timer",
            "actions that no activity, event or timer asked for",
        ),
    ]


def floors_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| per happy order | measured | floor | target | the floor is | above the floor |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        above = r["above_floor"] if r["measured"] > r["floor"] else "nothing (at its floor)"
        target = "—" if r["target"] is None else f"{r['target']:g} ({'met' if r['meets_target'] else 'missed'})"
        lines.append(f"| {r['label']} | {r['measured']:g} | {r['floor']:g} | {target} | {r['floor_is']} | {above} |")
    return "\n".join(lines)
