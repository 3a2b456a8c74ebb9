"""A submitting application: send one order, then print its statuses from the app's reply queue.

    .venv/bin/python examples/client.py                        # a sample order built here
    .venv/bin/python examples/client.py --file examples/my-order.json
    .venv/bin/python examples/client.py --order-id 'bad/id'    # rejected: exits 2 with the reason

Connection: ServiceBusConnection, else SERVICEBUS_FULLY_QUALIFIED_NAMESPACE (or ServiceBusConnection__fully...)
with DefaultAzureCredential. Sends to the app's own `<app>-orders` (the app of `replyTo` `<app>-status`, default
`app-status`; ORDERS_QUEUE_NAME overrides), SessionId = orderId, MessageId `<orderId>:<sha256 of the body, 12 hex>`;
reads statuses from `replyTo`; exits 0 completed, 1 not completed, 2 rejected, 3 no connection."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

try:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
    from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError
except ImportError:  # the system python3: no azure-servicebus
    sys.exit(
        f"{sys.executable} has no azure-servicebus: run .venv/bin/python examples/client.py from the repo root "
        "(or pip install azure-servicebus azure-identity)"
    )

REPO_ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("completed", "failed", "compensated", "compensation-failed", "cancelled", "rejected")


def sample_order(order_id: str) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "type": "SubmitOrder",
        "orderId": order_id,
        "replyTo": "app-status",
        "customer": {"id": "c-1", "name": "Contoso"},
        "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": "9.99"}],
        "currency": "EUR",
    }


def connect() -> Any:
    """A ServiceBusClient (or the embedded broker's equivalent) from the environment."""
    conn = os.environ.get("ServiceBusConnection")
    if conn and conn.startswith("Endpoint=embedded://"):
        sys.path.insert(0, str(REPO_ROOT))  # orderflow is not installed; it lives in the repo
        from orderflow.adapters import bus_from_connection_string

        return bus_from_connection_string(conn)
    if conn:
        return ServiceBusClient.from_connection_string(conn)
    namespace = os.environ.get("SERVICEBUS_FULLY_QUALIFIED_NAMESPACE") or os.environ.get(
        "ServiceBusConnection__fullyQualifiedNamespace"
    )
    if namespace:
        from azure.identity import DefaultAzureCredential

        return ServiceBusClient(namespace, DefaultAzureCredential())
    return None


def local_rejection(body: str) -> str | None:
    """The reason the system would dead-let this order, when the repo's validator is importable (else None)."""
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from orderflow.messages import InvalidMessage, parse_submit_order
    except ImportError:
        return None
    try:
        parse_submit_order(body)
    except InvalidMessage as exc:
        return str(exc)
    return None


def dead_letter_reason(client: Any, queue: str, message_id: str) -> tuple[str | None, bool]:
    """(the dead-letter reason of our message on the orders queue or None, whether we could read that queue)."""
    try:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            for m in dlq.peek_messages(max_message_count=250):
                if str(m.message_id) == message_id:
                    return f"{m.dead_letter_reason}: {m.dead_letter_error_description or ''}".rstrip(": "), True
    except ServiceBusError:  # in Azure a submitting app may only send to the orders queue (Data Sender)
        return None, False
    return None, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Send one order and print its statuses until a terminal one (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--file", type=Path, help="an order as JSON (e.g. examples/my-order.json), not the sample")
    parser.add_argument("--order-id", help="set the orderId (default: the file's, or a new order-<random>)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a terminal status")
    args = parser.parse_args(argv)

    order_id = args.order_id or f"order-{uuid.uuid4().hex[:10]}"
    order = json.loads(args.file.read_text()) if args.file else sample_order(order_id)
    if args.order_id or "orderId" not in order:
        order["orderId"] = order_id
    order.setdefault("submittedAt", datetime.now(UTC).isoformat())
    order_id = str(order["orderId"])
    reply_queue = str(order.get("replyTo", "app-status"))
    # Each app sends to its own `<app>-orders` and reads its own `<app>-status` (README, "Who may do what").
    orders_queue = os.environ.get("ORDERS_QUEUE_NAME") or f"{reply_queue.removesuffix('-status')}-orders"
    body = json.dumps(order)
    message_id = f"{order_id}:{hashlib.sha256(body.encode()).hexdigest()[:12]}"

    reason = local_rejection(body)
    if reason:
        print(f"rejected (not sent): {reason}")
        return 2
    client = connect()
    if client is None:
        print(
            "no connection: set ServiceBusConnection (a connection string, e.g. Endpoint=embedded://... for the "
            "local system) or SERVICEBUS_FULLY_QUALIFIED_NAMESPACE (Azure, with DefaultAzureCredential)"
        )
        return 3

    with client:
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(
                ServiceBusMessage(body, session_id=order_id, message_id=message_id, content_type="application/json")
            )
        print(f"sent {order_id} to {orders_queue} (MessageId {message_id}); statuses from {reply_queue}:")
        try:
            # Status messages carry SessionId = orderId: receive this order's session from the reply queue.
            with client.get_queue_receiver(reply_queue, session_id=order_id, max_wait_time=args.timeout) as receiver:
                for message in receiver:
                    status = json.loads(b"".join(message.body))
                    receiver.complete_message(message)
                    print(f"  {status['state']:<10} attempt {status['attempt']}  {status['reason']}", flush=True)
                    if status["state"] in TERMINAL:
                        return 2 if status["state"] == "rejected" else 0 if status["state"] == "completed" else 1
        except OperationTimeoutError:  # the embedded broker: no session message within max_wait_time
            pass
        dead, readable = dead_letter_reason(client, orders_queue, message_id)
        if dead:
            print(f"rejected by the system (dead-lettered on {orders_queue}): {dead}")
            return 2
        checked = (
            f"not dead-lettered on {orders_queue}"
            if readable
            else f"{orders_queue}'s dead-letter queue is not readable here; a rejection would be there"
        )
        print(
            f"no terminal status within {args.timeout:g} s ({checked}): is the app running, and are the Agent and "
            f"the remote service (the simulator, locally) reachable? Locally: .venv/bin/python -m devhost queues"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
