"""The failure classifier every port shares: `is_transient` says whether retrying the same operation later may succeed.

Transient: a `Failure` that says so (the store's taxonomy), HTTP 408, 429 and 5xx (azure-core, Cosmos), network
failures and timeouts, a busy SQLite file, and azure-servicebus's retryable errors (`BUS_TRANSIENT`). Everything
else, a lost lock and a queue that does not exist (`is_missing_entity`) included, is permanent for the operation.

The store's taxonomy (NotFound, PreconditionFailed, Conflict, TransientStoreError): both store adapters raise these,
never SDK errors, for the outcomes callers branch on. All are picklable.
"""

from __future__ import annotations

import sqlite3

from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from azure.servicebus.exceptions import (
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
)

TRANSIENT_STATUS_CODES = frozenset({408, 429})

# The azure-servicebus errors its own classes construct with `retryable=True` (azure/servicebus/exceptions.py), the
# ones its retry policy retries before they reach the caller. Authentication and authorization count: a role
# assignment takes minutes to propagate after a deployment, and retrying lets it. Left out: the lock errors
# (SessionCannotBeLockedError is retryable for a receiver that accepts another session; it is never "the same
# operation again"), and MessageLockLostError, SessionLockLostError, MessageSizeExceededError, quota and not-found
# errors, which the SDK itself does not retry. An authentication error that is a queue's 404 is not-found too
# (`is_missing_entity`): the SDK retries it, but a queue the deployment lacks does not appear by waiting.
BUS_TRANSIENT: tuple[type[Exception], ...] = (
    ServiceBusConnectionError,
    ServiceBusCommunicationError,
    OperationTimeoutError,
    ServiceBusServerBusyError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    MessagingEntityDisabledError,
)
BUS_LOCK_ERRORS: tuple[type[Exception], ...] = (SessionCannotBeLockedError,)


class Failure(Exception):
    """Base of the errors orderflow raises for outcomes callers branch on; `transient` says retry later."""

    transient: bool = False


def is_transient_status(status: int | None) -> bool:
    return status is not None and (status in TRANSIENT_STATUS_CODES or 500 <= status <= 599)


def is_missing_entity(exc: BaseException) -> bool:
    """The queue does not exist. Over AMQP (the SDK's pyamqp transport, on Service Bus and the local endpoint) the
    link's put-token is answered 404, raised as ServiceBusAuthenticationError (retryable, the SDK retries it first)
    whose inner TokenAuthFailure carries the status (azure/servicebus/_pyamqp/cbs.py `handle_token`;
    azure-sdk-for-python tests/test_sessions.py test_session_connection_failure_is_idempotent); a link detached
    with amqp:not-found is MessagingEntityNotFoundError (_pyamqp_transport.py
    `_handle_amqp_exception_with_condition`)."""
    if isinstance(exc, MessagingEntityNotFoundError):
        return True
    inner = getattr(exc, "inner_exception", None)
    return isinstance(exc, ServiceBusAuthenticationError) and getattr(inner, "status_code", None) == 404


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same operation later may succeed."""
    if isinstance(exc, Failure):
        return exc.transient
    if is_missing_entity(exc):
        return False
    if isinstance(exc, BUS_TRANSIENT):
        return True
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, HttpResponseError):
        return is_transient_status(exc.status_code)
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    return False


class StoreError(Failure):
    """Base of every store error; `status_code` is the HTTP status it stands for (Cosmos semantics)."""

    status_code: int | None = None
    transient: bool = False


class NotFound(StoreError):
    status_code = 404


class Conflict(StoreError):
    """A create hit an existing id (HTTP 409)."""

    status_code = 409


class PreconditionFailed(StoreError):
    """An If-Match write lost the race: the record changed since it was read (HTTP 412)."""

    status_code = 412


class TransientStoreError(StoreError):
    """A failure worth retrying later: throttled, timed out, unavailable, locked."""

    transient = True

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message, status_code)
        self.status_code = status_code

    def __str__(self) -> str:
        return f"{self.args[0]} (status {self.status_code})"
