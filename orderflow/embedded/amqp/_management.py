"""The `<entity>/$management` node: Service Bus's request-response operations on the broker (lock renewal,
session lock and state, peek, settlement by lock token, scheduling, deferred messages), with the bodies and
status codes the SDKs read. Sources (SDK functions, Microsoft's page) and differences: docs/modules-product.md."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from proton import Array, Data, Message, int32, symbol

from orderflow.embedded.broker import EmbeddedBroker, SessionLock

from ._codec import Address, decode_transfer, encode_stored, owned, to_timestamp
from ._delivering import DeliveryLink
from ._errors import (
    ARGUMENT_ERROR,
    LOCK_LOST,
    MESSAGE_SIZE_EXCEEDED,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    SESSION_LOCK_LOST,
    AmqpError,
    classify,
)

_VENDOR = "com.microsoft:"
# update-disposition's statuses (azure/servicebus/_common/constants.py MESSAGE_MGMT_SETTLEMENT_TERM_MAP)
_COMPLETED, _ABANDONED, _DEFERRED, _SUSPENDED = "completed", "abandoned", "defered", "suspended"
_RECEIVE_AND_DELETE = 0  # receiver-settle-mode of receive-by-sequence-number: ReceiverSettleMode.First


class Request:
    """One management request and what it may use: the broker, its entity, and the receiver links of the same
    connection (a session's operations need the link that holds the session lock)."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        address: Address,
        message: Message,
        links: Callable[[], Iterable[DeliveryLink]],
        authorize: Callable[[str], None] = lambda claim: None,
    ) -> None:
        """`authorize(claim)`: raises when the requester lacks that claim (Send, Listen) on the entity."""
        self.broker, self.address, self.message, self._links = broker, address, message, links
        self.authorize = authorize
        properties: dict[Any, Any] = dict(message.properties or {})
        self.operation = str(properties.get("operation") or "")
        self.associated = properties.get("associated-link-name")
        body = owned(message.body)
        self.body: dict[str, Any] = {str(k): v for k, v in body.items()} if isinstance(body, dict) else {}

    @property
    def queue(self) -> str:
        return self.address.queue

    def holder(self, session_id: Any) -> DeliveryLink:
        """The link of this connection holding `session_id` (the associated link first), else session lock lost."""
        if session_id is None:
            raise AmqpError(ARGUMENT_ERROR, "The request names no session-id.", 400)
        holding = [
            link
            for link in self._links()
            if link.session is not None and link.session.session_id == str(session_id) and not link.closed
            and link.address.queue == self.queue
        ]  # fmt: skip
        holding.sort(key=lambda link: link.name != self.associated)
        if not holding:
            raise AmqpError(SESSION_LOCK_LOST, f"The session lock of '{session_id}' is not held.", 410)
        return holding[0]

    def session(self) -> SessionLock | None:
        """The session lock named by the body's session-id (settlement and deferred messages of a session)."""
        session_id = self.body.get("session-id")
        if session_id is None:
            return None
        lock = self.holder(session_id).session
        assert lock is not None
        return lock


def respond(request: Request) -> Message:
    """Run the request; the response correlates with it (correlation-id = its message-id)."""
    handler = _OPERATIONS.get(request.operation)
    try:
        if handler is None:
            raise AmqpError(NOT_IMPLEMENTED, f"The operation '{request.operation}' is not supported locally.", 501)
        request.authorize("Send" if request.operation in _SEND_OPERATIONS else "Listen")
        status, body = handler(request)
    except Exception as exc:  # noqa: BLE001 - answered with its status and condition
        return refusal(request.message, classify(exc))
    return _response(request.message, status, body, "OK" if status == 200 else "No Content", None)


def refusal(message: Message, error: AmqpError) -> Message:
    """The response to a request that failed with `error`: its status, description and condition."""
    return _response(message, error.status, None, error.description, error.condition)


def _response(message: Message, status: int, body: Any, description: str, condition: str | None) -> Message:
    properties: dict[str, Any] = {"statusCode": int32(status), "statusDescription": description}
    if condition is not None:
        properties["errorCondition"] = symbol(condition)
    request_id = message.id if message.id is not None else message.correlation_id
    response = Message(body=body, correlation_id=request_id, properties=properties)
    if message.reply_to is not None:
        response.address = message.reply_to
    return response


def _items(value: Any) -> list[Any]:
    if isinstance(value, Array):
        return list(value.elements)
    if isinstance(value, (list, tuple)):
        return list(value)
    return [] if value is None else [value]


def _tokens(request: Request) -> list[str]:
    return [str(uuid.UUID(str(token))) for token in _items(request.body.get("lock-tokens"))]


def _locked(request: Request, token: str) -> int:
    seq = request.broker.locked_sequence(request.queue, token)
    if seq is None:
        raise AmqpError(LOCK_LOST, f"The lock {token} is lost or was never held.", 410)
    return seq


# -- operations: each returns (status, body) ------------------------------------------------------------------


def _renew_lock(request: Request) -> tuple[int, Any]:
    expirations = [
        to_timestamp(request.broker.renew_message_lock(request.queue, _locked(request, token), token))
        for token in _tokens(request)
    ]
    return 200, {"expirations": Array(Data.NULL, Data.TIMESTAMP, *expirations)}


def _renew_session_lock(request: Request) -> tuple[int, Any]:
    link = request.holder(request.body.get("session-id"))
    assert link.session is not None
    lock = request.broker.renew_session_lock(request.queue, link.session)
    link.renewed(lock)
    return 200, {"expiration": to_timestamp(lock.locked_until)}


def _get_session_state(request: Request) -> tuple[int, Any]:
    link = request.holder(request.body.get("session-id"))
    assert link.session is not None
    return 200, {"session-state": request.broker.get_session_state(request.queue, link.session)}


def _set_session_state(request: Request) -> tuple[int, Any]:
    link = request.holder(request.body.get("session-id"))
    assert link.session is not None
    state = request.body.get("session-state")
    data = None if state is None else bytes(state)
    request.broker.set_session_state(request.queue, link.session, data)
    return 200, {}


def _peek(request: Request) -> tuple[int, Any]:
    start = int(request.body.get("from-sequence-number") or 1)
    count = int(request.body.get("message-count") or 1)
    session_id = request.body.get("session-id")
    broker = request.broker
    stored = broker.peek(
        request.queue,
        start,
        count,
        sub_queue=request.address.sub_queue,
        session_id=None if session_id is None else str(session_id),
    )
    if not stored:
        return 204, None
    now = broker.clock()
    return 200, {"messages": [{"message": encode_stored(s, now=now)} for s in stored]}


def _update_disposition(request: Request) -> tuple[int, Any]:
    status = str(request.body.get("disposition-status"))
    broker, queue, session = request.broker, request.queue, request.session()
    modified = request.body.get("properties-to-modify")
    properties = {str(k): v for k, v in modified.items()} if isinstance(modified, dict) else None
    for token in _tokens(request):
        seq = _locked(request, token)
        if status == _COMPLETED:
            broker.complete(queue, seq, token, session=session)
        elif status == _ABANDONED:
            broker.abandon(queue, seq, token, session=session, properties=properties)
        elif status == _DEFERRED:
            broker.defer(queue, seq, token, session=session, properties=properties)
        elif status == _SUSPENDED:
            reason, description = request.body.get("deadletter-reason"), request.body.get("deadletter-description")
            broker.dead_letter(
                queue,
                seq,
                token,
                reason=None if reason is None else str(reason),
                error_description=None if description is None else str(description),
                session=session,
                properties=properties,
            )
        else:
            raise AmqpError(ARGUMENT_ERROR, f"Unknown disposition-status {status!r}.", 400)
    return 200, {}


def _schedule(request: Request) -> tuple[int, Any]:
    envelopes = []
    limit = request.broker.queue_properties(request.queue).max_message_size_bytes
    for item in _items(request.body.get("messages")):
        entry = {str(k): v for k, v in dict(item).items()}
        payload = bytes(entry.get("message") or b"")  # the whole encoded message, as a transfer would carry it
        if len(payload) > limit:
            raise AmqpError(MESSAGE_SIZE_EXCEEDED, f"The message of {len(payload)} bytes is over the limit.", 413)
        envelopes.extend(decode_transfer(payload))
    if request.address.sub_queue:
        raise AmqpError(NOT_ALLOWED, "Messages cannot be scheduled on a dead-letter queue.", 400)
    numbers = request.broker.send(request.queue, envelopes)
    # A duplicate that detection dropped has no sequence number; 0 stands for it (cancelling 0 cancels nothing).
    return 200, {"sequence-numbers": Array(Data.NULL, Data.LONG, *[n or 0 for n in numbers])}


def _cancel_scheduled(request: Request) -> tuple[int, Any]:
    request.broker.cancel_scheduled(request.queue, [int(n) for n in _items(request.body.get("sequence-numbers"))])
    return 200, {}


def _receive_by_sequence_number(request: Request) -> tuple[int, Any]:
    numbers = [int(n) for n in _items(request.body.get("sequence-numbers"))]
    broker, queue, session = request.broker, request.queue, request.session()
    stored = broker.receive_deferred(queue, numbers, session=session)
    delete = request.body.get("receiver-settle-mode") == _RECEIVE_AND_DELETE
    now = broker.clock()
    messages = []
    for s in stored:
        token = s.lock_token
        assert token is not None
        if delete:
            broker.complete(queue, s.sequence_number, token, session=session)
        until = session.locked_until if session is not None else s.locked_until_utc
        payload = encode_stored(s, now=now, lock_token=None if delete else token, locked_until=until)
        messages.append({"lock-token": uuid.UUID(token), "message": payload})
    return 200, {"messages": messages}


# The operations that need Send (scheduling is a send); every other one is a receiver's and needs Listen.
_SEND_OPERATIONS = frozenset({_VENDOR + "schedule-message", _VENDOR + "cancel-scheduled-message"})
_OPERATIONS: dict[str, Callable[[Request], tuple[int, Any]]] = {
    _VENDOR + "renew-lock": _renew_lock,
    _VENDOR + "renew-session-lock": _renew_session_lock,
    _VENDOR + "get-session-state": _get_session_state,
    _VENDOR + "set-session-state": _set_session_state,
    _VENDOR + "peek-message": _peek,
    _VENDOR + "update-disposition": _update_disposition,
    _VENDOR + "schedule-message": _schedule,
    _VENDOR + "cancel-scheduled-message": _cancel_scheduled,
    _VENDOR + "receive-by-sequence-number": _receive_by_sequence_number,
}
