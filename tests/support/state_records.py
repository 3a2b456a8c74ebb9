"""A pending order-state record for the state machine's tests: order "o-1", its first instance, a fixed clock and
lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orderflow.messages import SubmitOrder
from orderflow.records import OrderStateRecord, instance_id

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
