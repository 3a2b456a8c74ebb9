"""AgentReply.from_event: the Scheduler accepts a reply event in either encoding the Durable stack may deliver.

Today the Python client's `raise_event` double-encodes (azure-functions-durable-python #295), so the orchestrator's
`wait_for_external_event` result is a JSON string; if the SDK is fixed it becomes a dict. Both must keep working.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orderflow.messages import AgentOutcome, AgentReply, StepName

REPLY = AgentReply.model_validate(
    {
        "instanceId": "order-1:1",
        "orderId": "order-1",
        "attempt": 1,
        "step": "charge-payment",
        "outcome": "succeeded",
        "completedAt": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).isoformat(),
    }
)


def test_a_json_string_event_is_a_reply() -> None:
    assert AgentReply.from_event(json.dumps(REPLY.to_dict())) == REPLY


def test_a_dict_event_is_a_reply() -> None:
    assert AgentReply.from_event(REPLY.to_dict()) == REPLY


def test_json_bytes_are_a_reply() -> None:
    assert AgentReply.from_event(json.dumps(REPLY.to_dict()).encode()) == REPLY


@pytest.mark.parametrize(
    "value", [None, 42, ["a"], "not json", json.dumps("double encoded twice"), json.dumps({"instanceId": "order-1:1"})]
)
def test_anything_else_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        AgentReply.from_event(value)


@given(
    step=st.sampled_from(list(StepName)),
    outcome=st.sampled_from(list(AgentOutcome)),
    attempt=st.integers(min_value=1, max_value=50),
    permanent=st.booleans(),
)
def test_both_encodings_decode_to_the_same_reply(
    step: StepName, outcome: AgentOutcome, attempt: int, permanent: bool
) -> None:
    reply = REPLY.model_copy(update={"step": step, "outcome": outcome, "attempt": attempt, "permanent": permanent})
    as_dict = reply.to_dict()
    assert AgentReply.from_event(as_dict) == AgentReply.from_event(json.dumps(as_dict)) == reply
