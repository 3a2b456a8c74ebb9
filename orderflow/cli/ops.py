"""The operator commands of `orderflow`: order, orders, resubmit, keep, summary, dlq, breaker and top, over
`orderflow.operations` (the same answers as the HTTP API) and `orderflow.deadletters`.

They act on the stores and the bus directly, as the operators' identity (infra/; locally the `operators` rights), not
through the HTTP API: a resubmit's audit names --by, else the OS user. An order is addressed by its key
(orderflow/apps.py): `<app>.<orderId>`, or the legacy app's bare orderId."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from orderflow import deadletters
from orderflow.cli import breaker as breaker_command
from orderflow.cli.common import CliError, dumps, one_line, operations, operator_name
from orderflow.clock import Clock, SystemClock
from orderflow.operations import PAGE_SIZE_MAX, Operations, check_order_id
from orderflow.ports import BusClient
from orderflow.text import printable

HISTORY_SHOWN = 12  # newest history events `order` prints per attempt (all of them with --json)
ORDER_KEY_HELP = "the order's key: <app>.<orderId> (e.g. partner.X1), or the legacy app's bare orderId"


def add_commands(sub: Any) -> None:
    def command(name: str, text: str, description: str | None = None, read: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=text, description=description or text)
        p.add_argument(
            "--app-dir",
            type=Path,
            default=Path("."),
            help="app folder whose local.settings.json holds the settings (default: .)",
        )
        if read:
            p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(prog=f"orderflow {name}")
        return p

    o = command(
        "order",
        "one order: its state record, steps, compensation log and every attempt's orchestration",
        "The state record (ProcessState, LockedBy, CompleteBy, FailureCount, errors), the steps and the "
        "compensation log, the resubmit audit, the stored order, and each attempt's orchestration status "
        "and history from the Durable HTTP API (DurableTaskApiUrl, else devhost's; DurableTaskApiKey on "
        "Azure).",
    )
    o.add_argument("order_id", metavar="ORDER_KEY", help=ORDER_KEY_HELP)
    o.set_defaults(run=_order)

    ls = command("orders", "orders in one state, a page at a time (oldest change first)")
    ls.add_argument("--state", required=True, help="ProcessState: Pending, Processing, Error, ...")
    ls.add_argument("--app", default=None, metavar="NAME", help="only this submitting app's orders (SubmittingApps)")
    ls.add_argument(
        "--older-than", default=None, metavar="D", help="only orders unchanged for at least D (90s, 15m, 2h, 3d)"
    )
    ls.add_argument("--page-size", type=int, default=50, help=f"1..{PAGE_SIZE_MAX} (default 50)")
    ls.add_argument("--continuation", default=None, help="the token the previous page printed")
    ls.set_defaults(run=_orders)

    r = command(
        "resubmit",
        "run a failed order again with a fresh failure budget (Error or CompensationFailed)",
        "Error → Pending (the Starter claims it as a new attempt), CompensationFailed → "
        "CompensationInProgress (its compensation is tried again); FailureCount (compensationFailures) back "
        "to 0; audited on the record: who, when, why. Any other state is refused.",
    )
    _audited_action(r, _resubmit)

    k = command(
        "keep",
        "keep an order from expiring (its state record and stored order are never deleted)",
        "A finished order's documents expire FinishedOrderRetentionSeconds after its terminal status was sent "
        "(docs/retention.md); a kept order's never do, in any state. Audited on the record: who, when, why.",
    )
    _audited_action(k, _keep)

    s = command(
        "summary",
        "counts per state, oldest Pending and Processing, expired work, dead letters, breakers, Supervisor, alarms",
    )
    s.add_argument(
        "--dead-letter-cap",
        type=int,
        default=1000,
        help="on Azure, count at most this many dead letters per queue by peeking (default 1000)",
    )
    s.set_defaults(run=_summary)

    t = command("top", "a live dashboard of the summary plus throughput (Ctrl-C to stop)", read=False)
    t.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    t.add_argument("--iterations", type=int, default=None, help="stop after this many refreshes")
    t.set_defaults(run=None, top=True)

    d = sub.add_parser(
        "dlq",
        help="dead-letter queues: list, show, replay",
        description="Dead-lettered messages of one queue, with the reasons the app gave.",
    )
    dsub = d.add_subparsers(dest="dlq_command", required=True, metavar="{list,show,replay}")
    dl = dsub.add_parser("list", help="the dead-lettered messages (peeked: nothing is removed)")
    dl.add_argument("queue", metavar="QUEUE")
    dl.add_argument("--max", type=int, default=50, help="most messages (default 50)")
    ds = dsub.add_parser("show", help="one dead-lettered message whole (body and properties)")
    ds.add_argument("queue", metavar="QUEUE")
    ds.add_argument("sequence_number", metavar="SEQ", type=int, help="its sequence number (from `dlq list`)")
    dr = dsub.add_parser(
        "replay",
        help="send dead-lettered messages back to their queue, then remove them",
        description="Resend each with its original body and properties plus a replay marker "
        "(orderflowReplayOf ...) and MessageId <original>:replay:<seq>, then complete "
        "it on the dead-letter queue. Safe at least once: a repeat is absorbed by "
        "duplicate detection and by the consumer's idempotency.",
    )
    dr.add_argument("queue", metavar="QUEUE")
    which = dr.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--seq",
        type=int,
        action="append",
        default=None,
        metavar="SEQ",
        help="the message's sequence number (repeatable)",
    )
    which.add_argument("--all", action="store_true", help="every dead-lettered message (at most --max)")
    dr.add_argument("--max", type=int, default=500, help="with --all, at most this many (default 500)")
    dr.add_argument("--by", default=None, help="who (default: $USER), kept in the replay marker")
    for p in (dl, ds, dr):
        p.add_argument(
            "--app-dir",
            type=Path,
            default=Path("."),
            help="app folder whose local.settings.json holds the settings (default: .)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(prog="orderflow dlq", run=_dlq)

    b = sub.add_parser(
        "breaker",
        help="the shared circuit breaker: show, force open, force closed",
        description="show prints each breaker; open holds it open until an operator closes it; close "
        "closes it and resets its counts. Both raise the operator alert.",
    )
    bsub = b.add_subparsers(dest="breaker_command", required=True, metavar="{show,open,close}")
    for p in breaker_command.add_commands(bsub):
        p.add_argument(
            "--app-dir",
            type=Path,
            default=Path("."),
            help="app folder whose local.settings.json holds the settings (default: .)",
        )
    b.set_defaults(prog="orderflow breaker", run=None, breaker=True)


# --- commands: each returns what to print --------------------------------------------------------------------------


async def _order(ops: Operations, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    view = await ops.order(args.order_id)
    return dumps(view) if args.json else render_order(view)


async def _orders(ops: Operations, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    page = await ops.orders(args.state, args.older_than, args.page_size, args.continuation, args.app)
    if args.json:
        return dumps(page)
    table = _table(
        f"{page['state']} orders" + (f" of app {page['app']}" if page["app"] else ""),
        (
            "order",
            "app",
            "app's orderId",
            "attempt",
            "failures",
            "locked by",
            "complete by",
            "since",
            "age",
            "last error",
        ),
    )
    for row in page["items"]:
        table.add_row(
            row["orderId"],
            row["app"] or "-",
            row["clientOrderId"],
            str(row["attempt"]),
            str(row["failureCount"]),
            row["lockedBy"] or "-",
            row["completeBy"] or "-",
            row["updatedAt"],
            _duration(row["ageSeconds"]),
            row["lastError"] or "-",
        )
    more = f"\nnext page: --continuation {page['continuation']}" if page["continuation"] else ""
    return _render(table) + f"{len(page['items'])} order(s){more}"


def _audited_action(parser: argparse.ArgumentParser, run: Any) -> None:
    """An operator's action on one order, audited on its record: ORDER_KEY, --reason, --by."""
    parser.add_argument("order_id", metavar="ORDER_KEY", help=ORDER_KEY_HELP)
    parser.add_argument("--reason", required=True, help="why (kept on the record)")
    parser.add_argument("--by", default=None, help="who, kept on the record (default: the OS user, $USER)")
    parser.set_defaults(run=run)


async def _keep(ops: Operations, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    result = await ops.keep(args.order_id, operator_name(args.by, env), args.reason)
    if args.json:
        return dumps(result)
    kept = result["kept"]
    return (
        f"order {result['orderId']} (app {result['app'] or '-'}, {result['processState']}) kept from expiring "
        f"by {kept['by']}: {kept['reason']}"
    )


async def _resubmit(ops: Operations, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    result = await ops.resubmit(args.order_id, operator_name(args.by, env), args.reason)
    if args.json:
        return dumps(result)
    audit = result["resubmission"]
    return (
        f"order {result['orderId']} (app {result['app'] or '-'}) resubmitted: {audit['fromState']} → "
        f"{result['processState']} "
        f"(FailureCount was {audit['failureCount']}, now 0) by {audit['by']}: {audit['reason']}"
    )


async def _summary(ops: Operations, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    data = await ops.summary(args.dead_letter_cap)
    return dumps(data) if args.json else _render(summary_view(data))


async def _dlq(bus: BusClient, args: argparse.Namespace, env: Mapping[str, str], now: datetime) -> str:
    """dlq list|show|replay: the bus only (the Service Bus roles; no state-store setting is needed)."""
    try:
        if args.dlq_command == "list":
            rows = [deadletters.row(m) for m in await deadletters.peek(bus, args.queue, args.max)]
            if args.json:
                return dumps(rows)
            table = _table(
                f"dead letters of {args.queue}",
                ("seq", "message id", "session", "enqueued", "deliveries", "reason", "description"),
            )
            for r in rows:
                table.add_row(
                    str(r["sequenceNumber"]),
                    r["messageId"] or "-",
                    r["sessionId"] or "-",
                    r["enqueuedTime"] or "-",
                    str(r["deliveryCount"]),
                    r["deadLetterReason"] or "-",
                    r["deadLetterErrorDescription"] or "-",
                )
            return _render(table) + f"{len(rows)} message(s)"
        if args.dlq_command == "show":
            return dumps(await deadletters.show(bus, args.queue, args.sequence_number))
        done = await deadletters.replay(
            bus, args.queue, None if args.all else args.seq, operator_name(args.by, env), now, limit=args.max
        )
    except deadletters.DeadLetterNotFound as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        return dumps(done)
    lines = [
        f"replayed {r['sequenceNumber']} ({r['messageId']}, {r['deadLetterReason']}) as {r['replayedAs']}" for r in done
    ]
    return "\n".join(lines + [f"{len(done)} message(s) replayed to {args.queue}"])


async def run(args: argparse.Namespace, env: Mapping[str, str], clock: Clock | None) -> str:
    """The command's output (raises OpsError, CliError or another exception on failure)."""
    if getattr(args, "breaker", False):
        return await breaker_command.run(
            argparse.Namespace(**{**vars(args), "command": args.breaker_command}), env, clock or SystemClock()
        )
    if args.run is _dlq:
        from orderflow.adapters import aio_bus_from_settings

        try:
            bus = aio_bus_from_settings(env)
        except Exception as exc:
            raise CliError(f"cannot open the Service Bus client: {one_line(exc)}") from exc
        try:
            shown: str = await _dlq(bus, args, env, (clock or SystemClock()).now())
        finally:
            await bus.close()
        return shown
    if getattr(args, "order_id", None) is not None:
        check_order_id(args.order_id)
    async with operations(args.app_dir, env, clock, need_durable=args.run is _order) as ops:
        result: str = await args.run(ops, args, env)
        return result


async def top(
    args: argparse.Namespace, env: Mapping[str, str], clock: Clock | None, console: Console | None = None
) -> None:
    """Refresh the summary every --interval seconds; throughput is the terminal orders per second since the
    previous refresh."""
    console = console or Console()
    previous: tuple[float, int] | None = None
    async with operations(args.app_dir, env, clock) as ops:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            n = 0
            while args.iterations is None or n < args.iterations:
                data = await ops.summary()
                done = sum(data["states"][s] for s in TERMINAL)
                now = time.monotonic()
                rate = None if previous is None else (done - previous[1]) / max(now - previous[0], 1e-9)
                previous = (now, done)
                live.update(
                    Group(
                        Text(
                            f"orderflow top: {data['generatedAt']}   throughput "
                            + ("-" if rate is None else f"{rate:.2f} orders/s"),
                            style="bold",
                        ),
                        Text(firing_line(data["alarms"]), style="bold"),
                        summary_view(data),
                    ),
                    refresh=True,
                )
                n += 1
                if args.iterations is None or n < args.iterations:
                    await asyncio.sleep(args.interval)


TERMINAL = ("Processed", "Error", "Compensated", "CompensationFailed", "Cancelled")


# --- rendering ---------------------------------------------------------------------------------------------------


class _Table(Table):
    """A table of sender-chosen text: each string cell is a plain `Text` (never markup) with its control characters
    escaped, so a MessageId `[/]`, a newline or an ANSI escape prints as itself."""

    def add_row(
        self, *renderables: RenderableType | None, style: StyleType | None = None, end_section: bool = False
    ) -> None:
        cells = [Text(printable(r)) if isinstance(r, str) else r for r in renderables]
        super().add_row(*cells, style=style, end_section=end_section)


def _table(title: str, columns: Sequence[str]) -> Table:
    table = _Table(title=Text(printable(title)), title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def _render(*parts: Any) -> str:
    console = Console(width=200, record=True, force_terminal=False, color_system=None)
    with console.capture() as capture:
        for part in parts:
            console.print(part)
    return capture.get()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def summary_view(data: Mapping[str, Any]) -> Group:
    states = _table("orders per state", ("state", "orders"))
    for state, count in data["states"].items():
        states.add_row(state, str(count))
    per_app = _table("orders per app", ("app", "Pending", "Processing"))
    for app, counts in data["apps"].items():
        per_app.add_row(app, str(counts["Pending"]), str(counts["Processing"]))
    facts = _table("stuck work", ("figure", "value"))
    for label, oldest in (("oldest Pending", data["oldestPending"]), ("oldest Processing", data["oldestProcessing"])):
        facts.add_row(
            label,
            "-"
            if oldest is None
            else f"{oldest['orderId']} (app {oldest['app'] or '-'}) for {_duration(oldest['ageSeconds'])} "
            f"(since {oldest['since']})",
        )
    facts.add_row("expired Processing / CompensationInProgress", str(data["expiredSupervised"]))
    sup = data["supervisor"]
    last = None if sup is None else sup["lastRun"]
    facts.add_row(
        "Supervisor's last run",
        "never"
        if not last
        else (
            f"{_duration(sup['lastRunAgeSeconds'])} ago: {last['scanned']} expired, {last['recovered']} recovered, "
            f"{last['escalated']} escalated, {last['restarted']} restarted; {last['requestCharge']:.2f} RU, "
            f"{last['queries']} queries, {last['documents']} documents"
        ),
    )
    dead = _table("dead letters", ("queue", "messages"))
    for queue, depth in data["deadLetters"].items():
        dead.add_row(queue, depth["error"] if "error" in depth else f"{'≥' if depth['capped'] else ''}{depth['count']}")
    breakers = _table("circuit breakers", ("service", "state", "now", "failures in window", "open until", "reason"))
    for row in data["breakers"]:
        breakers.add_row(
            row["service"],
            row["state"] + (" (forced)" if row["forced"] else ""),
            row["effectiveState"],
            f"{row['failuresInWindow']}/{row['failureThreshold']}",
            row["openUntil"] or "-",
            row["reason"] or "-",
        )
    return Group(states, per_app, facts, dead, breakers, alarms_view(data["alarms"]))


ALARM_UNITS = {"oldest-pending": "s", "oldest-processing": "s", "backlog-growth": "orders", "dead-letters": "messages"}


def _alarm_figure(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if ALARM_UNITS[name] == "s":
        return _duration(value)
    return f"{value:+.0f} {ALARM_UNITS[name]}" if name == "backlog-growth" else f"{value:.0f} {ALARM_UNITS[name]}"


def alarms_view(alarms: Sequence[Mapping[str, Any]]) -> Table:
    """Each alarm: its figure against its threshold, FIRING or ok, and its runbook row (README, Operating it)."""
    table = _table("alarms (runbook: README, Operating it)", ("alarm", "of", "value", "threshold", "state", "runbook"))
    for alarm in alarms:
        name = alarm["name"]
        state = "FIRING" if alarm["firing"] else "ok" if alarm["detail"] is None else alarm["detail"]
        table.add_row(
            name,
            alarm["queue"] or alarm["orderId"] or "-",
            _alarm_figure(name, alarm["value"]),
            "> " + _alarm_figure(name, alarm["threshold"]).lstrip("+"),
            state,
            alarm["runbook"],
        )
    return table


def firing_line(alarms: Sequence[Mapping[str, Any]]) -> str:
    """`top`'s headline of the alarms: which fire, or none."""
    firing = [a["name"] + (f" ({a['queue']})" if a["queue"] else "") for a in alarms if a["firing"]]
    return f"alarms firing: {', '.join(firing)}" if firing else "no alarm firing"


def render_order(view: Mapping[str, Any]) -> str:
    rec = view["state"]
    head = _table(f"order {view['orderId']}", ("field", "value"))
    head.add_row("app", view["app"] or "-")
    head.add_row("app's orderId", view["clientOrderId"])
    for key in (
        "processState",
        "attempt",
        "failureCount",
        "lockedBy",
        "completeBy",
        "retryAt",
        "lastError",
        "previousErrors",
        "compensationCause",
        "cancelRequestedAt",
        "cancelReason",
        "workflowVersion",
        "createdAt",
        "updatedAt",
        "notifiedAt",
    ):
        value = rec.get(key)
        if value not in (None, [], ()):
            head.add_row(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
    steps = _table("steps", ("step", "status", "attempt", "started", "completed"))
    for step in rec.get("steps", []):
        steps.add_row(
            step["name"],
            step["status"],
            str(step["attempt"]),
            step.get("startedAt") or "-",
            step.get("completedAt") or "-",
        )
    parts: list[Any] = [head, steps]
    if rec.get("compensations"):
        comp = _table("compensation log", ("compensation", "of step", "status", "attempt", "undone"))
        for c in rec["compensations"]:
            comp.add_row(c["name"], c["step"], c["status"], str(c["attempt"]), str(c.get("undone")))
        parts.append(comp)
    if rec.get("resubmissions"):
        audit = _table("resubmits", ("at", "by", "from", "failures spent", "reason"))
        for a in rec["resubmissions"]:
            audit.add_row(a["at"], a["by"], a["fromState"], str(a["failureCount"]), a["reason"])
        parts.append(audit)
    for attempt in view["attempts"]:
        orch = attempt["orchestration"]
        title = f"attempt {attempt['attempt']}: {attempt['instanceId']}"
        if orch is None:
            parts.append(Text(printable(f"{title}: {attempt.get('orchestrationError', 'no status')}")))
            continue
        history = orch.get("historyEvents") or []
        events = _table(
            f"{title}: {orch.get('runtimeStatus')} (created {orch.get('createdTime')}, last update "
            f"{orch.get('lastUpdatedTime')}); {len(history)} history events"
            + (f", the last {HISTORY_SHOWN}" if len(history) > HISTORY_SHOWN else ""),
            ("timestamp", "event", "name", "detail"),
        )
        for event in history[-HISTORY_SHOWN:]:
            events.add_row(
                str(event.get("Timestamp") or event.get("timestamp") or "-"),
                str(event.get("EventType") or event.get("eventType") or "-"),
                str(event.get("Name") or event.get("FunctionName") or event.get("name") or "-"),
                str(event.get("Reason") or event.get("FireAt") or event.get("ScheduledTime") or "")[:80],
            )
        parts.append(events)
    return _render(*parts)
