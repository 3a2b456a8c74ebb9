"""Store error taxonomy: NotFound, PreconditionFailed, Conflict, transient.

Both adapters raise these, never SDK errors, for the outcomes callers branch on. All are picklable. The classifier,
`is_transient` (408, 429, 5xx, network and bus failures are transient), is orderflow.errors', re-exported here.
"""

from __future__ import annotations

from orderflow.errors import TRANSIENT_STATUS_CODES, Failure, is_transient, is_transient_status

__all__ = ["TRANSIENT_STATUS_CODES", "Conflict", "NotFound", "PreconditionFailed", "StoreError",
           "TransientStoreError", "is_transient", "is_transient_status"]


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
