"""Validation of an incoming Agent request at the edge: bytes of a Service Bus message → `AgentRequest`.

A request that can never be processed raises `orderflow.messages.InvalidMessage` whose `reason` names the
offending field (`InvalidField:<field>`), which becomes the dead-letter reason. Beyond the schema we check
the routing contract: the session is the order, the idempotency key is `orderflow.messages.idempotency_key`
(so a retry can never carry a different key and duplicate a side effect), the deadline carries a time zone,
and the reply goes to the Agent's configured replies queue (the Agent does not send where a message says).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from orderflow.messages import SCHEMA_VERSION, AgentRequest, InvalidMessage, idempotency_key


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
    raw = _json_object(body)
    _expect(raw, "type", "AgentRequest", "UnknownType")
    _expect(raw, "schemaVersion", SCHEMA_VERSION, "UnsupportedSchemaVersion")
    request = _validate(raw)
    _check_contract(request, session_id, replies_queue)
    return request


def _json_object(body: bytes | str) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage("InvalidJson", f"body is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidMessage("InvalidJson", "body must be a JSON object")
    return raw


def _expect(raw: dict[str, Any], field: str, expected: object, reason: str) -> None:
    if raw.get(field) != expected:
        raise InvalidMessage(reason, f"field '{field}' must be {expected!r}, got {raw.get(field)!r}")


def _validate(raw: dict[str, Any]) -> AgentRequest:
    try:
        return AgentRequest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise InvalidMessage(f"InvalidField:{field}", f"field '{field}': {err['msg']}") from exc


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
