"""Store error taxonomy: NotFound, PreconditionFailed, Conflict, transient, and the classifier.

Both adapters raise these, never SDK errors, for the outcomes callers branch on. `is_transient` maps any
exception to retry / do-not-retry (408, 429, 5xx and network failures are transient). All are picklable.
"""

from __future__ import annotations

import sqlite3

from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

TRANSIENT_STATUS_CODES = frozenset({408, 429})


class StoreError(Exception):
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


def is_transient_status(status: int | None) -> bool:
    return status is not None and (status in TRANSIENT_STATUS_CODES or 500 <= status <= 599)


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same operation later may succeed."""
    if isinstance(exc, StoreError):
        return exc.transient
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, HttpResponseError):
        return is_transient_status(exc.status_code)
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    return False
