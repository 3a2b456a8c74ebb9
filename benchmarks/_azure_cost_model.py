"""The arithmetic of benchmarks/azure_cost.py (pure): from per-process counts to one order's figures, and from those
to monthly figures at a rate."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ._azure_cost_figures import (
    COSMOS_AUTOSCALE_STEP,
    COSMOS_MANUAL_MIN_RUS,
    COSMOS_SERVERLESS_PARTITION_RUS,
    DTS_ACTIONS_PER_CU_S,
    DTS_CONSUMPTION_MAX_ACTIONS_S,
    DTS_MAX_CUS,
    HOURS_PER_MONTH,
    MONTH_S,
    PRICES,
    RU_PER_ITEM_RETURNED,
    RU_RULES,
    SERVICEBUS_CREDITS_PER_S,
    SERVICEBUS_TIERS_CN,
)
from ._azure_cost_meter import TIMER_FUNCTIONS, split


def per_order(
    delta: Mapping[str, float],
    idle: Mapping[str, float],
    idle_s: float,
    idle_ticks: Mapping[str, float],
    span_s: float,
    ticks: Mapping[str, float],
    orders: int,
) -> dict[str, float]:
    """One process's counts per order: the scenario's delta less the background that fell in its window (per timer
    tick under a timer's scope, per second otherwise, both from the idle window), never below 0, divided by `orders`."""
    out: dict[str, float] = {}
    for counter_key, value in delta.items():
        scope = split(counter_key)[1]
        background = 0.0
        if scope in TIMER_FUNCTIONS:
            if idle_ticks.get(scope):
                background = idle.get(counter_key, 0) / idle_ticks[scope] * ticks.get(scope, 0)
        elif idle_s > 0:
            background = idle.get(counter_key, 0) / idle_s * span_s
        left = max(0.0, value - background) / orders
        if left:
            out[counter_key] = left
    return out


def cosmos_ru(
    ops: Mapping[tuple[str, str], float],
    items: Mapping[tuple[str, str], float],
    rules: Mapping[str, float] = RU_RULES,
    per_item: float = RU_PER_ITEM_RETURNED,
    partitions: int = 1,
) -> dict[str, float]:
    """Estimated RU by container (and 'total') for operation counts {(container, op): n} and items returned by
    queries {(container, op): n}. A cross-partition query or count is charged once per physical partition."""
    by_container: Counter[str] = Counter()
    for (container, op), n in ops.items():
        each = rules[op] * (partitions if op in ("query_cross", "count_cross") else 1)
        by_container[container] += n * each
    for (container, _op), n in items.items():
        by_container[container] += n * per_item
    out = {c: round(v, 4) for c, v in sorted(by_container.items())}
    out["total"] = round(sum(by_container.values()), 4)
    return out


def tiered(quantity: float, tiers: tuple[tuple[float, float], ...]) -> float:
    """The price of `quantity` units under (up_to, price per million) tiers, each applied to the part within it."""
    cost, below = 0.0, 0.0
    for up_to, per_million in tiers:
        part = max(0.0, min(quantity, up_to) - below)
        cost += part / 1e6 * per_million
        below = up_to
        if quantity <= up_to:
            break
    return cost


def _ceil_to(value: float, step: float) -> float:
    return math.ceil(value / step - 1e-9) * step


def cosmos_provisioned(ru_per_s: float) -> dict[str, float]:
    """Monthly USD for one database's shared throughput at a steady `ru_per_s`: manual (rounded up to 100 RU/s, at
    least the 400 RU/s entry point) and autoscale (Tmax in steps of 1000; billed for the RU/s reached, at least
    0.1*Tmax, at the autoscale rate)."""
    manual = max(COSMOS_MANUAL_MIN_RUS, _ceil_to(ru_per_s, 100))
    tmax = max(COSMOS_AUTOSCALE_STEP, _ceil_to(ru_per_s, COSMOS_AUTOSCALE_STEP))
    billed = max(_ceil_to(ru_per_s, 100), tmax / 10)
    manual_rate = PRICES["cosmos_manual_per_100rus_hour"].value
    auto_rate = PRICES["cosmos_autoscale_per_100rus_hour"].value
    return {
        "ru_per_s": round(ru_per_s, 3),
        "manual_rus": manual,
        "manual_usd": round(manual / 100 * manual_rate * HOURS_PER_MONTH, 2),
        "autoscale_tmax": tmax,
        "autoscale_billed_rus": billed,
        "autoscale_usd": round(billed / 100 * auto_rate * HOURS_PER_MONTH, 2),
    }


def monthly(order: Mapping[str, Any], background: Mapping[str, Any], rate: float) -> dict[str, Any]:
    """The monthly figures at `rate` orders/s from one order's counts (`order`, as `summarize` makes them) and the
    fixed background per second (`background`: cosmos_ru_by_database, functions_executions per second)."""
    orders = rate * MONTH_S
    cosmos = order["cosmos"]
    by_db = {
        db: ru * rate + background.get("cosmos_ru_per_s_by_database", {}).get(db, 0.0)
        for db, ru in cosmos["ru_by_database"].items()
    }
    for db, ru in background.get("cosmos_ru_per_s_by_database", {}).items():
        by_db.setdefault(db, ru)
    ru_month = sum(by_db.values()) * MONTH_S
    busiest = max((ru * rate for ru in cosmos["ru_by_container"].values()), default=0.0)
    provisioned = {db: cosmos_provisioned(ru) for db, ru in sorted(by_db.items())}
    sb = order["servicebus"]
    sb_ops = sb["operations"] * orders
    client_ops = sb["client"]["operations"] * orders
    durable = order["durable"]
    actions_s = durable["dts_actions"] * rate
    executions = order["functions"]["executions"] * orders + background.get("executions_per_s", 0.0) * MONTH_S
    return {
        "orders_per_s": rate,
        "orders_per_month": orders,
        "cosmos": {
            "ru_per_month": round(ru_month),
            "serverless_usd": round(ru_month / 1e6 * PRICES["cosmos_serverless_per_million_ru"].value, 2),
            "busiest_container_ru_per_s": round(busiest, 1),
            "serverless_fits_one_partition": busiest <= COSMOS_SERVERLESS_PARTITION_RUS,
            "provisioned_by_database": provisioned,
            "manual_usd": round(sum(p["manual_usd"] for p in provisioned.values()), 2),
            "autoscale_usd": round(sum(p["autoscale_usd"] for p in provisioned.values()), 2),
        },
        "servicebus": {
            "operations_per_month": round(sb_ops),
            "client_operations_per_month": round(client_ops),
            "credits_per_s_messages": round((sb["credits_messages"] + sb["client"]["credits_messages"]) * rate, 1),
            "credits_per_s_all_calls": round((sb["operations"] + sb["client"]["operations"]) * rate, 1),
            "fits_one_namespace": (sb["operations"] + sb["client"]["operations"]) * rate <= SERVICEBUS_CREDITS_PER_S,
            "fits_one_namespace_messages_only": (sb["credits_messages"] + sb["client"]["credits_messages"]) * rate
            <= SERVICEBUS_CREDITS_PER_S,
            "usd": None,  # not found in the stored docs
            "cny_azure_china": round(
                PRICES["servicebus_cn_base_hour"].value * HOURS_PER_MONTH
                + tiered(sb_ops + client_ops, SERVICEBUS_TIERS_CN),
                2,
            ),
        },
        "durable": {
            "episodes_per_month": round(durable["episodes"] * orders),
            "azure_storage_transactions_per_month_model": round(durable["azure_storage_transactions_model"] * orders),
            "activities_per_month": round(durable["activities"] * orders),
            "history_events_per_month": round(durable["history_events"] * orders),
            "dts_actions_per_s": round(actions_s, 2),
            "dts_dedicated_cus": max(1, math.ceil(actions_s / DTS_ACTIONS_PER_CU_S - 1e-9)),
            "dts_dedicated_fits": actions_s <= DTS_ACTIONS_PER_CU_S * DTS_MAX_CUS,
            "dts_consumption_fits": actions_s <= DTS_CONSUMPTION_MAX_ACTIONS_S,
            "usd": None,  # DTS prices and Azure Storage transactions per episode: not found in the stored docs
        },
        "functions": {"executions_per_month": round(executions), "usd": None},  # Flex Consumption price: not found
    }


def namespace_capacity(order: Mapping[str, Any]) -> dict[str, Any]:
    """Credits one order draws from a Standard namespace's 1,000 per second (ours and the client app's calls: they share
    the namespace), and so the most orders/s one namespace carries, three ways: only the throttling doc's data
    operations (1 credit per message sent, received or peeked: the fewest credits), every call that moved a message or
    settled one (the empty receives and session accepts left out), and every API call."""
    sb, client = order["servicebus"], order["servicebus"]["client"]
    credits = {
        "messages_only": sb["credits_messages"] + client["credits_messages"],
        "calls_without_empty": (
            sb["operations"] - sum(sb["empty"].values()) + client["operations"] - sum(client["empty"].values())
        ),
        "all_calls": sb["operations"] + client["operations"],
    }
    return {
        "credits_per_order": {k: round(v, 3) for k, v in credits.items()},
        "max_orders_per_s": {k: round(SERVICEBUS_CREDITS_PER_S / v, 1) if v else None for k, v in credits.items()},
    }


def dts_actions(by_type: Mapping[str, float]) -> float:
    """Durable Task Scheduler actions from history events (SOURCES['dts_billing']): the orchestration's start, two per
    activity (scheduling, processing the result), one per fired timer and one per raised external event."""
    return (
        by_type.get("EXECUTION_STARTED", 0)
        + 2 * by_type.get("TASK_SCHEDULED", 0)
        + by_type.get("TIMER_FIRED", 0)
        + by_type.get("EVENT_RAISED", 0)
    )


# Azure Storage transactions of the Durable Azure Storage provider, by history event (our model from the documented
# components, SOURCES['durable_azure_storage']): the start puts a message on a control queue and inserts the instance
# row; an episode gets and deletes its control-queue message(s), loads the history (range query), appends history rows
# (a table batch) and updates the instance row; an activity is a work-item message put, got and deleted, and its result
# a control-queue message put; a durable timer and a raised event are one control-queue message put each.
STORAGE_MODEL: dict[str, int] = {
    "EXECUTION_STARTED": 2,
    "ORCHESTRATOR_STARTED": 5,
    "TASK_SCHEDULED": 4,
    "TIMER_CREATED": 1,
    "EVENT_RAISED": 1,
}


def storage_model(by_type: Mapping[str, float]) -> float:
    return sum(n * by_type.get(event, 0) for event, n in STORAGE_MODEL.items())


def database_of(container: str) -> str:
    """The Cosmos database of a container (orderflow.azure.cosmos.CosmosNames): orders in `orders`, everything else in
    `state`."""
    return "orders" if container == "orders" else "state"


def summarize(per_role: Mapping[str, Mapping[str, float]], durable: Mapping[str, Any]) -> dict[str, Any]:
    """One order's figures from per-order counts by process role (devhost, agent, client) and devhost's Durable counts
    per order (compare_counts.durable_counts / orders)."""
    ops: Counter[tuple[str, str]] = Counter()
    items: Counter[tuple[str, str]] = Counter()
    cosmos_by_process: Counter[str] = Counter()
    sb = {"product": _sb_totals(), "client": _sb_totals()}
    functions: Counter[str] = Counter()
    for role, counts in per_role.items():
        side = sb["client" if role == "client" else "product"]
        for counter_key, n in counts.items():
            kind, scope, a, b = split(counter_key)
            if kind == "cosmos":
                ops[(a, b)] += n
                cosmos_by_process[f"{role}:{scope}"] += n
            elif kind == "cosmos_items":
                items[(a, b)] += n
            elif kind == "sb":
                side["operations"] += n
                side["by_operation"][b] += n
                side["by_queue"][a] += n
            elif kind == "sb_msgs":
                side[f"messages_{b}"] += n
            elif kind == "sb_empty":
                side["empty"][b] += n
            elif kind == "fn" and scope not in TIMER_FUNCTIONS:
                functions[scope] += n
    # Orchestrator episodes and activities come from the Durable history (by order prefix): a cancelled timer that
    # fires after the window would put an episode of these orders outside the counters' window.
    from_history = {"order_workflow": durable["episodes"]}
    triggers = {name: n for name, n in functions.items() if name in ("submission", "agent_replies")}
    executions = sum(triggers.values()) + durable["episodes"] + durable["activities"]
    ru = cosmos_ru(ops, items)
    ru_by_db: Counter[str] = Counter()
    for container, value in ru.items():
        if container != "total":
            ru_by_db[database_of(container)] += value
    return {
        "cosmos": {
            "operations": round(sum(ops.values()), 3),
            "by_container": _nested(ops),
            "items_returned": _nested(items),
            "by_process": {k: round(v, 3) for k, v in sorted(cosmos_by_process.items())},
            "ru": ru["total"],
            "ru_by_container": {k: v for k, v in ru.items() if k != "total"},
            "ru_by_database": {k: round(v, 4) for k, v in sorted(ru_by_db.items())},
        },
        "servicebus": {**_sb_out(sb["product"]), "client": _sb_out(sb["client"])},
        "functions": {
            "executions": round(executions, 3),
            "by_function": {
                **{k: round(v, 3) for k, v in sorted(triggers.items())},
                **from_history,
                "activities": durable["activities"],
            },
            "counted_by_devhost": {k: round(v, 3) for k, v in sorted(functions.items())},
        },
        "durable": {
            **durable,
            "dts_actions": round(dts_actions(durable["history_events_by_type"]), 3),
            "azure_storage_transactions_model": round(storage_model(durable["history_events_by_type"]), 3),
        },
    }


def _sb_totals() -> dict[str, Any]:
    return {
        "operations": 0.0,
        "by_operation": Counter(),
        "by_queue": Counter(),
        "empty": Counter(),
        "messages_sent": 0.0,
        "messages_received": 0.0,
        "messages_peeked": 0.0,
    }


def _sb_out(t: Mapping[str, Any]) -> dict[str, Any]:
    credits = t["messages_sent"] + t["messages_received"] + t["messages_peeked"]
    return {
        "operations": round(t["operations"], 3),
        "by_operation": {k: round(v, 3) for k, v in sorted(t["by_operation"].items())},
        "by_queue": {k: round(v, 3) for k, v in sorted(t["by_queue"].items())},
        "empty": {k: round(v, 3) for k, v in sorted(t["empty"].items())},
        "messages_sent": round(t["messages_sent"], 3),
        "messages_received": round(t["messages_received"], 3),
        "messages_peeked": round(t["messages_peeked"], 3),
        # the throttling doc's data operations: 1 credit per message sent, received or peeked
        "credits_messages": round(credits, 3),
    }


def _nested(flat: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (a, b), n in sorted(flat.items()):
        out.setdefault(a, {})[b] = round(n, 3)
    return out


def subtract(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """a − b for nested dicts of numbers (what one recovery adds to an order: scenario minus happy path)."""
    out: dict[str, Any] = {}
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k, 0), b.get(k, 0)
        if isinstance(x, Mapping) or isinstance(y, Mapping):
            out[k] = subtract(x if isinstance(x, Mapping) else {}, y if isinstance(y, Mapping) else {})
        elif isinstance(x, bool | str) or isinstance(y, bool | str) or x is None or y is None:
            continue
        else:
            out[k] = round(x - y, 3)
    return out


def seconds_of(schedule: str) -> float | None:
    """The period of a `*/N * * * * *` NCRONTAB schedule, else None."""
    first = schedule.split()[0] if schedule.split() else ""
    return float(first[2:]) if first.startswith("*/") and first[2:].isdigit() else None
