"""orderflow.replies: which replies the Scheduler can use, and how a `raise_event` ended.

`classify_raise_error` reads the exceptions of azure.durable_functions 1.x `DurableOrchestrationClient.raise_event`
(models/DurableOrchestrationClient.py: a plain Exception per status; models/utils/http_utils.py: aiohttp errors for
connection failures, json.JSONDecodeError for a non-JSON body). These tests build the exceptions exactly as that
code words them; tests/product/integration/test_agent_replies.py has the real client raise them.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from orderflow.replies import RaiseOutcome, UnusableReply, check_reply, classify_raise_error


def body(**overrides: object) -> bytes:
    reply = {
        "schemaVersion": 1,
        "type": "AgentReply",
        "instanceId": "o-1:2",
        "orderId": "o-1",
        "attempt": 2,
        "step": "charge-payment",
        "outcome": "succeeded",
        "completedAt": "2026-01-01T00:00:00Z",
        **overrides,
    }
    return json.dumps(reply).encode()


def test_a_reply_for_its_own_instance_is_usable() -> None:
    assert check_reply(body(), "o-1").instance_id == "o-1:2"
    assert check_reply(body(), "o-1:2").instance_id == "o-1:2"  # an attempt-scoped session


@pytest.mark.parametrize(
    ("overrides", "session", "reason"),
    [
        ({"instanceId": "x/y:2", "orderId": "x/y"}, "x/y", "InvalidAgentReply:instanceId"),
        ({"instanceId": ""}, "o-1", "InvalidAgentReply:instanceId"),
        ({"instanceId": "o-1:1"}, "o-1", "InvalidAgentReply:instanceId"),  # attempt 2's reply naming attempt 1
        ({}, "o-2", "InvalidAgentReply:sessionId"),
        ({}, None, "InvalidAgentReply:sessionId"),
        ({"attempt": 0}, "o-1", "InvalidAgentReply:attempt"),
    ],
)
def test_an_unusable_reply_names_the_field(overrides: dict[str, object], session: str | None, reason: str) -> None:
    with pytest.raises(UnusableReply) as raised:
        check_reply(body(**overrides), session)
    assert raised.value.reason == reason


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (Exception("No instance with ID o-1:2 found."), RaiseOutcome.LATE),
        (Exception("Instance with ID o-1:2 is gone: either completed or failed"), RaiseOutcome.LATE),
        (Exception("Webhook returned unrecognized status code 500"), RaiseOutcome.TRANSIENT),
        (Exception("Webhook returned unrecognized status code 503"), RaiseOutcome.TRANSIENT),
        (Exception("Webhook returned unrecognized status code 429"), RaiseOutcome.TRANSIENT),
        (Exception("Webhook returned unrecognized status code 408"), RaiseOutcome.TRANSIENT),
        (aiohttp.ClientConnectionError("refused"), RaiseOutcome.TRANSIENT),
        (TimeoutError(), RaiseOutcome.TRANSIENT),
        (json.JSONDecodeError("Expecting value", "404: Not Found", 0), RaiseOutcome.TRANSIENT),
    ],
)
def test_late_and_transient_answers(exc: BaseException, outcome: RaiseOutcome) -> None:
    assert classify_raise_error(exc) is outcome


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (Exception("Only application/json request content is supported"), "RaiseEventRejected:400"),
        (Exception("Webhook returned unrecognized status code 403"), "RaiseEventRejected:403"),
        (Exception("Webhook returned unrecognized status code 405"), "RaiseEventRejected:405"),
    ],
)
def test_an_answer_that_can_never_succeed_is_unusable(exc: BaseException, reason: str) -> None:
    with pytest.raises(UnusableReply) as raised:
        classify_raise_error(exc)
    assert raised.value.reason == reason
