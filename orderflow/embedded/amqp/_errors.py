"""The AMQP error conditions of Service Bus's dialect, the broker's exceptions mapped to them (with the status code
a `$management` response carries), and proton conditions the SDKs can read. Sources: docs/modules-product.md."""

from __future__ import annotations

import sqlite3
import uuid

from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from proton import Condition, symbol

NOT_FOUND = "amqp:not-found"
UNAUTHORIZED = "amqp:unauthorized-access"  # a missing claim (orderflow/embedded/rights): status 401
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
INTERNAL_ERROR = "amqp:internal-error"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
TIMEOUT = "com.microsoft:timeout"
SERVER_BUSY = "com.microsoft:server-busy"
ARGUMENT_ERROR = "com.microsoft:argument-error"
DEAD_LETTER = "com.microsoft:dead-letter"
_TRACKING_ID = symbol("com.microsoft:tracking-id")

# Broker exception → (condition, management status code); the first match wins (subclasses before ServiceBusError).
_MAPPING: tuple[tuple[type[BaseException], str, int], ...] = (
    (MessagingEntityNotFoundError, NOT_FOUND, 404),
    (MessageLockLostError, LOCK_LOST, 410),
    (SessionLockLostError, SESSION_LOCK_LOST, 410),
    (SessionCannotBeLockedError, SESSION_CANNOT_BE_LOCKED, 410),
    (MessageNotFoundError, MESSAGE_NOT_FOUND, 404),
    (ServiceBusError, NOT_ALLOWED, 400),
)


class AmqpError(Exception):
    """An error to answer with: an AMQP condition, a description and the `$management` status code."""

    def __init__(self, condition: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.status = status

    def to_condition(self) -> Condition:
        """A proton condition. Its info map is never empty: pyamqp's sender reads the rejected error's third
        field (azure/servicebus/_pyamqp/client.py `SendClient._on_send_complete`) and proton leaves out an
        empty one."""
        return Condition(self.condition, self.description, {_TRACKING_ID: str(uuid.uuid4())})


def classify(exc: BaseException) -> AmqpError:
    """The broker's (or SQLite's) exception as the condition Service Bus answers with."""
    if isinstance(exc, AmqpError):
        return exc
    if isinstance(exc, sqlite3.OperationalError):  # the broker file is locked longer than the busy timeout
        return AmqpError(SERVER_BUSY, f"The server is busy: {exc}", 503)
    description = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    for kind, condition, status in _MAPPING:
        if isinstance(exc, kind):
            return AmqpError(condition, str(description), status)
    return AmqpError(INTERNAL_ERROR, str(description), 500)
