"""A client app for the local system: `python -m devhost submit` sends one order and follows its statuses on the
app's reply queue; `python -m devhost cancel ORDER_ID` sends a CancelOrder in the order's session and follows what it
did; `python -m devhost queues` shows each queue's counts, the dead-letter reasons and the operator
alerts. Both use the same connection setting as the app (ServiceBusConnection from the environment or the app's
local.settings.json) and the azure-servicebus API, so they work on the embedded broker (and, for `submit`, on Azure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessagingEntityNotFoundError, OperationTimeoutError
from rich.console import Console
from rich.table import Table

from orderflow.bus import from_connection_string
from orderflow.messages import (
    TERMINAL_STATUSES,
    CancelOrder,
    InvalidMessage,
    OperatorAlert,
    OrderStatus,
    StatusMessage,
    parse_submit_order,
)

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
    s.add_argument("--host-port", type=int, default=None,
                   help="devhost's HTTP port, checked when no terminal status comes (default: the one `devhost up` "
                        "recorded, else 7071)")

    c = sub.add_parser("cancel", help="cancel one order and follow what the cancel did (a client app)",
                       description="Send a CancelOrder for ORDER_ID to the orders queue in the order's session "
                                   "(SessionId = orderId, so it is processed after the order's SubmitOrder), with the "
                                   "order's replyTo (read from the orders DB), then print the statuses that follow "
                                   "it: cancelled (nothing was sent), compensated (what was done is undone), "
                                   "rejected (too late: the order is processed or failed, nothing changed). A cancel "
                                   "of an order whose steps are running takes effect at once or at its next step; a "
                                   "repeated cancel changes nothing and is not answered again.")
    _connection_options(c)
    c.add_argument("order_id", metavar="ORDER_ID", help="the order to cancel")
    c.add_argument("--reason", default=None, help="why: the CancelOrder's reason (at most 256 characters)")
    c.add_argument("--reply-to", default=None,
                   help="reply queue (default: the order's replyTo from the orders DB, else app-status)")
    c.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the answer (default 30)")

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


def _read_order_file(path: Path) -> dict[str, Any]:
    """The order in `path`, or SystemExit(2) with one line saying what is wrong (no traceback)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        _usage_error(f"cannot read --file {path}: {exc.strerror or exc}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        _usage_error(f"--file {path} is not JSON: {exc}")
    if not isinstance(raw, dict):
        _usage_error(f"--file {path} must hold one JSON object (a SubmitOrder), not {type(raw).__name__}")
    return raw


def _usage_error(message: str) -> Any:
    print(f"devhost submit: {message}", file=sys.stderr)
    raise SystemExit(2)


def submit(args: argparse.Namespace) -> int:
    raw = _read_order_file(args.file) if args.file else dict(SAMPLE_ORDER)
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
    known_rejection: InvalidMessage | None = None
    try:
        parse_submit_order(body)
    except InvalidMessage as exc:  # still sent: the system dead-letters it with the reason; say so here too
        known_rejection = exc
        console.print(f"[yellow]note: the system will reject this order: {exc}[/]")
    orders_queue = os.environ.get("OrdersQueueName", "orders-inbound")
    with _client(args) as client:
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(ServiceBusMessage(body, session_id=order_id, message_id=message_id,
                                                   content_type="application/json"))
        console.print(f"sent order [bold]{order_id}[/] (MessageId {message_id}); statuses from {reply_to}:")
        if known_rejection is not None:  # no status will come: the rejection is known, say it and stop
            console.print(f"[red]rejected: {known_rejection.reason}: the order is dead-lettered on {orders_queue}, "
                          f"no status follows (python -m devhost queues)[/]")
            return 1
        watch = _Watch(client, orders_queue, message_id)
        code, statuses = _follow(client, reply_to, order_id, args.wait, console, watch)
        if code is None:
            console.print(f"[yellow]no terminal status within {args.wait:g} s.[/] What the client found:")
            for line in _diagnose(args, watch, statuses):
                console.print(f"  - {line}")
            code = 1
        return code


def cancel_body(order_id: str, reply_to: str, reason: str | None = None,
                requested_at: datetime | None = None) -> str:
    """A CancelOrder's JSON body (validated: ValueError on an invalid orderId, replyTo or reason)."""
    return CancelOrder(orderId=order_id, replyTo=reply_to, reason=reason,
                       requestedAt=requested_at or datetime.now(UTC)).to_json()


def cancel_message(order_id: str, reply_to: str, reason: str | None = None,
                   requested_at: datetime | None = None) -> ServiceBusMessage:
    """A CancelOrder as a client sends it on orders-inbound: SessionId = orderId (after the order's SubmitOrder),
    MessageId = `<orderId>:cancel:<hash of the body>` (each cancel is its own message; an identical resend is absorbed
    by duplicate detection)."""
    body = cancel_body(order_id, reply_to, reason, requested_at)
    message_id = f"{order_id}:cancel:{hashlib.sha256(body.encode()).hexdigest()[:12]}"
    return ServiceBusMessage(body, session_id=order_id, message_id=message_id, content_type="application/json")


def _stored_reply_to(order_id: str) -> str | None:
    """The replyTo of the stored order (the orders DB named by CosmosDb__accountEndpoint), None when it cannot be
    read or there is no such order."""
    import asyncio  # noqa: PLC0415

    from orderflow.store import open_stores  # noqa: PLC0415

    env = {**HostConfig.load(Path(".")).values, **os.environ}
    if not env.get("CosmosDb__accountEndpoint"):
        return None

    async def read() -> str | None:
        async with open_stores(env) as stores:
            stored = await stores.orders.get(order_id)
        return None if stored is None else str(stored.order.get("replyTo") or "") or None

    try:
        return asyncio.run(asyncio.wait_for(read(), 15))
    except Exception:  # noqa: BLE001 - a convenience only: --reply-to, else app-status
        return None


def cancel(args: argparse.Namespace) -> int:
    """`python -m devhost cancel ORDER_ID`: 0 when the order ended cancelled or compensated, 1 otherwise (rejected,
    dead-lettered, or no answer within --wait)."""
    order_id = str(args.order_id)
    console = Console()
    orders_queue = os.environ.get("OrdersQueueName", "orders-inbound")
    with _client(args) as client:  # (chdir to the app dir: an embedded store path resolves as under devhost)
        stored = _stored_reply_to(order_id)
        reply_to = args.reply_to or stored or "app-status"
        if stored is None and not args.reply_to:
            console.print(f"[yellow]note: no stored order {order_id} found: replying to {reply_to}; the system "
                          f"dead-letters a cancel of an unknown order (UnknownOrder)[/]")
        try:
            message = cancel_message(order_id, reply_to, args.reason)
        except ValueError as exc:  # an invalid orderId, replyTo or reason: nothing is sent
            print(f"devhost cancel: {exc}", file=sys.stderr)
            return 2
        sent_at = datetime.now(UTC)
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(message)
        console.print(f"sent cancel of [bold]{order_id}[/] (MessageId {message.message_id}); statuses from "
                      f"{reply_to}:")
        watch = _Watch(client, orders_queue, str(message.message_id))
        return _follow_cancel(client, reply_to, order_id, sent_at, args.wait, console, watch)


# What a cancel's answer means for `cancel`'s exit code: the cancel took effect (0), or not (1).
CANCEL_DONE = frozenset({OrderStatus.CANCELLED, OrderStatus.COMPENSATED})
CANCEL_ANSWERS = TERMINAL_STATUSES | {OrderStatus.REJECTED}


def _follow_cancel(client: Any, reply_to: str, order_id: str, sent_at: datetime, wait: float, console: Console,
                   watch: _Watch) -> int:
    """Print the order's statuses until the cancel's answer: a terminal status or `rejected` stamped after the cancel
    was sent (the order's earlier statuses, if still queued, are shown as such and do not end the wait)."""
    since = sent_at.timestamp() - 1.0  # the system's clock may trail this one a little
    try:
        for status in _statuses(client, reply_to, order_id, wait):
            if status is None:
                if watch.report_dead_letter(console):
                    return 1
                continue
            earlier = status.timestamp.timestamp() < since
            effects = "" if status.effects is None else (
                f"  applied {[s.value for s in status.effects.applied]} undone "
                f"{[s.value for s in status.effects.undone]}")
            console.print(f"  {status.timestamp.isoformat()}  {status.state.value:<19} attempt "
                          f"{status.attempt}  {status.reason}{effects}" + ("  (before the cancel)" if earlier else ""))
            if not earlier and status.state in CANCEL_ANSWERS:
                return 0 if status.state in CANCEL_DONE else 1
    except OperationTimeoutError:
        pass
    except MessagingEntityNotFoundError:
        console.print(f"[yellow]there is no reply queue {reply_to!r}[/]")
        return 1
    console.print(f"[yellow]no answer within {wait:g} s: an order whose step is running is cancelled at once or at "
                  f"its next step (wait longer); a repeated cancel changes nothing and is not answered again[/]")
    return 1


class _Watch:
    """What the client can see of the system while it waits: whether its message was dead-lettered (peeked from
    the orders queue's dead-letter sub-queue, from where the last look ended) and, on the embedded broker, the
    backlog of orders-inbound and agent-requests when the wait began."""

    def report_dead_letter(self, console: Console) -> bool:
        """Print the dead-lettering of the client's message, if it happened; whether it did."""
        dead = self.dead_lettered()
        if dead is None:
            return False
        console.print(f"[red]rejected: {dead.dead_letter_reason}: {dead.dead_letter_error_description or ''} "
                      f"(dead-lettered on {self.orders_queue}; python -m devhost queues)[/]")
        return True

    def __init__(self, client: Any, orders_queue: str, message_id: str) -> None:
        self.client, self.orders_queue, self.message_id = client, orders_queue, message_id
        self.next_seq = 0
        self.checked = False  # the dead-letter queue could be read at least once
        broker = getattr(client, "broker", None)
        self.broker = broker
        self.agent_queue = os.environ.get("AgentRequestsQueueName", "agent-requests")
        self.agent_backlog_before = self._active(self.agent_queue)

    def _active(self, queue: str) -> int | None:
        if self.broker is None or queue not in self.broker.queue_names():
            return None
        return int(self.broker.counts(queue).active)

    def dead_lettered(self) -> Any:
        """The dead-lettered copy of the sent message, or None (so far)."""
        try:
            with self.client.get_queue_receiver(self.orders_queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                while True:
                    page = dlq.peek_messages(max_message_count=100, sequence_number=self.next_seq)
                    for m in page:
                        self.next_seq = max(self.next_seq, int(m.sequence_number) + 1)
                        if m.message_id == self.message_id:
                            return m
                    if len(page) < 100:
                        break
        except Exception:  # noqa: BLE001 - a diagnosis aid only; the wait goes on without it
            return None
        self.checked = True
        return None


def _statuses(client: Any, reply_to: str, order_id: str, wait: float) -> Iterator[StatusMessage | None]:
    """The order's statuses from its reply-queue session, each completed as it is read, for at most `wait` seconds;
    None after each batch (the caller's moment to look for a dead-letter)."""
    deadline = time.monotonic() + wait
    with client.get_queue_receiver(reply_to, session_id=order_id, max_wait_time=wait) as receiver:
        while (remaining := deadline - time.monotonic()) > 0:
            for message in receiver.receive_messages(max_message_count=10, max_wait_time=min(1.0, remaining)):
                receiver.complete_message(message)
                yield StatusMessage.model_validate_json(b"".join(message.body))
            yield None


def _follow(client: Any, reply_to: str, order_id: str, wait: float, console: Console,
            watch: _Watch) -> tuple[int | None, list[StatusMessage]]:
    """Print the order's statuses until a terminal one (0) or a known rejection (1); None when `wait` ran out."""
    statuses: list[StatusMessage] = []
    try:
        for status in _statuses(client, reply_to, order_id, wait):
            if status is None:
                if not statuses and watch.report_dead_letter(console):
                    return 1, statuses
                continue
            statuses.append(status)
            console.print(f"  {status.timestamp.isoformat()}  {status.state.value:<10} attempt "
                          f"{status.attempt}  {status.reason}")
            if status.state in TERMINAL_STATUSES:
                return 0, statuses
            if status.state is OrderStatus.REJECTED:  # admission control: nothing was stored
                console.print(f"[red]rejected: {status.reason} (nothing stored; submit it again later)[/]")
                return 1, statuses
    except OperationTimeoutError:
        pass
    except MessagingEntityNotFoundError:
        console.print(f"[yellow]there is no reply queue {reply_to!r}: the system cannot answer this order "
                      f"(replyTo must be an existing, allowed reply queue)[/]")
        return 1, statuses
    return None, statuses


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _started_by_up(app_dir: Path) -> dict[str, dict[str, Any]]:
    """The processes `devhost up` recorded in <app-dir>/.devhost/up.json, by name ({} when there is none)."""
    try:
        data = json.loads((app_dir / ".devhost" / "up.json").read_text())
        return {str(p["name"]): dict(p) for p in data["processes"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _diagnose(args: argparse.Namespace, watch: _Watch, statuses: list[StatusMessage]) -> list[str]:
    """Why a terminal status may not have come, from what the client can check; never a rejection it did not see."""
    found: list[str] = []
    if any(s.state is OrderStatus.RECEIVED for s in statuses):
        found.append("the order was accepted (status received), so it was not rejected: it is being processed "
                     "or waiting for a retry")
    elif watch.checked:
        found.append(f"no status at all, and the message is not dead-lettered on {watch.orders_queue}")
    else:
        found.append("no status at all")
    inbound = watch._active(watch.orders_queue)
    if inbound:
        found.append(f"{watch.orders_queue} holds {inbound} message(s) nobody has taken: is devhost "
                     f"(python -m devhost start) running?")
    started = _started_by_up(args.app_dir)  # `python -m devhost up` records URLs and pids in .devhost/up.json
    host_url = urlsplit(str(started.get("devhost", {}).get("url") or ""))
    host = host_url.hostname if args.host_port is None and host_url.hostname else "127.0.0.1"
    host_port = args.host_port or (host_url.port if host_url.hostname else None) or 7071
    found.append(f"devhost on {host}:{host_port}: "
                 + ("reachable" if _reachable(host, host_port) else
                    "not reachable (python -m devhost up, or start; or --host-port)"))
    agent = started.get("agent", {})
    if isinstance(agent.get("pid"), int):
        found.append(f"the Agent (pid {agent['pid']}, started by devhost up): "
                     + ("running" if _alive(agent["pid"]) else "not running")
                     + (f"; its log: {agent['log']}" if agent.get("log") else ""))
    values = HostConfig.load(args.app_dir.resolve()).values if args.app_dir.exists() else {}
    remote = (str(started.get("simulator", {}).get("url") or "") or os.environ.get("AGENT_REMOTE_URL")
              or values.get("AGENT_REMOTE_URL") or "http://127.0.0.1:8765")
    url = urlsplit(remote)
    if url.hostname:
        port = url.port or (443 if url.scheme == "https" else 80)
        found.append(f"the remote service (simulator) at {remote}, the Agent's AGENT_REMOTE_URL: "
                     + ("reachable" if _reachable(url.hostname, port) else
                        "not reachable: start it (python -m agent.simulator --port "
                        f"{port}) or set AGENT_REMOTE_URL; the Agent retries, then the order fails"))
    backlog = watch._active(watch.agent_queue)
    if backlog:
        draining = watch.agent_backlog_before is not None and backlog < watch.agent_backlog_before
        found.append(f"{watch.agent_queue} holds {backlog} request(s)"
                     + (" (draining)" if draining else " and is not draining: is the Agent (python -m agent) "
                        "running? see its log"))
    elif backlog == 0:
        found.append(f"{watch.agent_queue} is empty: the Agent has taken every request (or none was sent yet)")
    return found


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
