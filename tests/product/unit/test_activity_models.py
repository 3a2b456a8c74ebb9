"""The live Scheduler's activity models read and write exactly the JSON that in-flight instances' histories hold.

The dicts below are the shapes the Scheduler and its activities exchanged before the models existed (the code of
orchestrators/order_workflow.py and activities/state.py at commit 42986eb), key order included: a history stores each
activity input as the JSON text the SDK dumped, and each result as the JSON the activity returned. Each one must
parse and serialize back to itself, and the orchestrator must schedule the same text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from support.orchestration_driver import Driver
from support.product_app import user_function

from orderflow import function_names as fn
from orderflow.activity_models import (
    ActionResult,
    ActivityModel,
    AdvanceOrderInput,
    AdvanceOrderResult,
    DeferOrderInput,
    SchedulerStatus,
    WorkflowResult,
)
from orderflow.advance import StepResult
from orderflow.messages import CompensationName, StepName
from orderflow.workflow import WORKFLOW_VERSION

BASE = {"orderId": "o-1", "instanceId": "o-1:1", "attempt": 1, "workflowVersion": "3.0", "agentRetries": 4}
TRACED = {**BASE, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
COMPLETE_BY = "2026-01-01T00:00:30+00:00"
SUCCEEDED = {"step": "reserve-inventory", "status": "succeeded", "error": None}
FAILED = {
    "step": "charge-payment",
    "status": "failed",
    "error": "card declined",
    "cause": "charge-payment: Declined: card declined",
}
UNDONE = {"step": "release-inventory", "status": "succeeded", "error": None, "undone": True}
UNDO_FAILED = {
    "step": "refund-payment",
    "status": "failed",
    "error": "no",
    "cause": "refund-payment: X: no",
    "undone": None,
}

TODAYS_SHAPES: list[tuple[type[ActivityModel], dict[str, Any]]] = [
    (AdvanceOrderInput, {**BASE, "completeBy": COMPLETE_BY, "result": None, "cancel": False}),
    (AdvanceOrderInput, {**TRACED, "completeBy": COMPLETE_BY, "result": None, "cancel": False}),
    (
        AdvanceOrderInput,
        {**BASE, "completeBy": "2026-01-01T00:00:30.250000+00:00", "result": SUCCEEDED, "cancel": False},
    ),
    (AdvanceOrderInput, {**BASE, "completeBy": COMPLETE_BY, "result": FAILED, "cancel": False}),
    (AdvanceOrderInput, {**BASE, "completeBy": COMPLETE_BY, "result": UNDONE, "cancel": False}),
    (AdvanceOrderInput, {**BASE, "completeBy": COMPLETE_BY, "result": UNDO_FAILED, "cancel": False}),
    (AdvanceOrderInput, {**BASE, "completeBy": COMPLETE_BY, "result": None, "cancel": True}),
    (AdvanceOrderResult, {"send": "reserve-inventory"}),
    (AdvanceOrderResult, {"send": "cancel-shipment"}),
    *(
        (AdvanceOrderResult, {"done": state})
        for state in ("Processed", "Error", "Cancelled", "Compensated", "CompensationFailed")
    ),
    (
        DeferOrderInput,
        {
            "orderId": "o-1",
            "instanceId": "o-1:1",
            "step": "charge-payment",
            "retryAfterSeconds": 6.0,
            "retryAt": "2026-01-01T00:00:06+00:00",
            "reason": "charge-payment: CircuitOpen: open",
        },
    ),
    (
        DeferOrderInput,
        {
            "orderId": "o-1",
            "instanceId": "o-1:1",
            "step": "reserve-inventory",
            "retryAfterSeconds": 12.5,
            "reason": "reserve-inventory: CircuitOpen: open",
        },
    ),
    (WorkflowResult, {"outcome": "superseded"}),
    (WorkflowResult, {"outcome": "completed"}),
    (WorkflowResult, {"outcome": "timedOut", "step": "charge-payment"}),
    (WorkflowResult, {"outcome": "timedOut", "step": "charge-payment", "error": None}),
    (WorkflowResult, {"outcome": "deferred", "step": "refund-payment"}),
    (SchedulerStatus, {"step": "charge-payment", "attempt": 2}),
    (SchedulerStatus, {"compensation": "release-inventory", "attempt": 1}),
    (SchedulerStatus, {"step": None, "attempt": 1}),
]


@pytest.mark.parametrize(("model", "shape"), TODAYS_SHAPES, ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_todays_json_round_trips_through_the_model(model: type[ActivityModel], shape: dict[str, Any]) -> None:
    parsed = model.from_dict(json.loads(json.dumps(shape)))
    assert json.dumps(parsed.to_dict()) == json.dumps(shape)  # the same text, key order included
    assert parsed.schema_version == 1  # today's shape is version 1, written without the field


def test_a_payload_naming_schema_version_1_reads_as_today_and_an_unknown_version_is_refused() -> None:
    assert AdvanceOrderResult.from_dict({"schemaVersion": 1, "send": "reserve-inventory"}).to_dict() == {
        "schemaVersion": 1,
        "send": "reserve-inventory",
    }
    with pytest.raises(ValidationError):
        AdvanceOrderResult.from_dict({"schemaVersion": 2, "send": "reserve-inventory"})


@pytest.mark.parametrize("answer", [{}, {"send": "reserve-inventory", "done": "Processed"}, {"send": "nope"}])
def test_an_advance_answer_is_one_known_send_or_one_done(answer: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        AdvanceOrderResult.from_dict(answer)


def test_an_action_result_is_the_step_result_advance_records() -> None:
    assert ActionResult.from_dict(FAILED).step_result() == StepResult(
        StepName.CHARGE_PAYMENT, False, "card declined", "charge-payment: Declined: card declined"
    )
    assert ActionResult.from_dict(UNDONE).step_result() == StepResult(
        CompensationName.RELEASE_INVENTORY, True, undone=True
    )
    with pytest.raises(ValidationError):
        ActionResult.from_dict({**SUCCEEDED, "status": "running"})  # only an answer is recorded


def test_the_scheduler_schedules_advance_order_with_todays_json_text() -> None:
    """Through the real replay engine: the first decision's input is the text the previous code dumped."""
    driver = Driver(
        user_function(fn.ORDER_WORKFLOW),
        "o-1:1",
        {"orderId": "o-1", "attempt": 1, "stepTimeoutSeconds": 30, "workflowVersion": WORKFLOW_VERSION},
    )
    actions = driver.episode()
    call = next(a for a in actions if a.get("functionName") == fn.ADVANCE_ORDER)
    expected = {
        **BASE,
        "workflowVersion": WORKFLOW_VERSION,  # the label of the live version, the text otherwise the same
        "completeBy": json.loads(call["input"])["completeBy"],
        "result": None,
        "cancel": False,
    }
    assert call["input"] == json.dumps(expected)
