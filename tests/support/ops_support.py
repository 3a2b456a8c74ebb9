"""Support for the operator tools' tests: an app folder on the embedded broker and store (what `orderflow` reads),
records seeded in any ProcessState through the state machine's own moves, and a direct count of the store."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

from orderflow import state_machine as sm
from orderflow.messages import SubmitOrder
from orderflow.ports import OrdersDb, StateStore
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState, StepName, instance_id

ROOT = Path(__file__).resolve().parents[2]
LEASE = timedelta(seconds=60)


def app_dir(tmp_path: Path, **values: str) -> Path:
    """An app folder whose local.settings.json points at embedded stores under it (what `orderflow` reads)."""
    folder = tmp_path / "app"
    folder.mkdir(exist_ok=True)
    config = ROOT / "servicebus.config.json"
    settings = {
        "ServiceBusConnection": f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={config}",
        "CosmosDb__accountEndpoint": f"embedded://{tmp_path / 'store.db'}",
        "DurableTaskApiUrl": "http://127.0.0.1:9/runtime/webhooks/durabletask",  # nothing listens: no Durable API
        **values,
    }
    (folder / "local.settings.json").write_text(json.dumps({"IsEncrypted": False, "Values": settings}))
    return folder


def order(order_id: str, reply_to: str = "app-status") -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": reply_to,
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-01-01T00:00:00+00:00",
        }
    )


def key_of(order_id: str, app: str | None) -> str:
    """The order key of `app`'s `order_id` (orderflow/apps.py); the bare orderId for None (the legacy app)."""
    return order_id if app is None else f"{app}.{order_id}"


def in_state(order_id: str, state: ProcessState, at: datetime, app: str | None = None) -> OrderStateRecord:
    """A record in `state` reached by the state machine's moves, last changed at `at`; of `app` (its key
    `<app>.<orderId>`, its status queue) when given, else of the legacy app."""
    key = key_of(order_id, app)
    submitted = order(order_id, "app-status" if app is None else f"{app}-status")
    rec = OrderStateRecord.new(submitted, at).model_copy(update={"id": key, "order_id": key, "app": app})
    if state is ProcessState.PENDING:
        return rec
    first = instance_id(key, 1)
    rec = sm.claim(rec, first, at + LEASE, at)
    if state is ProcessState.PROCESSING:
        return rec
    if state is ProcessState.PROCESSED:
        return sm.complete(rec, first, at)
    if state is ProcessState.ERROR:
        return sm.fail(rec, first, "reserve-inventory: OutOfStock", at)
    rec = sm.set_step_deadline(rec, first, StepName.RESERVE_INVENTORY, at + LEASE, at)
    rec = sm.begin_compensation(rec, first, "charge-payment: CardDeclined", at + LEASE, at)
    if state is ProcessState.COMPENSATING:
        return rec
    if state is ProcessState.COMPENSATION_FAILED:
        return sm.fail(rec, first, "release-inventory: Refused", at)
    raise ValueError(state)


async def seed(
    orders: OrdersDb, states: StateStore, order_id: str, state: ProcessState, at: datetime, app: str | None = None
) -> OrderStateRecord:
    rec = in_state(order_id, state, at, app)
    stored = OrderRecord.from_order(order(order_id), at)
    await orders.create_if_absent(stored.model_copy(update={"id": rec.id, "order_id": rec.order_id, "app": app}))
    stored, created = await states.create_if_absent(rec)
    assert created
    return stored


def direct_counts(store: Path) -> dict[str, int]:
    """Records per processState, read from the stored documents themselves (not through the adapter)."""
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT json_extract(doc, '$.processState'), COUNT(*) FROM order_state GROUP BY 1")
        return {str(state): int(n) for state, n in rows}
