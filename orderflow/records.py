"""Stored records: the immutable `OrderRecord` (orders DB) and the `OrderStateRecord` (state store).

JSON field names are camelCase. Datetimes are stored as fixed-format ISO 8601 UTC strings
(`YYYY-MM-DDTHH:MM:SS.ffffffZ`) so that string order equals time order: Cosmos range queries and ORDER BY on
`completeBy`/`retryAt` and the embedded store's indexes compare them as strings.
Unknown fields are kept (`extra="allow"`) so a record written by a newer app version survives a
read-modify-write by an older one during a rolling deployment.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, field_validator

from orderflow.clock import ensure_utc
from orderflow.messages import MAX_ATTEMPT, STEPS, CompensationName, StepName, SubmitOrder
from orderflow.text import bounded

RECORD_SCHEMA_VERSION = 1  # the immutable OrderRecord
# The state record: 2 added the compensation log, the cancel and the workflow version. A version-1 record reads as
# version 2 (every added field has its default) and is written back as 2; a newer version than this code knows is
# kept as it is (its unknown fields survive, `extra="allow"`).
STATE_RECORD_SCHEMA_VERSION = 2


# Bounds of what a record keeps (issue 26): an error or cause (the remote service's text among them) is cut to
# ERROR_TEXT_MAX characters with its length said; `previousErrors` keeps the newest MAX_PREVIOUS_ERRORS and the
# resubmission audit the newest MAX_RESUBMISSIONS, each counting what it dropped.
ERROR_TEXT_MAX = 1024
T = TypeVar("T")
MAX_PREVIOUS_ERRORS = 10
MAX_RESUBMISSIONS = 20
# Cosmos DB's per-item `ttl` that never expires the item, whatever the container's default
# (https://learn.microsoft.com/azure/cosmos-db/nosql/time-to-live): what `orderflow keep` sets.
TTL_NEVER = -1


def error_text(text: str) -> str:
    """An error, cause or reason as a record keeps it: at most ERROR_TEXT_MAX characters (text.bounded)."""
    return bounded(text, ERROR_TEXT_MAX)


def newest(items: tuple[T, ...], bound: int) -> tuple[tuple[T, ...], int]:
    """The newest `bound` of `items` (oldest first) and how many older ones were dropped."""
    dropped = max(0, len(items) - bound)
    return items[dropped:], dropped


def format_utc(value: datetime) -> str:
    """The one stored datetime format: UTC, microseconds, 'Z' (27 characters, sorts lexicographically)."""
    return ensure_utc(value).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_utc(value: str) -> datetime:
    return ensure_utc(datetime.fromisoformat(value))


UtcDatetime = Annotated[
    datetime,
    AfterValidator(ensure_utc),
    PlainSerializer(format_utc, return_type=str, when_used="json"),
]


class IllegalTransition(Exception):
    """The record's state does not allow this move (permanent for this record version). Raised by the state machine
    (orderflow/state_machine.py, which exports it) and by a record asked for a step or compensation it does not have."""


class ProcessState(StrEnum):
    """The pattern's ProcessState. Transitions live in `orderflow.state_machine.TRANSITIONS`."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    ERROR = "Error"
    # Compensation (seed 001, "compensation outcomes"): the Scheduler undoes the effects of the steps it sent, in
    # reverse order, through the same Agent path. Like Processing, the record is claimed (LockedBy, CompleteBy per
    # compensation) and supervised; unlocked with a retryAt it waits for the Starter.
    COMPENSATING = "CompensationInProgress"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"
    CANCELLED = "Cancelled"  # cancelled before any step was sent: nothing to undo


# States the Starter claims from (unlocked, retryAt due), the Supervisor scans (CompleteBy expired), and that end an
# order. Store queries filter on these.
CLAIMABLE_STATES = (ProcessState.PENDING, ProcessState.COMPENSATING)
SUPERVISED_STATES = (ProcessState.PROCESSING, ProcessState.COMPENSATING)
TERMINAL_STATES = (
    ProcessState.PROCESSED,
    ProcessState.ERROR,
    ProcessState.COMPENSATED,
    ProcessState.COMPENSATION_FAILED,
    ProcessState.CANCELLED,
)


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def to_doc(self) -> dict[str, Any]:
        """The stored JSON document (camelCase, datetimes in the sortable string format)."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Any:
        """Parse a stored document, dropping store system properties (`_rid`, `_etag`, `_ts`, ...)."""
        return cls.model_validate({k: v for k, v in doc.items() if not k.startswith("_")})


class OrderRecord(_Record):
    """The immutable order in the orders DB (id = the order key, orderflow/apps.py: `<app>.<orderId>`, or the bare
    orderId for the legacy app; `order` is the app's message as sent, with its own orderId)."""

    id: str
    order_id: str = Field(alias="orderId")  # the order key (the partition key)
    # The submitting app (orderflow/apps.py). None: written before per-app queues, the legacy app's.
    app: str | None = None
    order: dict[str, Any]
    order_hash: str = Field(alias="orderHash")
    schema_version: int = Field(default=RECORD_SCHEMA_VERSION, alias="schemaVersion")
    created_at: UtcDatetime = Field(alias="createdAt")

    @classmethod
    def from_order(
        cls, order: SubmitOrder, now: datetime, key: str | None = None, app: str | None = None
    ) -> OrderRecord:
        """The stored order under `key` (default: the bare orderId) of `app`."""
        return cls(
            id=key or order.order_id,
            order_id=key or order.order_id,
            app=app,
            order=order.to_dict(),
            order_hash=order.immutable_hash(),
            created_at=now,
        )

    def submit_order(self) -> SubmitOrder:
        return SubmitOrder.model_validate(self.order)


class StepRecord(_Record):
    name: StepName
    status: StepStatus = StepStatus.PENDING
    attempt: int = Field(default=0, ge=0)
    started_at: UtcDatetime | None = Field(default=None, alias="startedAt")
    completed_at: UtcDatetime | None = Field(default=None, alias="completedAt")


class CompensationRecord(_Record):
    """One entry of the ordered compensation log: the compensation of one step that was sent. `undone` is the remote
    service's answer: True when it undid an applied effect, False when the effect had never been applied (a no-op)."""

    name: CompensationName
    step: StepName
    status: StepStatus = StepStatus.PENDING
    attempt: int = Field(default=0, ge=0)
    undone: bool | None = None
    started_at: UtcDatetime | None = Field(default=None, alias="startedAt")
    completed_at: UtcDatetime | None = Field(default=None, alias="completedAt")


class Resubmission(_Record):
    """An operator's resubmit of a failed order (`orderflow resubmit`, POST /api/orders/{id}/resubmit): the audit
    entry kept on the record. `from_state` is the state it left (Error or CompensationFailed); `failure_count` the
    budget it had spent, reset to 0 by the resubmit."""

    at: UtcDatetime
    by: str = Field(min_length=1, max_length=256)
    reason: str = Field(min_length=1, max_length=256)
    from_state: ProcessState = Field(alias="fromState")
    failure_count: int = Field(ge=0, alias="failureCount")


class Kept(_Record):
    """An operator's hold on a finished order's retention (`orderflow keep`): who, when, why."""

    at: UtcDatetime
    by: str = Field(min_length=1, max_length=256)
    reason: str = Field(min_length=1, max_length=256)


class OrderStateRecord(_Record):
    """The state store record of one order (id = the order key, partition key /orderId: orderflow/apps.py)."""

    id: str
    # The order key: `<app>.<orderId>`, or the bare orderId for the legacy app (orderflow/apps.py). Every instance
    # id, LockedBy, Agent session and idempotency key derives from it; a status to the app carries the app's own
    # orderId (apps.client_order_id).
    order_id: str = Field(alias="orderId")
    # The submitting app. None: written before per-app queues, the legacy app's (apps.SubmittingApps.owner).
    app: str | None = None
    process_state: ProcessState = Field(default=ProcessState.PENDING, alias="processState")
    locked_by: str | None = Field(default=None, alias="lockedBy")
    complete_by: UtcDatetime | None = Field(default=None, alias="completeBy")
    failure_count: int = Field(default=0, ge=0, alias="failureCount")
    attempt: int = Field(default=0, ge=0, le=MAX_ATTEMPT)
    reply_to: str = Field(alias="replyTo")
    steps: tuple[StepRecord, ...] = ()
    # The current error: of the attempt in progress, or the one that ended the order in Error. An error that a later
    # one replaces, or that a successful attempt leaves behind (complete clears lastError), moves to
    # `previous_errors` (oldest first): a Processed record never shows an old error as if it were current. A record
    # without `previousErrors` (written before the field existed) reads as ().
    last_error: str | None = Field(default=None, alias="lastError")
    previous_errors: tuple[str, ...] = Field(default=(), alias="previousErrors")
    previous_errors_dropped: int = Field(default=0, ge=0, alias="previousErrorsDropped")  # the oldest, past the bound
    retry_at: UtcDatetime | None = Field(default=None, alias="retryAt")
    # Attempts handed back without a FailureCount (state_machine.defer: the breaker was open, or admission).
    deferrals: int = Field(default=0, ge=0)
    # Claims whose orchestration never started (a crash between the claim and start_new), started again by the
    # Supervisor in the same attempt without a FailureCount (state_machine.restart).
    restarts: int = Field(default=0, ge=0)
    # Compensation: why it started (the failure, FailureThresholdReached, or the cancel), its ordered log (reverse
    # order of the steps), and the compensation attempts the Supervisor found expired (its own failure budget).
    # Names and statuses only: no order or payment data.
    compensation_cause: str | None = Field(default=None, alias="compensationCause")
    compensations: tuple[CompensationRecord, ...] = ()
    compensation_failures: int = Field(default=0, ge=0, alias="compensationFailures")
    # A client's CancelOrder, recorded while an attempt runs: every later decision point honours it.
    cancel_requested_at: UtcDatetime | None = Field(default=None, alias="cancelRequestedAt")
    cancel_reason: str | None = Field(default=None, alias="cancelReason", max_length=256)
    # The Scheduler's workflow version this order's attempts run under (context.version, else the input's).
    workflow_version: str | None = Field(default=None, alias="workflowVersion")
    order_hash: str = Field(alias="orderHash")
    schema_version: int = Field(default=STATE_RECORD_SCHEMA_VERSION, alias="schemaVersion", ge=1)
    created_at: UtcDatetime = Field(alias="createdAt")
    updated_at: UtcDatetime = Field(alias="updatedAt")
    # When the terminal status (and, for Error, the operator alert) went out. Null on a terminal record means the
    # notification is still owed: the Supervisor's sweep sends it (orderflow/notifications.py).
    notified_at: UtcDatetime | None = Field(default=None, alias="notifiedAt")
    # Operators' resubmits, oldest first (the audit trail: who, when, why).
    resubmissions: tuple[Resubmission, ...] = ()
    resubmissions_dropped: int = Field(default=0, ge=0, alias="resubmissionsDropped")  # the oldest, past the bound
    # Retention: the Cosmos DB per-item TTL in seconds, set when the finished order's status went out
    # (orderflow/retention.py); None while unfinished (no `ttl` in the document: the container's default, -1, never
    # expires it); TTL_NEVER once an operator kept the order (`kept`).
    ttl: int | None = Field(default=None)
    kept: Kept | None = None
    # The W3C trace context of the order's trace (the submission's span), so that every later hop (Starter,
    # Scheduler, activities, Agent, replies, terminal status) joins the same trace. None: not traced.
    traceparent: str | None = Field(default=None, max_length=55)

    def to_doc(self) -> dict[str, Any]:
        """The stored document; no `ttl` property while the record has none (Cosmos DB takes a number or nothing)."""
        doc = super().to_doc()
        if doc.get("ttl") is None:
            doc.pop("ttl", None)
        return doc

    @field_validator("schema_version")
    @classmethod
    def _upgrade(cls, v: int) -> int:
        """The previous version reads as the current one (nothing to convert: it lacks only defaulted fields)."""
        return max(v, STATE_RECORD_SCHEMA_VERSION)

    @classmethod
    def new(cls, order: SubmitOrder, now: datetime, key: str | None = None, app: str | None = None) -> OrderStateRecord:
        """The record the submission writes first, under `key` (default: the bare orderId) of `app`: Pending,
        LockedBy null, FailureCount 0, steps pending."""
        return cls(
            id=key or order.order_id,
            order_id=key or order.order_id,
            app=app,
            reply_to=order.reply_to,
            steps=tuple(StepRecord(name=s) for s in STEPS),
            order_hash=order.immutable_hash(),
            created_at=now,
            updated_at=now,
        )

    def sent_steps(self) -> tuple[StepName, ...]:
        """Steps whose request may have reached the remote service (running or succeeded in some attempt), in order.
        A step the remote refused permanently (failed) applied nothing."""
        return tuple(s.name for s in self.steps if s.status in (StepStatus.RUNNING, StepStatus.SUCCEEDED))

    def compensation(self, name: CompensationName) -> CompensationRecord:
        for c in self.compensations:
            if c.name == name:
                return c
        raise IllegalTransition(f"order {self.order_id} has no compensation {name!r}")

    def step(self, name: StepName) -> StepRecord:
        """The record's own step `name`; IllegalTransition for a step it does not have (a record created before the
        step was added keeps the steps it was created with)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise IllegalTransition(f"order {self.order_id} has no step {name!r}")


def instance_id(order_id: str, attempt: int) -> str:
    """The Scheduler instance id of one attempt: `<orderId>:<attempt>` (the LockedBy value)."""
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt must be 1..{MAX_ATTEMPT}, got {attempt}")
    return f"{order_id}:{attempt}"
