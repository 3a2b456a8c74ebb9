"""Validation of an incoming Agent request at the edge: bytes of a Service Bus message → `AgentRequest`.

A request that can never be processed raises `orderflow.messages.InvalidMessage` whose `reason` names the
offending field (`InvalidField:<field>`), which becomes the dead-letter reason. Beyond the schema we check
the routing contract: the session is the order, the idempotency key is `orderflow.messages.idempotency_key`
(so a retry can never carry a different key and duplicate a side effect), the deadline carries a time zone,
and the reply goes to the Agent's configured replies queue (the Agent does not send where a message says).
"""

from __future__ import annotations

from typing import Any

from orderflow.messages import AgentRequest, InvalidMessage, idempotency_key, parse_message


def message_body(message: Any) -> bytes:
    """The payload of a received message (azure-servicebus yields a data body as an iterable of bytes)."""
    body = message.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    try:
        return b"".join(bytes(part) for part in body)
    except TypeError as exc:
        raise InvalidMessage("InvalidBody", f"body is not a data body: {type(body).__name__}") from exc


def parse_agent_request(body: bytes | str, session_id: str | None, replies_queue: str) -> AgentRequest:
    """Validate one request; raise InvalidMessage with a reason naming the field."""
    request = parse_message(AgentRequest, "AgentRequest", body)
    _check_contract(request, session_id, replies_queue)
    return request


def _invalid(field: str, description: str) -> InvalidMessage:
    return InvalidMessage(f"InvalidField:{field}", f"field '{field}': {description}")


def _check_contract(request: AgentRequest, session_id: str | None, replies_queue: str) -> None:
    if request.deadline.tzinfo is None:
        raise _invalid("deadline", "must carry a time zone (ISO 8601 with offset)")
    if session_id is not None and session_id != request.order_id:
        raise _invalid("orderId", f"must equal the message's SessionId {session_id!r}")
    expected_key = idempotency_key(request.order_id, request.step.value)
    if request.idempotency_key != expected_key:
        raise _invalid("idempotencyKey", f"must be {expected_key!r}")
    if request.reply_to != replies_queue:
        raise _invalid("replyTo", f"must be the Agent replies queue {replies_queue!r}")
