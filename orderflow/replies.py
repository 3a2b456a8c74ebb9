"""Agent replies the Scheduler cannot use, and how a `raise_event` ended.

`check_reply` validates a reply before any HTTP call: the AgentReply schema, the Durable instance-id rules on
`instanceId`, the rule that the instance is `<orderId>:<attempt>` of the reply, and that the message's SessionId is
the reply's order; a reply that fails is `UnusableReply` with a reason naming the field (no redelivery could make it
usable). `classify_raise_error` reads what `azure.durable_functions.DurableOrchestrationClient.raise_event` (1.x,
models/DurableOrchestrationClient.py) raised, from the plain `Exception` message it maps each status to: LATE (404,
410), TRANSIENT, or `UnusableReply` for a refusal for good. The client's messages: docs/modules-product.md."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import ValidationError

from orderflow.instance_ids import durable_instance_id_problem
from orderflow.messages import AgentReply
from orderflow.records import instance_id as scheduler_instance_id

LATE_REPLY = (
    re.compile(r"Instance with ID .* is gone: either completed or failed", re.DOTALL),  # 410
    re.compile(r"No instance with ID .* found\.", re.DOTALL),  # 404
)
REJECTED_400 = "Only application/json request content is supported"
UNRECOGNIZED_STATUS = re.compile(r"Webhook returned unrecognized status code (\d+)")
# 4xx answers that may pass on a retry; every other 4xx is the same on every redelivery.
TRANSIENT_4XX = frozenset({408, 429})


class UnusableReply(Exception):
    """A reply that can never be raised: complete it with an operator alert (`reason` names the field)."""

    def __init__(self, reason: str, description: str) -> None:
        super().__init__(f"{reason}: {description}")
        self.reason = reason
        self.description = description


class RaiseOutcome(StrEnum):
    RAISED = "raised"  # 202
    LATE = "late"  # 404 / 410: the attempt is over; log and complete
    TRANSIENT = "transient"  # may pass on a redelivery: re-raise


def check_reply(body: bytes | str, session_id: str | None) -> AgentReply:
    """The reply, when the Scheduler can use it; else UnusableReply naming the field. Makes no HTTP call."""
    try:
        reply = AgentReply.model_validate_json(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise UnusableReply(f"InvalidAgentReply:{field}", f"field '{field}': {err['msg']}") from exc
    problem = durable_instance_id_problem(reply.instance_id)
    if problem is not None:
        raise UnusableReply(
            "InvalidAgentReply:instanceId",
            f"field 'instanceId' {reply.instance_id!r} breaks the Durable instance-id rules: it {problem}",
        )
    expected = scheduler_instance_id(reply.order_id, reply.attempt)
    if reply.instance_id != expected:
        raise UnusableReply(
            "InvalidAgentReply:instanceId",
            f"field 'instanceId' must be '<orderId>:<attempt>' = {expected!r}, got {reply.instance_id!r}",
        )
    # SessionId = orderId today; an attempt-scoped session (`<orderId>:<attempt>`) is accepted as well.
    if session_id not in (reply.order_id, reply.instance_id):
        raise UnusableReply(
            "InvalidAgentReply:sessionId",
            f"field 'sessionId' must be the reply's orderId {reply.order_id!r}, got {session_id!r}",
        )
    return reply


def classify_raise_error(exc: BaseException) -> RaiseOutcome:
    """LATE or TRANSIENT for what `raise_event` raised; raises UnusableReply for an answer that can never succeed."""
    if type(exc) is not Exception:  # ClientError, TimeoutError, JSONDecodeError (status unknown), ...
        return RaiseOutcome.TRANSIENT
    message = str(exc)
    if any(p.fullmatch(message) for p in LATE_REPLY):
        return RaiseOutcome.LATE
    if message == REJECTED_400:
        raise UnusableReply("RaiseEventRejected:400", f"the Durable HTTP API refused the event for good: {message}")
    unrecognized = UNRECOGNIZED_STATUS.fullmatch(message)
    if unrecognized is not None:
        status = int(unrecognized.group(1))
        if 400 <= status < 500 and status not in TRANSIENT_4XX:
            raise UnusableReply(
                f"RaiseEventRejected:{status}", f"the Durable HTTP API refused the event for good: {message}"
            )
    return RaiseOutcome.TRANSIENT
