"""The seeded store of the operator API's end-to-end tests (tests/product/e2e/test_ops_api_e2e.py and
test_ops_api_schemathesis.py): settings that keep the Starter and the Supervisor off the seeded records and turn on
devhost's Easy Auth stand-in (devhost/easy_auth.py), two submitting apps (the legacy `app` and `partner`), records in
every state written straight to the embedded store, and the operators' local tokens."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from devhost.easy_auth import local_token
from lab.system import LocalSystem, SystemConfig
from orderflow.adapters import open_stores
from orderflow.records import OrderRecord, OrderStateRecord, ProcessState, format_utc
from orderflow.supervisor import CHECKPOINT, SupervisorRun, last_run
from support.e2e_support import make_order, new_order_id

NEVER = "0 0 0 1 1 *"  # once a year: the Starter and the Supervisor leave the seeded records alone
SETTINGS = {
    "StarterSchedule": NEVER,
    "SupervisorSchedule": NEVER,
    "StepTimeoutSeconds": "600",
    "ClaimLeaseSeconds": "600",
    "WEBSITE_AUTH_ENABLED": "True",  # devhost's Easy Auth stand-in, and the app trusts its principal
    "SubmittingApps": "app,partner",
    "LegacyOrdersApp": "app",
}
OPERATOR_ROLE = "Orders.Operator"
# The Authorization header of a signed-in operator, and of a principal who is signed in but holds no operator role.
OPERATOR = {"Authorization": local_token("ada@contoso.com", OPERATOR_ROLE)}
NOT_AN_OPERATOR = {"Authorization": local_token("bob@contoso.com", "Orders.Reader")}
EPOCH = datetime.now(UTC).replace(microsecond=0)


def _record(order_id: str, state: ProcessState, updated: datetime, **changes: Any) -> OrderStateRecord:
    rec = OrderStateRecord.new(make_order(order_id), EPOCH - timedelta(days=10))
    return rec.model_copy(update={"process_state": state, "updated_at": updated, **changes})


def _partner(order_id: str, state: ProcessState, updated: datetime) -> OrderStateRecord:
    """A record of the app `partner`: key `partner.<orderId>`, its status queue."""
    key = f"partner.{order_id}"
    rec = _record(order_id, state, updated, reply_to="partner-status")
    return rec.model_copy(update={"id": key, "order_id": key, "app": "partner"})


async def seed(endpoint: str, ids: dict[str, Any]) -> None:
    """Records in every state, by the names in `ids`, and the Supervisor's checkpoint, written to the store."""
    now = EPOCH
    terminal = {"notified_at": now}
    records = [
        *(
            _record(i, ProcessState.PROCESSED, now - timedelta(days=k, hours=1), attempt=1, **terminal)
            for k, i in enumerate(ids["processed"])
        ),
        _record(
            ids["error"],
            ProcessState.ERROR,
            now - timedelta(hours=3),
            attempt=3,
            failure_count=3,
            last_error="step reserve-inventory: no reply before CompleteBy",
            **terminal,
        ),
        _record(
            ids["error_kept"],
            ProcessState.ERROR,
            now - timedelta(hours=2),
            attempt=3,
            failure_count=3,
            last_error="remote refused",
            **terminal,
        ),
        _record(
            ids["compensation_failed"],
            ProcessState.COMPENSATION_FAILED,
            now - timedelta(hours=1),
            attempt=2,
            compensation_failures=3,
            **terminal,
        ),
        _record(ids["pending_oldest"], ProcessState.PENDING, now - timedelta(hours=5)),
        _record(ids["pending_cancel"], ProcessState.PENDING, now - timedelta(hours=4)),
        # An expired attempt the Supervisor has not recovered yet, with a cancel already recorded: attempt 2 of 2, and
        # no orchestration behind either attempt.
        _record(
            ids["processing_expired"],
            ProcessState.PROCESSING,
            now - timedelta(hours=1),
            attempt=2,
            failure_count=1,
            locked_by=f"{ids['processing_expired']}:2",
            complete_by=now - timedelta(minutes=30),
            cancel_requested_at=now - timedelta(minutes=40),
        ),
        # The app partner's: one waiting, one to cancel (its key shares the orderId of a legacy-key record).
        _partner(ids["partner_pending"], ProcessState.PENDING, now - timedelta(hours=6)),
        _partner(ids["pending_cancel"], ProcessState.PENDING, now - timedelta(hours=4)),
    ]
    async with open_stores({"CosmosDb__accountEndpoint": endpoint}) as stores:
        for rec in records:
            stored = OrderRecord.from_order(make_order(rec.order_id.rpartition(".")[2]), rec.created_at)
            stored = stored.model_copy(update={"id": rec.id, "order_id": rec.order_id, "app": rec.app})
            await stores.orders.create_if_absent(stored)
            _, created = await stores.state.create_if_absent(rec)
            assert created
        await stores.state.put_checkpoint(
            CHECKPOINT,
            {"position": format_utc(now - timedelta(minutes=5)), "lastRun": last_run(SupervisorRun(), now)},
            None,
        )


# The records `seed` writes, by name (besides the five Processed ones); partner_pending is `partner.<id>`, and
# pending_cancel is both a legacy key and `partner.<id>`.
SEEDED = (
    "error",
    "error_kept",
    "compensation_failed",
    "pending_oldest",
    "pending_cancel",
    "processing_expired",
    "partner_pending",
)


def order_ids(*extra: str) -> dict[str, Any]:
    """Fresh order ids for `seed`'s records, and for `extra` names the test uses itself."""
    ids: dict[str, Any] = {name: new_order_id(name.replace("_", "-")) for name in (*SEEDED, *extra)}
    ids["processed"] = [new_order_id(f"processed{k}") for k in range(5)]
    return ids


def seeded_devhost(work_dir: Path, ids: dict[str, Any], settings: dict[str, str] | None = None) -> LocalSystem:
    """The product app under devhost on a store seeded with `ids` (started; the caller stops it), with `settings`
    (default SETTINGS)."""
    config = SystemConfig(work_dir=work_dir, settings=dict(SETTINGS if settings is None else settings))
    asyncio.run(seed(config.store_endpoint, ids))
    system = LocalSystem(config)
    system.start_devhost()
    return system


def function_key(system: LocalSystem) -> str:
    """devhost's default function key (its keys.json)."""
    return str(json.loads((system.config.work_dir / "devhost" / "keys.json").read_text())["default"])
