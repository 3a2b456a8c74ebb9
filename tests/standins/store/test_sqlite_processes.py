"""The embedded store across processes: two OS processes claiming the same Pending records through one SQLite
file (WAL, BEGIN IMMEDIATE, If-Match) never both win an order."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord

REPO = Path(__file__).resolve().parents[3]
ORDERS = [f"o-{i:03d}" for i in range(200)]
PROCESS_TIMEOUT_SECONDS = 60

CLAIMER = """
import asyncio, json, sys
from datetime import datetime, timedelta, UTC
from orderflow.records import instance_id
from orderflow.state_machine import IllegalTransition, claim
from orderflow.embedded.store import open_sqlite_stores

async def main(path, ids):
    now = datetime(2024, 5, 1, tzinfo=UTC)
    _, state = open_sqlite_stores(path)
    print("ready", flush=True)
    sys.stdin.readline()  # barrier: the test releases both processes together
    won = []
    for order_id in ids:
        mutate = lambda r: claim(r, instance_id(r.order_id, r.attempt + 1), now + timedelta(minutes=1), now)
        try:
            await state.update_with_retry(order_id, mutate, attempts=50)
            won.append(order_id)
        except IllegalTransition:
            pass
    await state.aclose()
    print(json.dumps(won))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
"""


def order(order_id: str) -> SubmitOrder:
    return SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c", "name": "n"},
            "items": [{"sku": "s", "quantity": 1, "unitPrice": "1.00"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T00:00:00Z",
        }
    )


async def _seed(path: Path) -> None:
    orders, state = open_sqlite_stores(path)
    created = datetime(2024, 4, 30, tzinfo=UTC)
    for i, order_id in enumerate(ORDERS):
        await state.create_if_absent(OrderStateRecord.new(order(order_id), created + timedelta(seconds=i)))
    await state.aclose()


async def test_two_processes_claim_each_order_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await _seed(path)
    args = [sys.executable, "-c", CLAIMER, str(path)]
    procs = [
        subprocess.Popen(
            [*args, json.dumps(ids)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ids in (ORDERS, list(reversed(ORDERS)))
    ]  # opposite orders: they meet in the middle
    for p in procs:  # both imported and connected before either starts claiming
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    outputs = [p.communicate(input="go\n", timeout=PROCESS_TIMEOUT_SECONDS) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    won = [set(json.loads(out)) for out, _ in outputs]
    assert won[0] | won[1] == set(ORDERS)
    assert not won[0] & won[1]
    _, state = open_sqlite_stores(path)
    try:
        claimed = await asyncio.gather(*(state.get(i) for i in ORDERS))
        assert all(c is not None and c[0].attempt == 1 for c in claimed)
    finally:
        await state.aclose()
