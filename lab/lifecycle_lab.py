"""The `Lab`: a started local system as a drill sees and drives it (the client app's statuses, the stores, the
simulator's ledger, the queues, the dead-letter sub-queue, the operator alerts, devhost's durable history), and the
verdict a lifecycle-style drill ends in (`lifecycle_verdict`). The lifecycle, input and timing drills share it."""

from __future__ import annotations

import asyncio
import inspect
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.durable_functions.models.history import HistoryEventType
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode

from orderflow.messages import (
    STEPS,
    AlertKind,
    OperatorAlert,
    OrderStatus,
    StatusMessage,
    StepName,
    SubmitOrder,
    idempotency_key,
)
from orderflow.operations import cancel_message
from orderflow.records import OrderStateRecord, ProcessState
from orderflow.retention import FINISHED_STATUSES

from .demo import ClientApp, simulator_json
from .drill_common import (
    Verdict,
)
from .invariants import DeadLettered, dead_letters
from .system import LocalSystem

PENDING_LIKE = (ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.COMPENSATING)
WAIT_STEP_S = 30.0  # the longest any one stage of a drill waits for what it expects


# --- what the drills read: the ledger, the queues, the store, the durable history -------------------------------


@dataclass(frozen=True)
class Ledger:
    """The simulator's `GET /effects` and `GET /calls`, by order."""

    report: dict[str, Any]
    calls: list[dict[str, Any]]

    @property
    def duplicates(self) -> int:
        return int(self.report.get("duplicates", -1))  # -1: the ledger could not be read

    def applied(self, order_id: str) -> list[str]:
        """Forward steps whose effect was applied (once or more), in step order."""
        done = {e["step"] for e in self.report.get("effects", []) if e["orderId"] == order_id and e["applied"] >= 1}
        return [s.value for s in STEPS if s.value in done]

    def effect_counts(self, order_id: str) -> dict[str, int]:
        return {e["step"]: e["applied"] for e in self.report.get("effects", []) if e["orderId"] == order_id}

    def compensation_counts(self, order_id: str) -> dict[str, int]:
        return {
            c["compensation"]: c["applied"] for c in self.report.get("compensations", []) if c["orderId"] == order_id
        }

    def undone(self, order_id: str) -> list[str]:
        gone = {u["step"] for u in self.report.get("undone", []) if u["orderId"] == order_id}
        return [s.value for s in STEPS if s.value in gone]

    def keys_called(self, order_id: str) -> dict[str, int]:
        """Calls per step or compensation of one order (`callsByKey`, keyed `<orderId>:<name>`)."""
        prefix = f"{order_id}:"
        return {k[len(prefix) :]: n for k, n in self.report.get("callsByKey", {}).items() if k.startswith(prefix)}

    def first_call(self, order_id: str, name: str, status: int | None = None) -> float | None:
        """Arrival (Unix s) of the first call of one step or compensation (with that HTTP status, if given)."""
        key = idempotency_key(order_id, name)
        return next(
            (c["at"] for c in self.calls if c["key"] == key and (status is None or c["status"] == status)), None
        )

    def call_order(self, order_id: str, names: list[str]) -> list[str]:
        """`names` that were answered 200 at least once, in the order of their first such call."""
        firsts = {n: self.first_call(order_id, n, 200) for n in names}
        return [n for n, _ in sorted(((n, at) for n, at in firsts.items() if at is not None), key=lambda x: x[1])]


async def read_ledger(system: LocalSystem) -> Ledger:
    report = await simulator_json(system, "/effects")
    calls = (await simulator_json(system, "/calls")).get("calls", [])
    return Ledger(report, calls)


def _drain_alerts(connection: str, queue: str) -> list[OperatorAlert]:
    """Every operator alert queued so far (received and deleted: the drill is their operator)."""
    from orderflow.adapters import bus_from_connection_string

    alerts: list[OperatorAlert] = []
    with (
        bus_from_connection_string(connection) as bus,
        bus.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=0.2):
            alerts.extend(OperatorAlert.model_validate_json(b"".join(m.body)) for m in batch)
    return alerts


def _active_messages(connection: str, queue: str) -> int:
    """Messages of `queue` not yet settled (locked ones included), on the embedded broker."""
    from orderflow.adapters import bus_from_connection_string

    with bus_from_connection_string(connection) as bus:
        return int(bus.broker.counts(queue).active)


def durable_instances(db: Path) -> dict[str, dict[str, Any]]:
    """devhost's durable.db: each instance's runtime status, output and ExecutionStarted.Version."""
    out: dict[str, dict[str, Any]] = {}
    if not db.exists():
        return out
    with sqlite3.connect(db, timeout=30) as conn:
        for instance_id, status, output in conn.execute("SELECT instance_id, status, output FROM instances"):
            out[instance_id] = {"status": status, "output": json.loads(output) if output else None}
        for instance_id, text in conn.execute("SELECT instance_id, event FROM history ORDER BY instance_id, seq"):
            event = json.loads(text)
            entry = out.setdefault(instance_id, {"status": None, "output": None})
            if event.get("EventType") == HistoryEventType.EXECUTION_STARTED and "version" not in entry:
                entry["version"] = event.get("Version")
    return out


async def until(probe: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """Poll `probe` (a function, sync or async) until it returns something truthy (returned) or `timeout` s pass
    (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(every)


class Lab:
    """A started system as the drill sees and drives it: the client app (its statuses), the stores, the simulator,
    the app's orders queue, the dead-letter sub-queue and the operator alerts. Each wait that times out is noted."""

    def __init__(self, system: LocalSystem, client: ClientApp) -> None:
        from orderflow.adapters import open_stores

        self.system = system
        self.client = client
        self.env = system.env()
        self.stores = open_stores(self.env)
        self.orders_queue = client.orders_queue  # the submitting app's own inbound queue (`<app>-orders`)
        self.alerts_queue = self.env.get("OperatorAlertsQueueName", "operator-alerts")
        self.timeouts: list[str] = []
        self.alerts: list[OperatorAlert] = []

    async def aclose(self) -> None:
        await self.stores.aclose()

    async def wait(self, probe: Callable[[], Any], what: str, timeout: float = WAIT_STEP_S) -> Any:
        found = await until(probe, timeout)
        if not found:
            self.timeouts.append(what)
        return found

    async def ended_instances(self, records: dict[str, OrderStateRecord]) -> dict[str, dict[str, Any]]:
        """devhost's durable.db (`durable_instances`) once each record's attempt has ended: an orchestrator returns
        only after its last activity sent the order's terminal status. At the timeout (noted), what is there."""
        db = self.system.config.work_dir / "devhost" / "durable.db"
        keys = [f"{o}:{r.attempt}" for o, r in records.items()]

        def ended() -> dict[str, dict[str, Any]] | None:
            found = durable_instances(db)
            return found if all(found.get(k, {}).get("status") in FINISHED_STATUSES for k in keys) else None

        return await self.wait(ended, "every order's instance ended") or durable_instances(db)

    # sending
    async def send(self, messages: list[ServiceBusMessage]) -> None:
        """One batch on the orders queue: the messages of one session keep their order (sequence numbers)."""
        async with self.client.bus.get_queue_sender(self.orders_queue) as sender:
            await sender.send_messages(messages)

    async def submit(self, orders: list[SubmitOrder]) -> None:
        await self.client.submit(orders)

    async def cancel(self, order_id: str, reason: str | None = None) -> float:
        """A client's CancelOrder (devhost/client.py `cancel_message`); returns when it was sent (Unix s)."""
        sent = time.time()
        await self.send([cancel_message(order_id, self.client.reply_queue, reason)])
        return sent

    async def script(self, script: dict[str, list[str]]) -> None:
        await simulator_json(self.system, "/script", script)

    # reading
    def statuses(self, order_id: str, state: OrderStatus | None = None) -> list[StatusMessage]:
        return [s for s in self.client.statuses.get(order_id, []) if state is None or s.state is state]

    def status(self, order_id: str, state: OrderStatus) -> StatusMessage | None:
        found = self.statuses(order_id, state)
        return found[0] if found else None

    async def record(self, order_id: str) -> tuple[OrderStateRecord, str] | None:
        found = await self.stores.state.get(order_id)
        return None if found is None else (found[0], found[1])

    async def records(self, order_ids: list[str]) -> dict[str, OrderStateRecord]:
        out: dict[str, OrderStateRecord] = {}
        for order_id in order_ids:
            found = await self.record(order_id)
            if found is not None:
                out[order_id] = found[0]
        return out

    async def ledger(self) -> Ledger:
        return await read_ledger(self.system)

    async def applied(self, order_id: str, step: StepName) -> bool:
        return step.value in (await self.ledger()).applied(order_id)

    async def dead_letters(self) -> list[DeadLettered]:
        return await asyncio.to_thread(dead_letters, self.system.config.bus_connection, self.orders_queue)

    async def read_alerts(self) -> list[OperatorAlert]:
        self.alerts.extend(await asyncio.to_thread(_drain_alerts, self.system.config.bus_connection, self.alerts_queue))
        return self.alerts

    def alerts_of(self, order_id: str, kind: AlertKind) -> list[OperatorAlert]:
        return [a for a in self.alerts if a.order_id == order_id and a.kind is kind]

    async def inbound_settled(self) -> bool:
        return await asyncio.to_thread(_active_messages, self.system.config.bus_connection, self.orders_queue) == 0


def status_matches_ledger(status: StatusMessage | None, ledger: Ledger, order_id: str) -> bool:
    """The terminal status tells what the remote did: its `effects` (applied, undone) equal the ledger's."""
    if status is None:
        return False
    applied, undone = ledger.applied(order_id), ledger.undone(order_id)
    if status.effects is None:
        return not applied and not undone
    return ([s.value for s in status.effects.applied], [s.value for s in status.effects.undone]) == (applied, undone)


def lifecycle_verdict(
    drill: str,
    lab: Lab,
    order_ids: list[str],
    records: dict[str, OrderStateRecord],
    ledger: Ledger,
    checks: dict[str, bool],
    figures: dict[str, Any],
    elapsed: float,
) -> Verdict:
    """The verdict with the checks every drill has: none lost (every order has its final status and its record),
    no duplicate side effect (the ledger), none stuck (Pending, Processing or CompensationInProgress at the end)."""
    lost = sum(1 for o in order_ids if o not in lab.client.terminal_at or o not in records)
    stuck = sum(1 for o in order_ids if o in records and records[o].process_state in PENDING_LIKE)
    duplicates = ledger.duplicates
    common = {"none lost": lost == 0, "no duplicate side effect": duplicates == 0, "none stuck": stuck == 0}
    figures = {
        **figures,
        "waits_timed_out": lab.timeouts,
        "elapsed_s": round(elapsed, 1),
        "work_dir": str(lab.system.config.work_dir),
    }
    return Verdict(drill, len(order_ids), lost, duplicates, stuck, {**common, **checks}, figures)


def elapsed_s(at: float | None, since: float | None) -> float | None:
    return None if at is None or since is None else round(at - since, 3)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3)}
