"""The client-app commands of `orderflow` (and their devhost aliases): `submit` sends orders and follows their
statuses on the app's reply queue; `watch` follows a reply queue; `cancel` sends a CancelOrder in the order's session
and follows what it did; `queues` shows each queue's counts, the dead-letter reasons and the operator alerts.

The app is the reply queue's (`<app>-status`): it sends to its own `<app>-orders`, the legacy app to OrdersQueueName;
an operator's `cancel ORDER_KEY` goes to the owning app's queue (orderflow/apps.py). They use the app's connection
setting (ServiceBusConnection or ServiceBusConnection__fullyQualifiedNamespace, from the environment or the app's
local.settings.json) and the azure-servicebus API, so they work on the embedded broker and on Azure (`queues` needs
the embedded broker's counts; on Azure, `orderflow summary` and `orderflow dlq list`). Waiting for statuses:
`_follow.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError
from rich.console import Console
from rich.table import Table

from orderflow import apps
from orderflow.adapters import bus_from_connection_string
from orderflow.cli._follow import _all_statuses, _diagnose, _follow, _follow_cancel, _Watch
from orderflow.cli.common import CliError, load_settings, operator_name, safe
from orderflow.embedded.connection import bus_connection_as, settings_as
from orderflow.embedded.rights import OPERATORS, submitting_app
from orderflow.errors import is_missing_entity
from orderflow.messages import (
    TERMINAL_STATUSES,
    InvalidMessage,
    OperatorAlert,
    OrderStatus,
    StatusMessage,
    parse_submit_order,
)
from orderflow.operations import CANCELLABLE, cancel_message, cancel_reason
from orderflow.text import shown

SAMPLE_ORDER: dict[str, Any] = {
    "schemaVersion": 1,
    "type": "SubmitOrder",
    "replyTo": "app-status",
    "customer": {"id": "c-1", "name": "Contoso"},
    "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}],
    "currency": "EUR",
}


def add_commands(sub: Any, prog: str, names: tuple[str, ...] = ("submit", "watch", "cancel", "queues")) -> None:
    """The client-app commands under `prog` (`orderflow`, or `python -m devhost` for its aliases)."""
    if "submit" in names:
        s = sub.add_parser(
            "submit",
            help="send orders and follow their statuses (a client app)",
            description="Send a SubmitOrder to the orders queue (SessionId = orderId, MessageId = "
            "<orderId>:<hash of the body>, so an identical resend is absorbed by duplicate "
            "detection and a changed one reaches the conflict check), then print the "
            "statuses from the reply queue until a terminal one or --wait seconds. With "
            "--count N, N orders (generated ids) and one line each when it ends. Exit 0 "
            "when the order completed (with --count: when every order ended), 1 when it "
            "ended otherwise (failed, compensated, cancelled), was rejected or "
            "dead-lettered, or no final status came within --wait.",
        )
        _connection_options(s)
        s.add_argument("--order-id", default=None, help="orderId (default: a new random one)")
        s.add_argument("--file", type=Path, default=None, help="JSON file with the order (default: a sample order)")
        s.add_argument("--count", type=int, default=1, help="send this many orders, each with a new orderId")
        s.add_argument("--reply-to", default=None, help="reply queue (default: the order's, else app-status)")
        s.add_argument("--wait", type=float, default=30.0, help="seconds to wait for terminal statuses (default 30)")
        s.add_argument("--json", action="store_true", help="--count: print one JSON object per order")
        s.add_argument(
            "--host-port",
            type=int,
            default=None,
            help="devhost's HTTP port, checked when no terminal status comes (default: the one "
            "`devhost up` recorded, else 7071)",
        )
        s.set_defaults(prog=f"{prog} submit", handler=submit)
    if "watch" in names:
        w = sub.add_parser(
            "watch",
            help="follow an application's reply queue (consumes its statuses, as the app)",
            description="Receive the statuses on REPLY_QUEUE, session after session, completing each "
            "(this is what the submitting app does), and print them as they come.",
        )
        _connection_options(w)
        w.add_argument(
            "queue",
            metavar="REPLY_QUEUE",
            nargs="?",
            default="app-status",
            help="the app's reply queue (default app-status)",
        )
        w.add_argument("--order", default=None, metavar="ORDER_ID", help="only this order's session")
        w.add_argument(
            "--for", dest="duration", type=float, default=30.0, help="stop after this many seconds (default 30)"
        )
        w.add_argument("--max", type=int, default=None, help="stop after this many statuses")
        w.add_argument("--json", action="store_true", help="print one JSON status per line")
        w.set_defaults(prog=f"{prog} watch", handler=watch)
    if "cancel" in names:
        c = sub.add_parser(
            "cancel",
            help="cancel one order and follow what the cancel did",
            description="Send a CancelOrder for the order ORDER to its app's inbound queue (<app>-orders) "
            "in the order's session (SessionId = the app's orderId, so it is processed after the order's "
            "SubmitOrder), with the app's status queue as replyTo, then print the statuses that follow it: "
            "cancelled (nothing was sent), compensated (what was done is undone), rejected (too late). "
            "First checks the state store: ORDER is the order's key (<app>.<orderId>, or the legacy app's "
            "bare orderId); an unknown order, or one that is not Pending or Processing, is refused and "
            "nothing is sent. With --no-check, ORDER is an app's own orderId and the cancel goes out as "
            "that app's (the app of --reply-to) would. A repeated cancel changes nothing.",
        )
        _connection_options(c)
        c.add_argument(
            "order_id",
            metavar="ORDER",
            help="the order's key (<app>.<orderId>, or the legacy app's orderId); with --no-check the app's orderId",
        )
        c.add_argument("--reason", default=None, help="why: the CancelOrder's reason (at most 256 characters)")
        c.add_argument(
            "--reply-to",
            default=None,
            help="reply queue (default: the order's app's status queue, <app>-status; with --no-check app-status)",
        )
        c.add_argument(
            "--wait", type=float, default=30.0, help="seconds to wait for the answer (default 30; 0: send and exit)"
        )
        c.add_argument(
            "--no-check", action="store_true", help="do not read the state store first (the client app's cancel)"
        )
        c.set_defaults(prog=f"{prog} cancel", handler=cancel, no_check=prog != "orderflow")
    if "queues" in names:
        q = sub.add_parser(
            "queues",
            help="queue counts, dead-letter reasons and operator alerts (embedded broker)",
            description="For every queue: active, scheduled and dead-lettered messages and sessions "
            "with backlog; then the dead-lettered messages with their reasons and the "
            "operator alerts (peeked, nothing is removed).",
        )
        _connection_options(q)
        q.add_argument("--peek", type=int, default=20, help="most messages to list per queue (default 20)")
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(prog=f"{prog} queues", handler=queues)


def _connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--app-dir",
        type=Path,
        default=Path("."),
        help="app folder whose local.settings.json names the connection (default: .)",
    )
    p.add_argument(
        "--connection",
        default=None,
        help="Service Bus connection string (default: ServiceBusConnection from the environment or the "
        "app's local.settings.json)",
    )


def _client(args: argparse.Namespace, identity: str | None) -> Any:
    """The Service Bus client of the command. Locally (the embedded broker, the emulator form of its endpoint) the
    app's connection acts as `identity`, the identity of infra/ the command's user has on Azure (docs/devhost.md,
    "Rights"); an explicit --connection is taken as it is."""
    app_dir = args.app_dir.resolve()
    values = load_settings(app_dir)
    conn = args.connection or values.get("ServiceBusConnection")
    if conn and not args.connection:
        conn = bus_connection_as(conn, identity)
    os.chdir(app_dir)  # relative embedded paths resolve against the app dir, as under devhost
    if conn:
        return bus_from_connection_string(conn)
    if values.get("ServiceBusConnection__fullyQualifiedNamespace"):  # Azure: identity-based
        from orderflow.adapters import bus_from_settings

        return bus_from_settings(values)
    raise CliError(
        "no connection: pass --connection or set ServiceBusConnection (or "
        "ServiceBusConnection__fullyQualifiedNamespace on Azure); locally: cp local.settings.sample.json "
        "local.settings.json"
    )


def _read_order_file(path: Path, prog: str) -> dict[str, Any]:
    """The order in `path`, or SystemExit(2) with one line saying what is wrong (no traceback)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        _usage_error(prog, f"cannot read --file {path}: {exc.strerror or exc}")
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer past the limit, nested too deeply
        _usage_error(prog, f"--file {path} is not JSON: {shown(exc, 200)}")
    if not isinstance(raw, dict):
        _usage_error(prog, f"--file {path} must hold one JSON object (a SubmitOrder), not {type(raw).__name__}")
    return dict(raw)


def _usage_error(prog: str, message: str) -> NoReturn:
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)


def submit(args: argparse.Namespace) -> int:
    if args.count != 1:
        return submit_many(args)
    raw = _read_order_file(args.file, args.prog) if args.file else dict(SAMPLE_ORDER)
    raw.setdefault("orderId", args.order_id or f"order-{uuid.uuid4().hex[:10]}")
    if args.order_id:
        raw["orderId"] = args.order_id
    raw["replyTo"] = args.reply_to or raw.get("replyTo") or "app-status"  # as --reply-to's help says
    raw.setdefault("submittedAt", datetime.now(UTC).isoformat())
    body = json.dumps(raw)
    order_id, reply_to = str(raw["orderId"]), str(raw["replyTo"])
    message_id = f"{order_id}:{hashlib.sha256(body.encode()).hexdigest()[:12]}"
    console = Console(emoji=False)
    known_rejection: InvalidMessage | None = None
    try:
        parse_submit_order(body)
    except InvalidMessage as exc:  # still sent: the system dead-letters it with the reason; say so here too
        known_rejection = exc
        console.print(f"[yellow]note: the system will reject this order: {safe(exc)}[/]")
    orders_queue = apps.inbound_queue(submitting_app(reply_to))
    with _client(args, submitting_app(reply_to)) as client:
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(
                ServiceBusMessage(body, session_id=order_id, message_id=message_id, content_type="application/json")
            )
        console.print(
            f"sent order [bold]{safe(order_id)}[/] (MessageId {safe(message_id)}); statuses from {safe(reply_to)}:"
        )
        if known_rejection is not None:  # no status will come: the rejection is known, say it and stop
            console.print(
                f"[red]rejected: {safe(known_rejection.reason)}: the order is dead-lettered on "
                f"{safe(orders_queue)}, no status follows (orderflow queues)[/]"
            )
            return 1
        watch = _Watch(client, orders_queue, message_id)
        code, statuses = _follow(client, reply_to, order_id, args.wait, console, watch)
        if code is None:
            console.print(f"[yellow]no terminal status within {args.wait:g} s.[/] What the client found:")
            for line in _diagnose(args, watch, statuses):
                console.print(f"  - {line}")
            code = 1
        return code


def _order_body(template: dict[str, Any], order_id: str, reply_to: str | None) -> tuple[str, str]:
    raw = {**template, "orderId": order_id, "submittedAt": datetime.now(UTC).isoformat()}
    if reply_to:
        raw["replyTo"] = reply_to
    body = json.dumps(raw)
    return body, f"{order_id}:{hashlib.sha256(body.encode()).hexdigest()[:12]}"


def submit_many(args: argparse.Namespace) -> int:
    """`submit --count N`: N orders with new ids, then one line (or JSON object) per order as it ends. Exit 0 when
    every order ended within --wait (whatever its end), 1 otherwise. Consumes the reply queue's statuses."""
    if args.count < 1:
        _usage_error(args.prog, f"--count must be at least 1, got {args.count}")
    if args.order_id:
        _usage_error(args.prog, "--order-id names one order; --count generates the ids")
    template = _read_order_file(args.file, args.prog) if args.file else dict(SAMPLE_ORDER)
    reply_to = str(args.reply_to or template.get("replyTo") or "app-status")
    orders_queue = apps.inbound_queue(submitting_app(reply_to))
    prefix = f"order-{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{n:05d}" for n in range(args.count)]
    console = Console(emoji=False)
    with _client(args, submitting_app(reply_to)) as client:
        with client.get_queue_sender(orders_queue) as sender:
            for order_id in ids:
                body, message_id = _order_body(template, order_id, args.reply_to)
                sender.send_messages(
                    ServiceBusMessage(body, session_id=order_id, message_id=message_id, content_type="application/json")
                )
        if not args.json:
            console.print(f"sent {len(ids)} orders ({ids[0]} … {ids[-1]}); statuses from {safe(reply_to)}:")
        pending = set(ids)
        ended: dict[str, StatusMessage] = {}
        for status in _all_statuses(client, reply_to, args.wait, lambda: not pending):
            if status.order_id in pending and (
                status.state in TERMINAL_STATUSES or status.state is OrderStatus.REJECTED
            ):
                pending.discard(status.order_id)
                ended[status.order_id] = status
                if args.json:
                    print(status.to_json(), flush=True)
                else:
                    console.print(
                        f"  {status.order_id}  {status.state.value:<19} attempt {status.attempt}  {safe(status.reason)}"
                    )
        counts: dict[str, int] = {}
        for status in ended.values():
            counts[status.state.value] = counts.get(status.state.value, 0) + 1
        if not args.json:
            console.print(
                f"{len(ended)} of {len(ids)} ended within {args.wait:g} s: "
                + (", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none")
            )
        return 0 if not pending else 1


def watch(args: argparse.Namespace) -> int:
    """`orderflow watch REPLY_QUEUE`: print statuses for --for seconds (or --max of them); exit 0."""
    console = Console(emoji=False)
    seen = [0]
    with _client(args, submitting_app(args.queue)) as client:
        if not args.json:
            console.print(
                f"watching {safe(args.queue)}"
                + (f" (order {safe(args.order)})" if args.order else "")
                + f" for {args.duration:g} s"
            )
        try:
            for status in _all_statuses(
                client, args.queue, args.duration, lambda: args.max is not None and seen[0] >= args.max, args.order
            ):
                seen[0] += 1
                if args.json:
                    print(status.to_json(), flush=True)
                else:
                    console.print(
                        f"  {status.timestamp.isoformat()}  {status.order_id}  {status.state.value:<19} "
                        f"attempt {status.attempt}  {safe(status.reason)}"
                    )
        except ServiceBusError as exc:
            if not is_missing_entity(exc):
                raise
            raise CliError(f"there is no queue {args.queue!r}") from exc
    return 0


def _stored_record(order_id: str) -> tuple[Any, apps.SubmittingApps]:
    """The order's state record (the state store named by CosmosDb__accountEndpoint), None when there is no such
    order, and the submitting apps; CliError when the store cannot be read."""
    import asyncio

    from orderflow.adapters import open_stores
    from orderflow.runtime import Tunables

    env = settings_as(load_settings(Path(".")), OPERATORS)  # the operator's check: the operators' identity
    try:
        known = Tunables.from_env(env).apps
    except (ValueError, KeyError) as exc:
        raise CliError(f"invalid app settings: {exc}") from exc
    if not env.get("CosmosDb__accountEndpoint"):
        raise CliError(
            "app setting CosmosDb__accountEndpoint is not set: cannot check the order (--no-check sends "
            "the cancel as a client app would)"
        )

    async def read() -> Any:
        async with open_stores(env) as stores:
            found = await stores.state.get(order_id)
        return None if found is None else found[0]

    try:
        return asyncio.run(asyncio.wait_for(read(), 15)), known
    except Exception as exc:
        raise CliError(f"cannot read order {order_id} from the state store: {exc}") from exc


def _checked(key: str, reply_to: str | None) -> tuple[str, str, str]:
    """An operator's cancel of the order `key`: (its app's inbound queue, the app's orderId, the reply queue), once
    the state store holds the order, Pending or Processing, of a submitting app."""
    record, known = _stored_record(key)
    if record is None:
        raise CliError(f"no order {key!r} in the state store")
    if record.process_state not in CANCELLABLE:
        raise CliError(
            f"order {key} is {record.process_state.value}: only a Pending or Processing order can be cancelled"
        )
    owner = known.owner_of(key, record.app, record.reply_to)
    if owner is None:
        raise CliError(f"order {key} belongs to no submitting app (SubmittingApps): no app to cancel it for")
    if reply_to not in (None, apps.status_queue(owner)):
        raise CliError(f"--reply-to {reply_to!r}: an operator's cancel answers on the owning app's own status queue")
    return apps.inbound_queue(owner), apps.client_order_id(key), apps.status_queue(owner)


def cancel(args: argparse.Namespace) -> int:
    """`orderflow cancel ORDER`: 0 when the order ended cancelled or compensated, 1 otherwise (refused, rejected,
    dead-lettered, or no answer within --wait). Unless --no-check, ORDER is the order's key and the order must exist
    and be Pending or Processing (an operator's check), the cancel going to its app's inbound queue; with it, ORDER is
    an app's orderId and the cancel goes out as that app's would, and the system answers (`rejected`, or the
    dead-letter reason UnknownOrder). An operator's cancel's reason names the operator (the OS user): "cancelled by
    <user>: <reason>"."""
    order_id = str(args.order_id)
    console = Console(emoji=False)
    # With the check, an operator's cancel; with --no-check, the client app's (of its reply queue).
    identity = submitting_app(args.reply_to or "app-status") if args.no_check else OPERATORS
    with _client(args, identity) as client:  # (chdir to the app dir: an embedded store path resolves as under devhost)
        reason = args.reason
        if args.no_check:
            reply_to = args.reply_to or "app-status"
            orders_queue = apps.inbound_queue(submitting_app(reply_to))
        else:
            orders_queue, order_id, reply_to = _checked(order_id, args.reply_to)
            reason = cancel_reason(operator_name(None, os.environ), reason)  # the record names the operator
        try:
            message = cancel_message(order_id, reply_to, reason)
        except ValueError as exc:  # an invalid orderId, replyTo or reason: nothing is sent
            print(f"{args.prog}: {exc}", file=sys.stderr)
            return 2
        sent_at = datetime.now(UTC)
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(message)
        console.print(
            f"sent cancel of [bold]{safe(args.order_id)}[/] to {safe(orders_queue)} (MessageId "
            f"{safe(message.message_id)}); statuses from {safe(reply_to)}:"
        )
        if args.wait <= 0:
            return 0
        watch = _Watch(client, orders_queue, str(message.message_id))
        return _follow_cancel(client, reply_to, order_id, sent_at, args.wait, console, watch)


def queues(args: argparse.Namespace) -> int:
    """Each queue's counts, the dead-lettered messages with their reasons, and the operator alerts (peeked)."""
    from orderflow.deadletters import row

    with _client(args, OPERATORS) as client:
        broker = getattr(client, "broker", None)
        if broker is None:
            raise CliError(
                "queues needs the embedded broker's counts; on Azure: orderflow summary (dead-letter "
                "depths) and orderflow dlq list QUEUE"
            )
        names = broker.queue_names()
        counts = {name: broker.counts(name) for name in names}
        dead: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            with client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                dead[name] = [row(m) for m in dlq.peek_messages(max_message_count=args.peek)]
        alerts: list[OperatorAlert] = []
        alerts_queue = os.environ.get("OperatorAlertsQueueName", "operator-alerts")
        if alerts_queue in names:
            with client.get_queue_receiver(alerts_queue) as receiver:
                alerts = [
                    OperatorAlert.model_validate_json(b"".join(m.body))
                    for m in receiver.peek_messages(max_message_count=args.peek)
                ]
    if args.json:
        print(
            json.dumps(
                {
                    "queues": {
                        name: {
                            "active": c.active,
                            "scheduled": c.scheduled,
                            "deadLettered": c.dead_lettered,
                            "sessionsWithBacklog": c.sessions_with_backlog,
                        }
                        for name, c in counts.items()
                    },
                    "deadLetters": dead,
                    "alerts": [json.loads(a.to_json()) for a in alerts],
                },
                indent=2,
            )
        )
        return 0
    console = Console(emoji=False)
    table = Table(title="queues")
    for column in ("queue", "active", "scheduled", "dead-lettered", "sessions with backlog"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for name, c in counts.items():
        table.add_row(name, str(c.active), str(c.scheduled), str(c.dead_lettered), str(c.sessions_with_backlog))
    console.print(table)
    for name, rows in dead.items():
        for r in rows:
            console.print(
                f"dead-lettered on {safe(name)}: {safe(r['messageId'])}  "
                f"[bold]{safe(r['deadLetterReason'])}[/]  {safe(r['deadLetterErrorDescription'] or '')}"
            )
    for alert in alerts:
        console.print(
            f"alert {alert.kind.value}: order {safe(alert.order_id)}  {safe(alert.reason)}  "
            f"{safe(json.dumps(alert.details))}"
        )
    return 0
