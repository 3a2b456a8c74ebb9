"""`python -m benchmarks azure_cost [--orders N] [--json]`: what one order costs on Azure, counted from a run.

It runs the local system and counts, per order, what the Azure services would be asked to do: Cosmos DB operations by
container and kind with their estimated RU (`RU_RULES`), Service Bus operations by kind and queue
(`SERVICE_BUS_OPERATIONS`), function executions, Durable activities, episodes, history events and the Durable Task
Scheduler's billed actions. Scenarios of N orders at once: `happy`, `hang`, `permanent`; the idle background is
subtracted. Nothing in the product changes. Writes benchmarks/results/azure_cost.json and azure_cost.md; prints the
per-order figures and the monthly table (1, 10 and 100 orders/s); with --json the last line printed is the result
document. `PRICES`/`RU_RULES` cite their pages; docs/cost.md explains them; docs/modules-host.md how it counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._azure_cost_figures import (
    MONTH_S,
    PRICES,
    QUERY_KINDS,
    RATES,
    READ_ON,
    RU_PER_ITEM_RETURNED,
    RU_RULES,
    SOURCES,
    Price,
    Source,
)
from ._azure_cost_floors import TARGETS, floors, floors_table
from ._azure_cost_meter import (
    COUNT_DIR_VARIABLE,
    METER,
    SCOPE,
    SITECUSTOMIZE,
    TIMER_FUNCTIONS,
    Meter,
    activate_child,
    key,
    metered,
    split,
)
from ._azure_cost_model import (
    cosmos_provisioned,
    cosmos_ru,
    database_of,
    dts_actions,
    monthly,
    namespace_capacity,
    per_order,
    seconds_of,
    storage_model,
    subtract,
    summarize,
    tiered,
)
from ._azure_cost_run import SCENARIOS, MeteredRun, Scenario, background, run

__all__ = [
    "COUNT_DIR_VARIABLE",
    "METER",
    "MONTH_S",
    "PRICES",
    "QUERY_KINDS",
    "RATES",
    "READ_ON",
    "RU_PER_ITEM_RETURNED",
    "RU_RULES",
    "SCENARIOS",
    "SCOPE",
    "SITECUSTOMIZE",
    "SOURCES",
    "TARGETS",
    "TIMER_FUNCTIONS",
    "Meter",
    "MeteredRun",
    "Price",
    "Scenario",
    "Source",
    "activate_child",
    "background",
    "cosmos_provisioned",
    "cosmos_ru",
    "database_of",
    "dts_actions",
    "floors",
    "floors_table",
    "key",
    "main",
    "markdown",
    "metered",
    "monthly",
    "monthly_table",
    "namespace_capacity",
    "namespace_table",
    "per_order",
    "per_order_table",
    "recovery_table",
    "run",
    "seconds_of",
    "split",
    "storage_model",
    "subtract",
    "summarize",
    "tiered",
]


# --- output ------------------------------------------------------------------------------------------------------
def _n(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "not found"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"


def per_order_table(doc: Mapping[str, Any]) -> str:
    rows = [
        ("Cosmos DB operations", lambda r: _n(r["cosmos"]["operations"])),
        ("  point reads", lambda r: _n(_sum_op(r, "point_read"))),
        ("  creates", lambda r: _n(_sum_op(r, "create"))),
        ("  replaces (If-Match)", lambda r: _n(_sum_op(r, "replace"))),
        ("  upserts / deletes (recovery index)", lambda r: f"{_n(_sum_op(r, 'upsert'))} / {_n(_sum_op(r, 'delete'))}"),
        (
            "  queries (1 partition / cross-partition / counts)",
            lambda r: " / ".join(_n(_sum_op(r, k)) for k in QUERY_KINDS),
        ),
        ("Cosmos DB RU (estimate)", lambda r: _n(r["cosmos"]["ru"], 1)),
        ("Service Bus operations (devhost + Agent)", lambda r: _n(r["servicebus"]["operations"])),
        ("  of which found nothing", lambda r: _n(sum(r["servicebus"]["empty"].values()))),
        (
            "  messages sent / received",
            lambda r: f"{_n(r['servicebus']['messages_sent'])} / {_n(r['servicebus']['messages_received'])}",
        ),
        ("Service Bus operations of the client app", lambda r: _n(r["servicebus"]["client"]["operations"])),
        ("Function executions (triggers + episodes + activities)", lambda r: _n(r["functions"]["executions"])),
        (
            "Durable instances / activities / episodes / history events",
            lambda r: " / ".join(
                _n(r["durable"][k]) for k in ("instances", "activities", "episodes", "history_events")
            ),
        ),
        ("Durable Task Scheduler actions", lambda r: _n(r["durable"]["dts_actions"])),
        (
            "Azure Storage transactions (Durable Azure Storage backend, our model)",
            lambda r: _n(r["durable"]["azure_storage_transactions_model"]),
        ),
    ]
    names = list(doc["per_order"])
    lines = ["| per order | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(get(doc["per_order"][n]) for n in names) + " |")
    return "\n".join(lines)


def recovery_table(doc: Mapping[str, Any]) -> str:
    """What one recovery adds to an order: the scenario's figures minus the happy path's."""
    rows = [
        ("Cosmos DB operations", ("cosmos", "operations")),
        ("Cosmos DB RU (estimate)", ("cosmos", "ru")),
        ("Service Bus operations (devhost + Agent)", ("servicebus", "operations")),
        ("Service Bus messages sent", ("servicebus", "messages_sent")),
        ("Function executions", ("functions", "executions")),
        ("Durable instances", ("durable", "instances")),
        ("Durable episodes", ("durable", "episodes")),
        ("Durable history events", ("durable", "history_events")),
        ("Durable Task Scheduler actions", ("durable", "dts_actions")),
        ("Azure Storage transactions (model)", ("durable", "azure_storage_transactions_model")),
    ]
    names = list(doc["per_recovery"])
    lines = ["| one recovery adds | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, (part, field_) in rows:
        lines.append(f"| {label} | " + " | ".join(_n(doc["per_recovery"][n][part][field_]) for n in names) + " |")
    return "\n".join(lines)


def namespace_table(doc: Mapping[str, Any]) -> str:
    lines = ["| one Standard namespace (1,000 credits/s) | credits per order | most orders/s |", "|---|---|---|"]
    cap = doc["servicebus_namespace"]["happy"]
    for label, k in (
        ("data operations only (1 credit per message)", "messages_only"),
        ("calls that moved or settled a message", "calls_without_empty"),
        ("every API call", "all_calls"),
    ):
        lines.append(f"| {label} | {_n(cap['credits_per_order'][k])} | {_n(cap['max_orders_per_s'][k], 1)} |")
    return "\n".join(lines)


def _sum_op(result: Mapping[str, Any], op: str) -> float:
    return sum(ops.get(op, 0) for ops in result["cosmos"]["by_container"].values())


def monthly_table(doc: Mapping[str, Any]) -> str:
    lines = [
        "| orders/s | Cosmos RU/month | Cosmos serverless | Cosmos manual (RU/s) | Cosmos autoscale (Tmax) | "
        "Service Bus ops/month | SB credits/s (messages / all calls) | fits 1 namespace | SB (Azure China, CNY) | "
        "Durable episodes/month (Azure Storage tx, model) | DTS actions/s (Dedicated CUs; Consumption fits) | "
        "Function executions/month |",
        "|---" * 12 + "|",
    ]
    for m in doc["monthly"]:
        c, s, d = m["cosmos"], m["servicebus"], m["durable"]
        manual = " + ".join(f"{p['manual_rus']:.0f}" for p in c["provisioned_by_database"].values())
        tmax = " + ".join(f"{p['autoscale_tmax']:.0f}" for p in c["provisioned_by_database"].values())
        lines.append(
            f"| {m['orders_per_s']} | {c['ru_per_month'] / 1e6:,.1f} M | ${c['serverless_usd']:,.2f}"
            f"{'' if c['serverless_fits_one_partition'] else ' (over 5,000 RU/s in a container)'} | "
            f"${c['manual_usd']:,.2f} ({manual}) | ${c['autoscale_usd']:,.2f} ({tmax}) | "
            f"{s['operations_per_month'] / 1e6:,.1f} M (+{s['client_operations_per_month'] / 1e6:,.1f} M client) | "
            f"{s['credits_per_s_messages']:,.0f} / {s['credits_per_s_all_calls']:,.0f} | "
            f"{_n(s['fits_one_namespace_messages_only'])} / {_n(s['fits_one_namespace'])} | "
            f"¥{s['cny_azure_china']:,.0f} | {d['episodes_per_month'] / 1e6:,.1f} M "
            f"({d['azure_storage_transactions_per_month_model'] / 1e6:,.0f} M) | "
            f"{d['dts_actions_per_s']:,.0f} ({d['dts_dedicated_cus']}; {_n(d['dts_consumption_fits'])}) | "
            f"{m['functions']['executions_per_month'] / 1e6:,.1f} M |"
        )
    return "\n".join(lines)


def markdown(doc: Mapping[str, Any]) -> str:
    sources = "\n".join(
        f'- `{k}`: {s["url"]} (read {s["read_on"]}): "{s["says"]}"' + (f" ({s['note']})" if s["note"] else "")
        for k, s in doc["sources"].items()
    )
    return (
        f"# Cost per order on Azure (generated by `python -m benchmarks azure_cost`)\n\n"
        f"{doc['params']['orders_per_scenario']} orders per scenario, run {doc.get('measured_at', '')}. "
        "See docs/cost.md for how each figure is counted and priced.\n\n"
        f"## Per order\n\n{per_order_table(doc)}\n\n"
        f"## Each count against its floor (happy path)\n\n{floors_table(doc['floors'])}\n\n"
        f"## Per recovery (scenario minus happy path)\n\n{recovery_table(doc)}\n\n"
        f"## Service Bus: orders/s one Standard namespace carries (happy path, with the client app)\n\n"
        f"{namespace_table(doc)}\n\n"
        f"## Monthly, happy path (USD unless marked; 'not found' = no price in the stored docs)\n\n"
        f"{monthly_table(doc)}\n\n"
        "Service Bus, Durable Task Scheduler, Azure Storage and Flex Consumption prices in USD were not found in "
        "the stored docs; their quantities are above.\n\n## Sources\n\n" + sources + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks azure_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--orders", type=int, default=10, help="orders per scenario (default 10)")
    p.add_argument("--idle-seconds", type=float, default=15.0, help="idle window for the background (default 15)")
    p.add_argument("--json", action="store_true", help="print the result document as the last line")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="folder for azure_cost.json and azure_cost.md (default benchmarks/results)",
    )
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (logs, stores, counts)")
    args = p.parse_args(argv)
    if args.orders < 1:
        p.error("--orders must be at least 1")
    from .common import environment

    doc = run(args.orders, args.idle_seconds, args.keep, lambda line: print(line, file=sys.stderr, flush=True))
    doc["environment"] = environment()
    doc["measured_at"] = doc["environment"]["measured_at"]
    doc["floors"] = floors(doc["per_order"]["happy"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "azure_cost.json").write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    (args.out / "azure_cost.md").write_text(markdown(doc))
    for table in (
        per_order_table(doc),
        floors_table(doc["floors"]),
        recovery_table(doc),
        namespace_table(doc),
        monthly_table(doc),
    ):
        print(table)
        print()
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
