"""Message schemas: every message that crosses a queue, as a typed pydantic model with `schemaVersion`.

Validate at the edge, once (`parse_*`), inside trust the types. JSON is the wire format (`to_json`).

Versions: `schemaVersion` 2 added compensation (an AgentRequest/AgentReply may name a compensation; a StatusMessage
may carry `effects` and the compensation statuses) and CancelOrder. Readers accept the previous version (1) and the
current one (2); writers write the lowest version that carries the content (`_Model.needs_version`), so a reader of
the previous deployment still reads every message it can understand during a rolling upgrade, and a version-2
message it cannot understand is refused with `UnsupportedSchemaVersion` instead of being misread.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from orderflow.text import QUOTE_MAX, bounded, printable, quote

SCHEMA_VERSION = 2  # the newest message schema
READ_SCHEMA_VERSIONS = (1, 2)  # the previous version is still read
SchemaVersion = Literal[1, 2]

# orderId rules. The Scheduler's instance id is `<orderId>:<attempt>`; seed 004 requires an instance id of
# 1-100 characters, not starting with '@', without '/', '\\', '#', '?' and without control characters.
# orderId: 1-64 characters from [A-Za-z0-9_-], starting with a letter or digit; attempt: 1-99999 (at most 5
# digits) → the instance id is at most 64 + 1 + 5 = 70 characters and can never break those rules.
ORDER_ID_MAX_LEN = 64
MAX_ATTEMPT = 99_999
ORDER_ID_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
# Queue names as Service Bus allows them (letters, digits, '.', '-', '_'; at most 260; we cap at 50).
QUEUE_NAME_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,49}\Z")


# W3C Trace Context, version 00 (what orderflow writes): `00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>`,
# neither id all zeros (W3C Trace Context, "traceparent Header Field Values").
TRACEPARENT_PATTERN = re.compile(r"\A00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")


def lenient_traceparent(value: object) -> str | None:
    """A well-formed traceparent, else None: trace context that cannot be used is ignored, never a reason to refuse
    a message (W3C Trace Context: a vendor that fails to parse traceparent restarts the trace)."""
    return value if isinstance(value, str) and TRACEPARENT_PATTERN.match(value) else None


# An optional `traceparent` field: validated leniently (see lenient_traceparent).
Traceparent = Annotated[str | None, BeforeValidator(lenient_traceparent)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    # Optional fields left out of the JSON while None, so that a message without them is byte for byte what it was
    # before they existed (what a reader of the previous deployment reads).
    OMIT_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()

    def needs_version(self) -> int:
        """The lowest schema version that carries this message's content (1 unless a subclass says more)."""
        return 1

    @model_validator(mode="after")
    def _version_fits(self) -> Any:
        """A message built without `schemaVersion` gets the lowest version its content needs; one that states a
        version too low for its content is refused (naming the field)."""
        needed = self.needs_version()
        stated = getattr(self, "schema_version", None)
        if stated is None:
            return self
        if "schema_version" not in self.model_fields_set:
            object.__setattr__(self, "schema_version", needed)
        elif stated < needed:
            raise ValueError(f"schemaVersion {stated} cannot carry this content; it needs {needed}")
        return self

    def _omitted(self) -> set[str] | None:
        omitted = {name for name in self.OMIT_WHEN_NONE if getattr(self, name) is None}
        return omitted or None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude=self._omitted())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude=self._omitted())


class Customer(_Model):
    id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=256)


class OrderItem(_Model):
    sku: str = Field(min_length=1, max_length=64)
    quantity: int = Field(gt=0, le=10_000, strict=True)
    unit_price: Decimal = Field(alias="unitPrice", ge=0, max_digits=12, decimal_places=2)


def valid_order_id(v: str) -> str:
    if not ORDER_ID_PATTERN.match(v):
        raise ValueError(
            f"orderId must be 1-{ORDER_ID_MAX_LEN} characters of A-Z a-z 0-9 _ - starting with a letter or digit"
        )
    return v


def valid_reply_to(v: str) -> str:
    if not QUEUE_NAME_PATTERN.match(v):
        raise ValueError("replyTo must be a queue name")
    return v


def aware(v: datetime, name: str) -> datetime:
    if v.tzinfo is None:
        raise ValueError(f"{name} must carry a time zone (ISO 8601 with offset)")
    return v


class _Routed(_Model):
    """An orders-inbound message of one order: its `order_id` and the app's `reply_to` (declared by each message, in
    its own field order), checked the same way."""

    @field_validator("order_id", check_fields=False)
    @classmethod
    def _order_id(cls, v: str) -> str:
        return valid_order_id(v)

    @field_validator("reply_to", check_fields=False)
    @classmethod
    def _reply_to(cls, v: str) -> str:
        return valid_reply_to(v)


class SubmitOrder(_Routed):
    """The client's order, on `orders-inbound` (SessionId = orderId, MessageId stable per order)."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["SubmitOrder"] = "SubmitOrder"
    order_id: str = Field(alias="orderId")
    reply_to: str = Field(alias="replyTo")
    customer: Customer
    items: list[OrderItem] = Field(min_length=1, max_length=100)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    submitted_at: datetime = Field(alias="submittedAt")

    @field_validator("submitted_at")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return aware(v, "submittedAt")

    def total(self) -> Decimal:
        return sum((i.unit_price * i.quantity for i in self.items), Decimal("0"))

    def immutable_hash(self) -> str:
        """Stable hash of the order's immutable data (everything but schemaVersion and submittedAt).

        A redelivered or resubmitted order with the same data has the same hash; any other content under the
        same orderId is a conflict.
        """
        data = self.to_dict()
        data.pop("schemaVersion", None)
        data.pop("submittedAt", None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


class InvalidMessage(Exception):
    """A message that can never be processed: dead-letter it with `reason` (names the field)."""

    def __init__(self, reason: str, description: str) -> None:
        reason, description = bounded(reason), bounded(description)  # within Service Bus's dead-letter limit
        super().__init__(f"{reason}: {description}")
        self.reason = reason
        self.description = description


M = TypeVar("M", bound=BaseModel)


def parse_message(model: type[M], kind: str, body: bytes | str) -> M:
    """Validate a message body of `type` == kind; raise InvalidMessage with a reason that names the field (sender
    text in it quoted and bounded: orderflow/text.py)."""
    raw = load_json(body)
    if not isinstance(raw, dict):
        raise InvalidMessage("InvalidJson", "body must be a JSON object")
    if raw.get("type") != kind:
        raise InvalidMessage("UnknownType", f"field 'type' must be {kind!r}, got {quote(raw.get('type'))}")
    version = raw.get("schemaVersion")
    if version not in READ_SCHEMA_VERSIONS or isinstance(version, bool):
        raise InvalidMessage(
            "UnsupportedSchemaVersion",
            f"field 'schemaVersion' must be one of {list(READ_SCHEMA_VERSIONS)}, got {quote(version)}",
        )
    try:
        return model.model_validate(raw)
    except (ValidationError, RecursionError) as exc:
        raise _invalid_field(exc) from exc


def load_json(body: bytes | str) -> Any:
    """The parsed body; InvalidMessage("InvalidJson") for anything json.loads refuses: not JSON, not UTF-8, an integer
    past Python's digit limit (ValueError), or nesting past the interpreter's recursion limit (RecursionError)."""
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise InvalidMessage("InvalidJson", "body is nested too deeply to parse") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMessage("InvalidJson", f"body is not JSON: {bounded(str(exc), QUOTE_MAX * 4)}") from exc


def _invalid_field(exc: ValidationError | RecursionError) -> InvalidMessage:
    """The first validation error as `InvalidField:<path>`; the path, a sender's key, cut to QUOTE_MAX characters."""
    if isinstance(exc, RecursionError):
        return InvalidMessage("InvalidField:body", "field 'body': nested too deeply to validate")
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or ("schemaVersion" if "schemaVersion" in err["msg"] else "body")
    if err["type"] == "extra_forbidden":
        return InvalidMessage(f"InvalidField:{printable(bounded(field, QUOTE_MAX))}", f"unknown field {quote(field)}")
    return InvalidMessage(
        f"InvalidField:{printable(bounded(field, QUOTE_MAX))}",
        f"field {quote(field)}: {bounded(err['msg'], QUOTE_MAX * 4)}",
    )


class CancelOrder(_Routed):
    """The client's cancel, on `orders-inbound` in the order's session (SessionId = orderId), so that it is processed
    strictly after the order's SubmitOrder (seed 002, Sequential Convoy). MessageId stable per cancel."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["CancelOrder"] = "CancelOrder"
    order_id: str = Field(alias="orderId")
    reply_to: str = Field(alias="replyTo")
    reason: str | None = Field(default=None, max_length=256)
    requested_at: datetime = Field(alias="requestedAt")

    @field_validator("requested_at")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return aware(v, "requestedAt")

    def needs_version(self) -> int:
        return 2  # new in version 2: a version-1 reader does not know it


INBOUND_TYPES = ("SubmitOrder", "CancelOrder")


def inbound_type(body: bytes | str) -> str:
    """The `type` of an orders-inbound message, for dispatch; InvalidMessage when it is neither kind."""
    raw = load_json(body)
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in INBOUND_TYPES:
        raise InvalidMessage("UnknownType", f"field 'type' must be one of {list(INBOUND_TYPES)}, got {quote(kind)}")
    return str(kind)


def parse_cancel_order(body: bytes | str) -> CancelOrder:
    """Validate a CancelOrder body; raise InvalidMessage with a reason that names the offending field."""
    return parse_message(CancelOrder, "CancelOrder", body)


def parse_submit_order(body: bytes | str) -> SubmitOrder:
    """Validate a SubmitOrder body; raise InvalidMessage with a reason that names the offending field."""
    return parse_message(SubmitOrder, "SubmitOrder", body)


class StepName(StrEnum):
    RESERVE_INVENTORY = "reserve-inventory"
    CHARGE_PAYMENT = "charge-payment"
    ARRANGE_SHIPPING = "arrange-shipping"


STEPS: tuple[StepName, ...] = (StepName.RESERVE_INVENTORY, StepName.CHARGE_PAYMENT, StepName.ARRANGE_SHIPPING)


class CompensationName(StrEnum):
    """The action that undoes a step's effect (seed 001, "compensation outcomes"). Sent like a step, through the
    same Agent request/reply path, with its own idempotency key per order (`<orderId>:<compensation>`). The remote
    service acknowledges the compensation of an effect it never applied as a no-op, and refuses the step itself
    after its compensation (so a late request can never apply what was already undone)."""

    RELEASE_INVENTORY = "release-inventory"
    REFUND_PAYMENT = "refund-payment"
    CANCEL_SHIPMENT = "cancel-shipment"


COMPENSATION_OF: dict[StepName, CompensationName] = {
    StepName.RESERVE_INVENTORY: CompensationName.RELEASE_INVENTORY,
    StepName.CHARGE_PAYMENT: CompensationName.REFUND_PAYMENT,
    StepName.ARRANGE_SHIPPING: CompensationName.CANCEL_SHIPMENT,
}
COMPENSATED_STEP: dict[CompensationName, StepName] = {c: s for s, c in COMPENSATION_OF.items()}
# What an Agent request names: a forward step or a compensation.
Action = StepName | CompensationName
ACTION_NAMES = tuple(a.value for a in (*StepName, *CompensationName))


def parse_action(value: object) -> Action:
    """A step or compensation name; ValueError (naming the allowed values) for anything else."""
    if isinstance(value, StepName | CompensationName):
        return value
    if isinstance(value, str):
        if value in StepName._value2member_map_:
            return StepName(value)
        if value in CompensationName._value2member_map_:
            return CompensationName(value)
    raise ValueError(f"must be one of {list(ACTION_NAMES)}, got {value!r}")


# A pydantic field of one step or compensation: one validator, so an error is located at the field itself.
ActionField = Annotated[
    Action,
    PlainValidator(parse_action, json_schema_input_type=Literal[*ACTION_NAMES]),
    PlainSerializer(lambda a: a.value, return_type=str),
]


def idempotency_key(order_id: str, step: str) -> str:
    """One key per order and step, the same on every retry and every attempt: the remote service applies it once."""
    return f"{order_id}:{step}"


def reply_event_name(step: str) -> str:
    """The stable external-event name the Scheduler waits on for a step's Agent reply."""
    return f"AgentReply:{step}"


class AgentRequest(_Model):
    """Scheduler → Agent, on `agent-requests` (SessionId = orderId, MessageId = `<instanceId>:<step>`)."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["AgentRequest"] = "AgentRequest"
    instance_id: str = Field(alias="instanceId")
    order_id: str = Field(alias="orderId")
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    step: ActionField
    idempotency_key: str = Field(alias="idempotencyKey")
    deadline: datetime  # = CompleteBy of this step: no new side effect after it
    # The retries the Scheduler allows for this request (seed 000/001, Scheduling: the request carries CompleteBy and
    # the allowed number of retries). None = the Agent's own limit (requests from before this field).
    max_retries: int | None = Field(default=None, alias="maxRetries", ge=0)
    reply_to: str = Field(alias="replyTo")
    payload: dict[str, Any] = Field(default_factory=dict)
    # The sending activity's span (orderflow/tracing.py); also in the message's application properties.
    traceparent: Traceparent = None

    OMIT_WHEN_NONE = frozenset({"traceparent"})

    def message_id(self) -> str:
        return f"{self.instance_id}:{self.step.value}"

    def needs_version(self) -> int:
        return 2 if isinstance(self.step, CompensationName) else 1


class AgentOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class AgentReply(_Model):
    """Agent → Scheduler, on `agent-replies` (SessionId = orderId, MessageId = `<instanceId>:<step>:reply`)."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["AgentReply"] = "AgentReply"
    instance_id: str = Field(alias="instanceId")
    order_id: str = Field(alias="orderId")
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)
    step: ActionField
    outcome: AgentOutcome
    permanent: bool = False
    error_code: str | None = Field(default=None, alias="errorCode")
    error: str | None = None
    result: dict[str, Any] = Field(default_factory=dict)
    completed_at: datetime = Field(alias="completedAt")
    # The Agent's span that handled the request (orderflow/tracing.py); also in the application properties.
    traceparent: Traceparent = None

    OMIT_WHEN_NONE = frozenset({"traceparent"})

    def message_id(self) -> str:
        return f"{self.instance_id}:{self.step.value}:reply"

    def needs_version(self) -> int:
        return 2 if isinstance(self.step, CompensationName) else 1

    @classmethod
    def from_event(cls, value: object) -> AgentReply:
        """The reply carried by a Durable external event, whichever encoding it arrived in.

        `DurableOrchestrationClient.raise_event` posts `json.dumps(data)` through aiohttp's `json=`, so the body is a
        JSON *string* and the extension stores that token as it is: the orchestrator's task result is a `str`
        (azure-functions-durable-python #295, open). Should the SDK fix that, the result becomes a `dict`. Both are
        accepted; anything else raises a `ValueError` (pydantic's ValidationError is one).
        """
        if isinstance(value, str | bytes):
            return cls.model_validate_json(value)
        if isinstance(value, dict):
            return cls.model_validate(value)
        raise ValueError(f"an Agent reply event must be a JSON object or a JSON string, got {type(value).__name__}")


class OrderStatus(StrEnum):
    RECEIVED = "received"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    # Not accepted, nothing changed: a submission past the backlog bound (`backlog full`, nothing was written), or a
    # cancel that comes too late (the order is already processed or failed; the record is unchanged).
    REJECTED = "rejected"
    COMPENSATED = "compensated"  # the effects of the steps sent were undone (after a failure or a cancel)
    COMPENSATION_FAILED = "compensation-failed"  # an effect could not be undone: an operator alert was raised
    CANCELLED = "cancelled"  # cancelled before any step was sent: nothing was done


COMPENSATION_STATUSES = frozenset({OrderStatus.COMPENSATED, OrderStatus.COMPENSATION_FAILED, OrderStatus.CANCELLED})
TERMINAL_STATUSES = frozenset(
    {
        OrderStatus.COMPLETED,
        OrderStatus.FAILED,
        OrderStatus.COMPENSATED,
        OrderStatus.COMPENSATION_FAILED,
        OrderStatus.CANCELLED,
    }
)


class Effects(_Model):
    """What the remote service did for an order: steps whose effect was applied (succeeded, or found applied by its
    compensation), and those whose effect was undone. Step names only."""

    applied: list[StepName] = Field(default_factory=list)
    undone: list[StepName] = Field(default_factory=list)


class StatusMessage(_Model):
    """System → submitting app, on the app's own reply queue (SessionId = orderId)."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["OrderStatus"] = "OrderStatus"
    order_id: str = Field(alias="orderId")
    state: OrderStatus
    attempt: int = Field(ge=0)
    timestamp: datetime
    reason: str
    # On a terminal status after anything was sent: which steps' effects were applied and which were undone.
    effects: Effects | None = None

    def message_id(self) -> str:
        return f"{self.order_id}:{self.state.value}:{self.attempt}"

    def needs_version(self) -> int:
        return 2 if self.effects is not None or self.state in COMPENSATION_STATUSES else 1


class AlertKind(StrEnum):
    POISON_MESSAGE = "PoisonMessage"
    ORDER_CONFLICT = "OrderConflict"
    ORDER_FAILED = "OrderFailed"
    FAILURE_THRESHOLD = "FailureThresholdReached"
    CIRCUIT_OPENED = "CircuitOpened"
    CIRCUIT_CLOSED = "CircuitClosed"
    COMPENSATION_FAILED = "CompensationFailed"


class OperatorAlert(_Model):
    """An event an operator must act on, on `operator-alerts` and in the log/telemetry."""

    schema_version: SchemaVersion = Field(default=1, alias="schemaVersion")
    type: Literal["OperatorAlert"] = "OperatorAlert"
    kind: AlertKind
    order_id: str | None = Field(default=None, alias="orderId")
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)
    raised_at: datetime = Field(alias="raisedAt")

    def needs_version(self) -> int:
        return 2 if self.kind is AlertKind.COMPENSATION_FAILED else 1

    def message_id(self) -> str:
        """`<kind>:<sha256 of what the alert is about>`: the same for a repeat of the same alert (a redelivered
        message, the Supervisor's sweep re-sending an owed alert), different for any other message or order.

        What it is about: the kind, the reason, the order and, from `details`, the source message (`queue`,
        `messageId`, `sessionId`, `sequenceNumber`, exact, whatever characters they hold) and the `attempt`. Free
        text (`description`, `error`) is left out, so a reworded description does not make a repeat look new. At most
        23 + 1 + 64 characters, inside Service Bus's 128.
        """
        about = [
            self.kind.value,
            self.reason,
            self.order_id,
            *(self.details.get(key) for key in ALERT_IDENTITY_DETAILS),
        ]
        canonical = json.dumps(about, separators=(",", ":"), default=str)
        return f"{self.kind.value}:{hashlib.sha256(canonical.encode()).hexdigest()}"


# The `details` keys that say which message or attempt an alert is about (OperatorAlert.message_id).
ALERT_IDENTITY_DETAILS = ("queue", "messageId", "sessionId", "sequenceNumber", "attempt", "service", "changedAt")
