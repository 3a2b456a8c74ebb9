"""What the client-app commands of `orderflow.cli.client` do while they wait: read an order's statuses from its
reply-queue session (`submit`, `cancel`) or every session of a reply queue (`watch`, `submit --count`), look for the
sent message's dead-lettering (`_Watch`), and, when no terminal status came, say what the client can check
(`_diagnose`: devhost, the Agent, the simulator, the queues' backlog)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError
from rich.console import Console

from orderflow.cli.common import load_settings, safe, started_by_up
from orderflow.errors import is_missing_entity
from orderflow.messages import TERMINAL_STATUSES, OrderStatus, StatusMessage
from orderflow.text import first_line, shown


class _Watch:
    """What the client can see of the system while it waits: whether its message was dead-lettered (peeked from
    the orders queue's dead-letter sub-queue, from where the last look ended) and, on the embedded broker, the
    backlog of orders-inbound and agent-requests when the wait began."""

    def report_dead_letter(self, console: Console) -> bool:
        """Print the dead-lettering of the client's message, if it happened; whether it did."""
        dead = self.dead_lettered()
        if dead is None:
            return False
        console.print(
            f"[red]rejected: {safe(dead.dead_letter_reason)}: "
            f"{safe(dead.dead_letter_error_description or '')} "
            f"(dead-lettered on {safe(self.orders_queue)}; orderflow queues)[/]"
        )
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
        keep = _SessionKeeper(receiver.session)
        while (remaining := deadline - time.monotonic()) > 0:
            for message in receiver.receive_messages(max_message_count=10, max_wait_time=min(1.0, remaining)):
                receiver.complete_message(message)
                yield StatusMessage.model_validate_json(b"".join(message.body))
            keep.renew_when_due()
            yield None


class _SessionKeeper:
    """Renews a held session's lock once half of its span has passed, so that a wait longer than the queue's
    LockDuration (`--wait 90` against app-status's 1 minute) keeps the session instead of losing it
    (SessionLockLostError): Service Bus locks a session for LockDuration from the accept or the last renewal."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.span = self._left()

    def _left(self) -> float:
        until = getattr(self.session, "locked_until_utc", None)
        return 0.0 if until is None else (until - datetime.now(UTC)).total_seconds()

    def renew_when_due(self) -> None:
        if self.span > 0 and self._left() < self.span / 2:
            self.session.renew_lock()
            self.span = max(self._left(), self.span)


def _follow(
    client: Any, reply_to: str, order_id: str, wait: float, console: Console, watch: _Watch
) -> tuple[int | None, list[StatusMessage]]:
    """Print the order's statuses until a terminal one (0) or a known rejection (1); None when `wait` ran out."""
    statuses: list[StatusMessage] = []
    try:
        for status in _statuses(client, reply_to, order_id, wait):
            if status is None:
                if not statuses and watch.report_dead_letter(console):
                    return 1, statuses
                continue
            statuses.append(status)
            console.print(
                f"  {status.timestamp.isoformat()}  {status.state.value:<10} attempt "
                f"{status.attempt}  {safe(status.reason)}"
            )
            if status.state in TERMINAL_STATUSES:  # 0: completed; 1: it ended otherwise (failed, compensated...)
                return (0 if status.state is OrderStatus.COMPLETED else 1), statuses
            if status.state is OrderStatus.REJECTED:  # admission control: nothing was stored
                console.print(f"[red]rejected: {safe(status.reason)} (nothing stored; submit it again later)[/]")
                return 1, statuses
    except OperationTimeoutError:
        pass
    except ServiceBusError as exc:  # a missing queue, as the SDK raises it (orderflow.errors.is_missing_entity)
        if not is_missing_entity(exc):
            raise
        console.print(
            f"[yellow]there is no reply queue {safe(repr(reply_to))}: the system cannot answer this order "
            f"(replyTo must be an existing, allowed reply queue)[/]"
        )
        return 1, statuses
    return None, statuses


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


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
        found.append(
            "the order was accepted (status received), so it was not rejected: it is being processed "
            "or waiting for a retry"
        )
    elif watch.checked:
        found.append(f"no status at all, and the message is not dead-lettered on {watch.orders_queue}")
    else:
        found.append("no status at all")
    inbound = watch._active(watch.orders_queue)
    if inbound:
        found.append(
            f"{watch.orders_queue} holds {inbound} message(s) nobody has taken: is devhost "
            f"(python -m devhost start) running?"
        )
    started = started_by_up(args.app_dir)  # `python -m devhost up` records URLs and pids in .devhost/up.json
    host_url = urlsplit(str(started.get("devhost", {}).get("url") or ""))
    host = host_url.hostname if args.host_port is None and host_url.hostname else "127.0.0.1"
    host_port = args.host_port or (host_url.port if host_url.hostname else None) or 7071
    found.append(
        f"devhost on {host}:{host_port}: "
        + (
            "reachable"
            if _reachable(host, host_port)
            else "not reachable (python -m devhost up, or start; or --host-port)"
        )
    )
    agent = started.get("agent", {})
    if isinstance(agent.get("pid"), int):
        found.append(
            f"the Agent (pid {agent['pid']}, started by devhost up): "
            + ("running" if _alive(agent["pid"]) else "not running")
            + (f"; its log: {agent['log']}" if agent.get("log") else "")
        )
    values = load_settings(args.app_dir.resolve()) if args.app_dir.exists() else dict(os.environ)
    remote = (
        str(started.get("simulator", {}).get("url") or "") or values.get("AGENT_REMOTE_URL") or "http://127.0.0.1:8765"
    )
    url = urlsplit(remote)
    if url.hostname:
        port = url.port or (443 if url.scheme == "https" else 80)
        found.append(
            f"the remote service (simulator) at {remote}, the Agent's AGENT_REMOTE_URL: "
            + (
                "reachable"
                if _reachable(url.hostname, port)
                else "not reachable: start it (python -m lab.simulator --port "
                f"{port}) or set AGENT_REMOTE_URL; the Agent retries, then the order fails"
            )
        )
    backlog = watch._active(watch.agent_queue)
    if backlog:
        draining = watch.agent_backlog_before is not None and backlog < watch.agent_backlog_before
        found.append(
            f"{watch.agent_queue} holds {backlog} request(s)"
            + (
                " (draining)"
                if draining
                else " and is not draining: if the Agent is not running, start "
                "it (python -m agent); if it is, a call may be held (a hang), or the circuit breaker open: "
                "orderflow breaker show, orderflow order ORDER_ID"
            )
        )
    elif backlog == 0:
        found.append(f"{watch.agent_queue} is empty: the Agent has taken every request (or none was sent yet)")
    return found


def _all_statuses(
    client: Any, queue: str, wait: float, done: Any = lambda: False, session: str | None = None
) -> Iterator[StatusMessage]:
    """Statuses on `queue` (every session, or one), each completed as it is read, for at most `wait` seconds or
    until `done()`. A body that is not a status is reported on stderr and left in the queue."""
    from azure.servicebus import NEXT_AVAILABLE_SESSION

    deadline = time.monotonic() + wait
    while not done() and (remaining := deadline - time.monotonic()) > 0:
        try:
            with client.get_queue_receiver(
                queue, session_id=session or NEXT_AVAILABLE_SESSION, max_wait_time=min(remaining, 5.0)
            ) as receiver:
                while not done() and (left := deadline - time.monotonic()) > 0:
                    batch = receiver.receive_messages(max_message_count=50, max_wait_time=min(left, 1.0))
                    if not batch:
                        break
                    for message in batch:
                        try:
                            status = StatusMessage.model_validate_json(b"".join(message.body))
                        except ValueError as exc:
                            print(
                                f"not a status (left on {queue}): {shown(message.message_id)}: "
                                f"{shown(first_line(exc))}",
                                file=sys.stderr,
                            )
                            continue
                        receiver.complete_message(message)
                        yield status
        except OperationTimeoutError:
            continue


# What a cancel's answer means for `cancel`'s exit code: the cancel took effect (0), or not (1).
CANCEL_DONE = frozenset({OrderStatus.CANCELLED, OrderStatus.COMPENSATED})
CANCEL_ANSWERS = TERMINAL_STATUSES | {OrderStatus.REJECTED}


def _follow_cancel(
    client: Any, reply_to: str, order_id: str, sent_at: datetime, wait: float, console: Console, watch: _Watch
) -> int:
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
            effects = (
                ""
                if status.effects is None
                else (
                    f"  applied {[s.value for s in status.effects.applied]} undone "
                    f"{[s.value for s in status.effects.undone]}"
                )
            )
            console.print(
                f"  {status.timestamp.isoformat()}  {status.state.value:<19} attempt {status.attempt}  "
                f"{safe(status.reason)}{effects}" + ("  (before the cancel)" if earlier else "")
            )
            if not earlier and status.state in CANCEL_ANSWERS:
                return 0 if status.state in CANCEL_DONE else 1
    except OperationTimeoutError:
        pass
    except ServiceBusError as exc:
        if not is_missing_entity(exc):
            raise
        console.print(f"[yellow]there is no reply queue {safe(repr(reply_to))}[/]")
        return 1
    console.print(
        f"[yellow]no answer within {wait:g} s: an order whose step is running is cancelled at once or at "
        f"its next step (wait longer); a repeated cancel changes nothing and is not answered again[/]"
    )
    return 1
