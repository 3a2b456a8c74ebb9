"""Message schema versions (README, Versioning): readers accept the previous version (1) and the current one (2);
writers write the lowest version that carries the content, so the previous deployment still reads what it can."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from orderflow.messages import (
    AgentReply,
    AgentRequest,
    AlertKind,
    CancelOrder,
    CompensationName,
    Effects,
    InvalidMessage,
    OperatorAlert,
    OrderStatus,
    StatusMessage,
    StepName,
    parse_message,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def request(step: StepName | CompensationName) -> AgentRequest:
    return AgentRequest(
        instance_id="o-1:1",
        order_id="o-1",
        attempt=1,
        step=step,
        idempotency_key=f"o-1:{step.value}",
        deadline=AT,
        reply_to="agent-replies",
    )


def test_writers_write_the_lowest_version_that_carries_the_content() -> None:
    assert request(StepName.CHARGE_PAYMENT).schema_version == 1  # a version-1 Agent still reads it
    assert request(CompensationName.REFUND_PAYMENT).schema_version == 2
    status = StatusMessage(order_id="o-1", state=OrderStatus.COMPLETED, attempt=1, timestamp=AT, reason="ok")
    assert status.schema_version == 1
    assert (
        StatusMessage(
            order_id="o-1",
            state=OrderStatus.COMPENSATED,
            attempt=1,
            timestamp=AT,
            reason="x",
            effects=Effects(applied=[StepName.RESERVE_INVENTORY]),
        ).schema_version
        == 2
    )
    assert CancelOrder(order_id="o-1", reply_to="app-status", requested_at=AT).schema_version == 2
    assert OperatorAlert(kind=AlertKind.ORDER_FAILED, reason="x", raised_at=AT).schema_version == 1
    assert OperatorAlert(kind=AlertKind.COMPENSATION_FAILED, reason="x", raised_at=AT).schema_version == 2


def test_readers_accept_the_previous_version_and_refuse_others_naming_the_field() -> None:
    body = request(StepName.CHARGE_PAYMENT).to_dict()
    assert parse_message(AgentRequest, "AgentRequest", json.dumps(body)).schema_version == 1
    assert parse_message(AgentRequest, "AgentRequest", json.dumps({**body, "schemaVersion": 2})).schema_version == 2
    for bad in (3, 0, "2", True, None):
        with pytest.raises(InvalidMessage) as refused:
            parse_message(AgentRequest, "AgentRequest", json.dumps({**body, "schemaVersion": bad}))
        assert refused.value.reason == "UnsupportedSchemaVersion"


def test_a_version_too_low_for_the_content_is_refused_with_the_field() -> None:
    body = {**request(CompensationName.RELEASE_INVENTORY).to_dict(), "schemaVersion": 1}
    with pytest.raises(InvalidMessage) as refused:
        parse_message(AgentRequest, "AgentRequest", json.dumps(body))
    assert refused.value.reason == "InvalidField:schemaVersion"


def test_a_reply_names_a_step_or_a_compensation_and_nothing_else() -> None:
    reply = {
        "type": "AgentReply",
        "instanceId": "o-1:1",
        "orderId": "o-1",
        "attempt": 1,
        "outcome": "succeeded",
        "completedAt": "2026-01-01T00:00:00Z",
    }
    assert (
        parse_message(
            AgentReply, "AgentReply", json.dumps({**reply, "schemaVersion": 2, "step": "refund-payment"})
        ).step
        is CompensationName.REFUND_PAYMENT
    )
    with pytest.raises(InvalidMessage) as refused:
        parse_message(AgentReply, "AgentReply", json.dumps({**reply, "schemaVersion": 2, "step": "fly"}))
    assert refused.value.reason == "InvalidField:step"
