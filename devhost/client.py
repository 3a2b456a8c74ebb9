"""A client app for the local system: `python -m devhost submit` sends one order and follows its statuses on the
app's reply queue; `python -m devhost queues` shows each queue's counts, the dead-letter reasons and the operator
alerts. Both use the same connection setting as the app (ServiceBusConnection from the environment or the app's
local.settings.json) and the azure-servicebus API, so they work on the embedded broker (and, for `submit`, on Azure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessagingEntityNotFoundError, OperationTimeoutError
from rich.console import Console
from rich.table import Table

from orderflow.bus import from_connection_string
from orderflow.messages import TERMINAL_STATUSES, InvalidMessage, OperatorAlert, StatusMessage, parse_submit_order

from .config import HostConfig

SAMPLE_ORDER: dict[str, Any] = {
    "schemaVersion": 1, "type": "SubmitOrder", "replyTo": "app-status",
    "customer": {"id": "c-1", "name": "Contoso"},
    "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}], "currency": "EUR",
}


def add_commands(sub: Any) -> None:
    s = sub.add_parser("submit", help="send one order and follow its statuses (a client app)",
                       description="Send a SubmitOrder to the orders queue (SessionId = orderId, MessageId = "
                                   "<orderId>:<hash of the body>, so an identical resend is absorbed by duplicate "
                                   "detection and a changed one reaches the conflict check), then print the "
                                   "statuses from the reply queue until a terminal one or --wait seconds.")
    _connection_options(s)
    s.add_argument("--order-id", default=None, help="orderId (default: a new random one)")
    s.add_argument("--file", type=Path, default=None, help="JSON file with the order (default: a sample order)")
    s.add_argument("--reply-to", default=None, help="reply queue (default: the order's, else app-status)")
    s.add_argument("--wait", type=float, default=30.0, help="seconds to wait for a terminal status (default 30)")

    q = sub.add_parser("queues", help="queue counts, dead-letter reasons and operator alerts (embedded broker)",
                       description="For every queue: active, scheduled and dead-lettered messages and sessions with "
                                   "backlog; then the dead-lettered messages with their reasons and the operator "
                                   "alerts (peeked, nothing is removed).")
    _connection_options(q)
    q.add_argument("--peek", type=int, default=20, help="most messages to list per queue (default 20)")


def _connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app-dir", type=Path, default=Path("."),
                   help="app folder whose local.settings.json names the connection (default: .)")
    p.add_argument("--connection", default=None,
                   help="Service Bus connection string (default: ServiceBusConnection from the environment or the "
                        "app's local.settings.json)")


def _client(args: argparse.Namespace) -> Any:
    app_dir = args.app_dir.resolve()
    values = HostConfig.load(app_dir).values
    conn = args.connection or os.environ.get("ServiceBusConnection") or values.get("ServiceBusConnection")
    if not conn:
        raise SystemExit("no connection: pass --connection or set ServiceBusConnection "
                         "(cp local.settings.sample.json local.settings.json)")
    os.chdir(app_dir)  # relative embedded paths resolve against the app dir, as under devhost
    return from_connection_string(conn)


def submit(args: argparse.Namespace) -> int:
    raw = json.loads(args.file.read_text()) if args.file else dict(SAMPLE_ORDER)
    raw.setdefault("orderId", args.order_id or f"order-{uuid.uuid4().hex[:10]}")
    if args.order_id:
        raw["orderId"] = args.order_id
    if args.reply_to:
        raw["replyTo"] = args.reply_to
    raw.setdefault("submittedAt", datetime.now(UTC).isoformat())
    body = json.dumps(raw)
    order_id, reply_to = str(raw["orderId"]), str(raw.get("replyTo", "app-status"))
    message_id = f"{order_id}:{hashlib.sha256(body.encode()).hexdigest()[:12]}"
    console = Console()
    try:
        parse_submit_order(body)
    except InvalidMessage as exc:  # still sent: the system dead-letters it with the reason; say so here too
        console.print(f"[yellow]note: the system will reject this order: {exc}[/]")
    with _client(args) as client:
        with client.get_queue_sender(os.environ.get("OrdersQueueName", "orders-inbound")) as sender:
            sender.send_messages(ServiceBusMessage(body, session_id=order_id, message_id=message_id,
                                                   content_type="application/json"))
        console.print(f"sent order [bold]{order_id}[/] (MessageId {message_id}); statuses from {reply_to}:")
        return _follow(client, reply_to, order_id, args.wait, console)


def _follow(client: Any, reply_to: str, order_id: str, wait: float, console: Console) -> int:
    try:
        with client.get_queue_receiver(reply_to, session_id=order_id, max_wait_time=wait) as receiver:
            for message in receiver:
                status = StatusMessage.model_validate_json(b"".join(message.body))
                receiver.complete_message(message)
                console.print(f"  {status.timestamp.isoformat()}  {status.state.value:<10} attempt "
                              f"{status.attempt}  {status.reason}")
                if status.state in TERMINAL_STATUSES:
                    return 0
    except OperationTimeoutError:
        pass
    except MessagingEntityNotFoundError:
        console.print(f"[yellow]there is no reply queue {reply_to!r} (the order is dead-lettered: "
                      f"python -m devhost queues)[/]")
        return 1
    console.print(f"[yellow]no terminal status within {wait:g} s (rejected orders are dead-lettered: "
                  f"python -m devhost queues)[/]")
    return 1


def queues(args: argparse.Namespace) -> int:
    console = Console()
    with _client(args) as client:
        broker = getattr(client, "broker", None)
        if broker is None:
            raise SystemExit("queues works on the embedded broker; use the Azure portal or "
                             "ServiceBusAdministrationClient for Azure")
        table = Table(title="queues")
        for column in ("queue", "active", "scheduled", "dead-lettered", "sessions with backlog"):
            table.add_column(column, justify="left" if column == "queue" else "right")
        names = broker.queue_names()
        for name in names:
            c = broker.counts(name)
            table.add_row(name, str(c.active), str(c.scheduled), str(c.dead_lettered), str(c.sessions_with_backlog))
        console.print(table)
        for name in names:
            with client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                for m in dlq.peek_messages(max_message_count=args.peek):
                    console.print(f"dead-lettered on {name}: {m.message_id}  [bold]{m.dead_letter_reason}[/]  "
                                  f"{m.dead_letter_error_description or ''}")
        alerts_queue = os.environ.get("OperatorAlertsQueueName", "operator-alerts")
        if alerts_queue in names:
            with client.get_queue_receiver(alerts_queue) as receiver:
                for m in receiver.peek_messages(max_message_count=args.peek):
                    alert = OperatorAlert.model_validate_json(b"".join(m.body))
                    console.print(f"alert {alert.kind.value}: order {alert.order_id}  {alert.reason}  "
                                  f"{json.dumps(alert.details)}")
    return 0
