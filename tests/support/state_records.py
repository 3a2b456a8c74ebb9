"""A pending (or any reachable) order-state record for the state machine's tests: order "o-1", its first instance, a
fixed clock and lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord, ProcessState, instance_id
from orderflow.state_machine import claim, complete, fail

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=60)
ORDER = "o-1"
FIRST = instance_id(ORDER, 1)


def pending(**changes: object) -> OrderStateRecord:
    order = SubmitOrder.model_validate(
        {
            "orderId": ORDER,
            "replyTo": "app-status",
            "customer": {"id": "c", "name": "n"},
            "items": [{"sku": "s", "quantity": 1, "unitPrice": "1.00"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T12:00:00Z",
        }
    )
    return OrderStateRecord.new(order, NOW - timedelta(hours=1)).model_copy(update=changes)


def in_state(state: ProcessState) -> OrderStateRecord:
    """A reachable record in `state`, locked by FIRST where the pattern keeps a lock."""
    rec = pending()
    if state is ProcessState.PENDING:
        return rec
    rec = claim(rec, FIRST, NOW - LEASE, NOW - LEASE)  # its lease has expired by NOW
    if state is ProcessState.PROCESSING:
        return rec
    if state is ProcessState.PROCESSED:
        return complete(rec, FIRST, NOW - LEASE)
    return fail(rec, FIRST, "boom", NOW - LEASE)
