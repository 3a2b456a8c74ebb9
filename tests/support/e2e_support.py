"""End-to-end support: one `LocalSystem` (devhost + the Agent + the simulator as OS processes) and a client's
view of it: submit on orders-inbound, read statuses on app-status, operator alerts, the orders-inbound
dead-letter sub-queue, the state store, the simulator's ledger and script, and devhost's Durable HTTP API.

Every read is a non-blocking poll (receive-and-delete with no wait, or a store/HTTP read) so that tests
wait only through `wait_until`, on an observable condition with a bounded timeout.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

from lab.system import ROOT, LocalSystem, SystemConfig
from orderflow.adapters import bus_from_connection_string, open_stores
from orderflow.embedded.rights import AGENT, OPERATORS
from orderflow.messages import TERMINAL_STATUSES, AgentReply, OperatorAlert, OrderStatus, StatusMessage, SubmitOrder
from orderflow.records import OrderRecord, OrderStateRecord
from orderflow.retention import FINISHED_STATUSES
from support.hosted import wait_until

ORDERS_QUEUE = "orders-inbound"
REPLY_QUEUE = "app-status"
ALERTS_QUEUE = "operator-alerts"
REPLIES_QUEUE = "agent-replies"
RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE
POLL_WAIT = 0.05  # the SDK refuses 0 (azure-servicebus: "max_wait_time must be greater than 0")
# Over AMQP a receive-and-delete message is gone from the broker once sent: one that reaches the SDK after its receive
# returned is dropped when the receiver closes. 50 ms lost the poison's dead letter on a loaded machine (`make test`
# runs three files side by side), so the real SDK waits longer; an empty poll costs this much.
AMQP_POLL_WAIT = 1.0

# Short settings so that a timeout, a recovery and a retry each take seconds (SystemConfig.settings).
FAST_SETTINGS = {
    "StepTimeoutSeconds": "3",
    "ClaimLeaseSeconds": "3",
    "SupervisorSchedule": "*/1 * * * * *",
    "StarterSchedule": "*/1 * * * * *",
    "RetryBackoffBaseSeconds": "1",
    "RetryBackoffMaxSeconds": "2",
    "FailureThreshold": "3",
}


def new_order_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def make_order(order_id: str, quantity: int = 1) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": REPLY_QUEUE,
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-001", "quantity": quantity, "unitPrice": "12.50"}],
            "currency": "EUR",
            "submittedAt": "2024-01-01T00:00:00+00:00",
        }
    )


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    reason: str | None
    description: str | None
    body: bytes


@dataclass
class Client:
    """The submitting application and the operator's console, against a running `LocalSystem`, each with the
    identity infra/ gives it: orders, cancels and statuses as the submitting application, alerts as the operators,
    a forged Agent reply as the Agent; `bus` is the owner's, for the checks that read any queue (dead letters)."""

    system: LocalSystem
    bus: Any = None
    app: Any = None
    _statuses: dict[str, list[StatusMessage]] = field(default_factory=lambda: defaultdict(list))
    _alerts: list[OperatorAlert] = field(default_factory=list)
    _dead: dict[str, DeadLetter] = field(default_factory=dict)
    _as: dict[str, Any] = field(default_factory=dict)
    poll_wait: float = POLL_WAIT

    def __post_init__(self) -> None:
        # The system's own transport: the embedded client, or the real SDK over the AMQP endpoint (SystemConfig).
        self.bus = bus_from_connection_string(self.system.app_bus_connection)
        if self.system.config.transport == "amqp":
            self.poll_wait = AMQP_POLL_WAIT
        self.app = self.acting_as(self.system.submitter)

    def acting_as(self, identity: str) -> Any:
        """A client of the system's transport acting as `identity` (orderflow/embedded/rights)."""
        if identity not in self._as:
            self._as[identity] = bus_from_connection_string(self.system.bus_connection_for(identity))
        return self._as[identity]

    # --- sending --------------------------------------------------------------------------------------------
    def send(self, body: str | bytes, *, message_id: str, session_id: str) -> None:
        with self.app.get_queue_sender(ORDERS_QUEUE) as sender:
            sender.send_messages(
                ServiceBusMessage(body, message_id=message_id, session_id=session_id, content_type="application/json")
            )

    def submit(self, order: SubmitOrder, message_id: str | None = None) -> None:
        self.send(order.to_json(), message_id=message_id or f"submit:{order.order_id}", session_id=order.order_id)

    def cancel(self, order_id: str, reason: str | None = None, *, reply_to: str = REPLY_QUEUE) -> str:
        """A client's CancelOrder on orders-inbound in the order's session (`devhost.client.cancel_message`: each
        cancel its own MessageId); returns the MessageId."""
        from orderflow.operations import cancel_message

        message = cancel_message(order_id, reply_to, reason)
        with self.app.get_queue_sender(ORDERS_QUEUE) as sender:
            sender.send_messages(message)
        return str(message.message_id)

    def send_agent_reply(self, reply: AgentReply) -> None:
        """An Agent reply on agent-replies, as the Agent sends it (SessionId = orderId, stable MessageId)."""
        with self.acting_as(AGENT).get_queue_sender(REPLIES_QUEUE) as sender:
            sender.send_messages(
                ServiceBusMessage(reply.to_json(), message_id=reply.message_id(), session_id=reply.order_id)
            )

    # --- reading queues (non-blocking polls, accumulated) ---------------------------------------------------
    def statuses(self, order_id: str) -> list[StatusMessage]:
        with self.app.get_queue_receiver(REPLY_QUEUE, session_id=order_id, receive_mode=RECEIVE_AND_DELETE) as r:
            for msg in r.receive_messages(max_message_count=50, max_wait_time=self.poll_wait):
                self._statuses[order_id].append(StatusMessage.model_validate_json(b"".join(msg.body)))
        return list(self._statuses[order_id])

    def alerts(self, order_id: str) -> list[OperatorAlert]:
        with self.acting_as(OPERATORS).get_queue_receiver(ALERTS_QUEUE, receive_mode=RECEIVE_AND_DELETE) as r:
            for msg in r.receive_messages(max_message_count=100, max_wait_time=self.poll_wait):
                self._alerts.append(OperatorAlert.model_validate_json(b"".join(msg.body)))
        return [a for a in self._alerts if a.order_id == order_id]

    def dead_letter(self, message_id: str, queue: str = ORDERS_QUEUE) -> DeadLetter | None:
        with self.bus.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, receive_mode=RECEIVE_AND_DELETE
        ) as r:
            for msg in r.receive_messages(max_message_count=100, max_wait_time=self.poll_wait):
                self._dead[str(msg.message_id)] = DeadLetter(
                    str(msg.message_id),
                    msg.dead_letter_reason,
                    msg.dead_letter_error_description,
                    b"".join(msg.body),
                )
        return self._dead.get(message_id)

    def wait_status(self, order_id: str, state: OrderStatus, timeout: float = 30.0) -> StatusMessage:
        def found() -> StatusMessage | None:
            return next((s for s in self.statuses(order_id) if s.state is state), None)

        status: StatusMessage = wait_until(found, timeout, f"status {state.value} of {order_id}")
        return status

    def wait_dead_letter(self, message_id: str, timeout: float = 20.0) -> DeadLetter:
        dead: DeadLetter = wait_until(lambda: self.dead_letter(message_id), timeout, f"dead-letter {message_id}")
        return dead

    # --- stores, simulator, Durable API, logs ---------------------------------------------------------------
    def state(self, order_id: str) -> OrderStateRecord | None:
        found = asyncio.run(self._read(lambda stores: stores.state.get(order_id)))
        return None if found is None else found[0]

    def wait_notified(self, order_id: str, timeout: float = 30.0) -> OrderStateRecord:
        """The state record once its terminal notification is recorded (`notifiedAt`): the last write of a finished
        order (orderflow/notifications.py: the status is sent, then the stored order's TTL, then this write)."""

        def notified() -> OrderStateRecord | None:
            rec = self.state(order_id)
            return rec if rec is not None and rec.notified_at is not None else None

        rec: OrderStateRecord = wait_until(notified, timeout, f"notification of {order_id} recorded")
        return rec

    def order(self, order_id: str) -> OrderRecord | None:
        return asyncio.run(self._read(lambda stores: stores.orders.get(order_id)))  # type: ignore[no-any-return]

    async def _read(self, query: Any) -> Any:
        async with open_stores({"CosmosDb__accountEndpoint": self.system.config.store_endpoint}) as stores:
            return await query(stores)

    def script(self, script: dict[str, list[str]]) -> None:
        """Scripted faults on the simulator (lab.simulator `POST /script`)."""
        self._http("POST", f"{self._simulator_url}/script", script)

    def effects(self, order_id: str) -> dict[str, int]:
        """Side effects applied per step of one order (the simulator's ledger)."""
        report = self._http("GET", f"{self._simulator_url}/effects")
        return {e["step"]: e["applied"] for e in report["effects"] if e["orderId"] == order_id}

    def undone(self, order_id: str) -> list[str]:
        """Steps of one order whose effect the remote undid (the simulator's ledger), sorted by step name."""
        report = self._http("GET", f"{self._simulator_url}/effects")
        return [u["step"] for u in report["undone"] if u["orderId"] == order_id]

    def compensations(self, order_id: str) -> dict[str, int]:
        """Compensation effects applied per compensation of one order (the simulator's ledger)."""
        report = self._http("GET", f"{self._simulator_url}/effects")
        return {c["compensation"]: c["applied"] for c in report["compensations"] if c["orderId"] == order_id}

    def applied(self) -> int:
        """Remote side effects applied so far, every order (the simulator's ledger)."""
        return int(self._http("GET", f"{self._simulator_url}/effects")["totalApplied"])

    def terminal(self, order_id: str) -> bool:
        """Whether a terminal status of `order_id` reached the reply queue."""
        return any(s.state in TERMINAL_STATUSES for s in self.statuses(order_id))

    def calls(self, key: str) -> int:
        return int(self._http("GET", f"{self._simulator_url}/effects")["callsByKey"].get(key, 0))

    def instance(self, instance_id: str) -> dict[str, Any] | None:
        """GET {devhost}/runtime/webhooks/durabletask/instances/<id> (the Durable extension's HTTP API)."""
        assert self.system.devhost is not None and self.system.devhost.url
        try:
            return self._http("GET", f"{self.system.devhost.url}/runtime/webhooks/durabletask/instances/{instance_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def wait_ended(self, instance_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The instance once its runtimeStatus is final: the orchestrator returns only after its last activity sent
        the order's terminal status, so that status can arrive while the instance still runs."""

        def ended() -> dict[str, Any] | None:
            found = self.instance(instance_id)
            return found if found is not None and found["runtimeStatus"] in FINISHED_STATUSES else None

        found: dict[str, Any] = wait_until(ended, timeout, f"instance {instance_id} ended")
        return found

    def devhost_log(self) -> str:
        return (self.system.config.work_dir / "devhost.log").read_text(errors="replace")

    @property
    def _simulator_url(self) -> str:
        assert self.system.simulator is not None and self.system.simulator.url
        return self.system.simulator.url

    @staticmethod
    def _http(method: str, url: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def close(self) -> None:
        for bus in (self.bus, *self._as.values()):
            bus.close()


def short_lock_config(work: Path) -> Path:
    """servicebus.config.json with every queue locking 5 s, written under `work`. The Agent queues already lock 5 s in
    the product (the crash budget of orderflow/session_locks.py); `orders-inbound` and `app-status` lock 1 minute, so
    a submission or a status that a killed process held would make a test wait that long, although it costs no
    attempt."""
    config = json.loads((ROOT / "servicebus.config.json").read_text())
    for namespace in config["UserConfig"]["Namespaces"]:
        for queue in namespace["Queues"]:
            queue["Properties"]["LockDuration"] = "PT5S"
    path = work / "servicebus.config.json"
    path.write_text(json.dumps(config))
    return path


@contextmanager
def running_client(config: SystemConfig) -> Iterator[Client]:
    """The whole local system (devhost, Agent, simulator) on `config`, and a client app of it; stopped after."""
    system = LocalSystem(config).start()
    client = Client(system)
    try:
        yield client
    finally:
        client.close()
        system.stop()
