"""The operator HTTP API's OpenAPI 3.1 document (GET /api/openapi.json), and its routes.

The response schemas come from pydantic models that mirror, field for field, what `orderflow.operations` returns;
the state record, the resubmit audit entry and the stored order reuse the models they are written with. Response
models refuse unknown fields, so a field added to an answer without its schema fails tests/product/e2e/
test_ops_api_e2e.py, which validates every real response of every endpoint against this document. Auth: every route,
the document's own included, needs both a function key (header or `code`; docs/operations.md says why the document is
not anonymous) and a caller signed in with Entra ID who holds the app role OperatorAppRole (orderflow/ops_http.py).
Orders are addressed by their key (orderflow/apps.py): `<app>.<orderId>`, or the legacy app's bare orderId.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import models_json_schema

from orderflow.apps import APP_NAME_PATTERN
from orderflow.breaker import BreakerState
from orderflow.messages import SubmitOrder
from orderflow.operations import OLDER_THAN_MAX, OLDER_THAN_PATTERN, ORDER_KEY_PATTERN, PAGE_SIZE_MAX
from orderflow.ops_http import DEFAULT_PAGE_SIZE, DEFAULT_ROLE
from orderflow.records import OrderStateRecord, ProcessState, Resubmission

API_VERSION = "1.0.0"
ROUTE_ORDER = "orders/{id}"
ROUTE_ORDERS = "orders"
ROUTE_RESUBMIT = "orders/{id}/resubmit"
ROUTE_CANCEL = "orders/{id}/cancel"
ROUTE_SUMMARY = "ops/summary"
ROUTE_OPENAPI = "openapi.json"


def ecma(pattern: re.Pattern[str]) -> str:
    """A `\\A...\\Z` pattern in ECMA-262 terms (JSON Schema's regex dialect has no \\A or \\Z)."""
    return pattern.pattern.replace("\\A", "^").replace("\\Z", "$")


ORDER_KEY_REGEX = ecma(ORDER_KEY_PATTERN)
APP_NAME_REGEX = ecma(APP_NAME_PATTERN)
# OrchestrationRuntimeStatus names, as DurableOrchestrationStatus.to_json() writes them (azure-functions-durable
# models/OrchestrationRuntimeStatus.py).
# A ProcessState in any case, in a pattern both regex dialects read alike (ECMA-262 has no inline (?i)).
STATE_REGEX = "^(?:" + "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in s.value) for s in ProcessState) + ")$"
# The continuation a page answers with; opaque to clients (a keyset position, orderflow/ports.py KeysetCursor).
CONTINUATION_FORMAT = "orderflow-continuation"
RuntimeStatus = Literal[
    "Running", "Completed", "ContinuedAsNew", "Failed", "Canceled", "Terminated", "Pending", "Suspended"
]


class _Answer(BaseModel):
    """A response body: camelCase, closed (an unexpected field is a schema violation, not a silent extension)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class Error(_Answer):
    """A refusal (400 bad input, 401 no signed-in operator, 403 not an operator, 404 unknown order, 409 wrong state)
    or a failure (500, no details)."""

    error: Literal["BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "InternalError"]
    message: str


class _Identity(_Answer):
    """Which order: `orderId` is its key (how the API addresses it), `app` the submitting app (null: a legacy key
    with no legacy app configured), `clientOrderId` the orderId the app chose."""

    order_id: str
    app: str | None
    client_order_id: str


class OrchestrationStatus(BaseModel):
    """One Scheduler instance as the Durable HTTP API reports it (GET /runtime/webhooks/durabletask/instances/{id}
    ?showHistory=true&showHistoryOutput=false), through the Python client."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

    name: str | None
    instance_id: str
    runtime_status: RuntimeStatus
    created_time: datetime
    last_updated_time: datetime
    input: Any = None
    output: Any = None
    custom_status: Any = None
    history_events: list[dict[str, Any]] | None


class Attempt(_Answer):
    """One attempt of an order (instance `<orderId>:<attempt>`); `orchestrationError` says why there is no status."""

    attempt: int = Field(ge=1)
    instance_id: str
    orchestration: OrchestrationStatus | None
    orchestration_error: str | None = None


class OrderView(_Identity):
    """GET /orders/{id}: the state record, the stored order and every attempt's orchestration."""

    etag: str
    state: OrderStateRecord
    order: SubmitOrder | None
    attempts: list[Attempt]


class OrderRow(_Identity):
    process_state: ProcessState
    attempt: int = Field(ge=0)
    failure_count: int = Field(ge=0)
    locked_by: str | None
    complete_by: datetime | None
    updated_at: datetime
    age_seconds: float | None
    last_error: str | None


class OrdersPage(_Answer):
    """GET /orders: one page, oldest change first, of one app's orders when `app` is set; `continuation` is null on
    the last page."""

    state: ProcessState
    app: str | None
    items: list[OrderRow]
    continuation: str | None


class Resubmitted(_Identity):
    """POST /orders/{id}/resubmit: the state it is in now and the audit entry written (`by`: the signed-in principal,
    `<name> (<object id>)`)."""

    process_state: ProcessState
    resubmission: Resubmission


class CancelAccepted(_Identity):
    """POST /orders/{id}/cancel (202): the cancel applied to the state record (Pending → Cancelled, Processing →
    `cancelRequestedAt`) as the order's own app's cancel, its cancelReason naming the signed-in principal, or already
    recorded (`alreadyRequested`); `messageId` is null (nothing is sent). Its outcome arrives on the app's status
    queue."""

    process_state: ProcessState
    message_id: str | None
    cancel_requested_at: datetime | None
    already_requested: bool


class StateCounts(_Answer):
    """How many state records are in each ProcessState."""

    pending: int = Field(ge=0, alias="Pending")
    processing: int = Field(ge=0, alias="Processing")
    processed: int = Field(ge=0, alias="Processed")
    error: int = Field(ge=0, alias="Error")
    compensating: int = Field(ge=0, alias="CompensationInProgress")
    compensated: int = Field(ge=0, alias="Compensated")
    compensation_failed: int = Field(ge=0, alias="CompensationFailed")
    cancelled: int = Field(ge=0, alias="Cancelled")


class AppCounts(_Answer):
    """One submitting app's orders that are waiting or running."""

    pending: int = Field(ge=0, alias="Pending")
    processing: int = Field(ge=0, alias="Processing")


class OldestOrder(_Identity):
    """The order in a state unchanged the longest: since its last write (`updatedAt`)."""

    since: datetime
    age_seconds: float | None


class Alarm(_Answer):
    """One alarm (orderflow/alarms.py), as the alarm timer evaluates it: `value` (seconds for the two oldest, orders
    for backlog-growth, messages for dead-letters; null when unknown) against `threshold`; `runbook` names its row in
    the README's "Operating it" table; `queue` the dead-letter queue, `orderId` the oldest order, `detail` why a
    queue has no value."""

    name: Literal["oldest-pending", "oldest-processing", "backlog-growth", "dead-letters"]
    queue: str | None
    value: float | None
    threshold: float = Field(ge=0)
    firing: bool
    runbook: str
    order_id: str | None
    detail: str | None


class DeadLetterDepth(_Answer):
    """Messages in a queue's dead-letter sub-queue: on Azure the queue's runtime count (exact, never capped), else
    peeked; `capped`: counting stopped at the cap (there are at least this many)."""

    count: int = Field(ge=0)
    capped: bool


class DeadLetterUnreadable(_Answer):
    """The queue's dead-letter depth could not be read, or this identity may not read it (the others still are);
    `error` says why in one line."""

    error: str


class Breaker(_Answer):
    """One remote service's circuit breaker, as `orderflow breaker show` prints it."""

    service: str
    state: BreakerState
    effective_state: BreakerState
    failures_in_window: int = Field(ge=0)
    failure_threshold: int = Field(ge=0)
    window_seconds: float
    open_until: datetime | None
    probes_left: int = Field(ge=0)
    forced: bool
    cooldown_seconds: float
    changed_at: datetime | None
    reason: str | None
    enabled: bool


class SupervisorRun(BaseModel):
    """The Supervisor's last run, as its checkpoint keeps it (orderflow.supervisor.last_run)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

    at: datetime
    scanned: int = Field(ge=0)
    recovered: int = Field(ge=0)
    escalated: int = Field(ge=0)
    restarted: int = Field(ge=0)
    request_charge: float = Field(ge=0)
    queries: int = Field(ge=0)
    documents: int = Field(ge=0)
    point_reads: int = Field(ge=0)


class SupervisorCheckpoint(_Answer):
    position: datetime | None
    last_run: SupervisorRun | None
    last_run_age_seconds: float | None


class Summary(_Answer):
    """GET /ops/summary: the figures `orderflow summary` prints."""

    generated_at: datetime
    states: StateCounts
    apps: dict[str, AppCounts] = Field(description="Each submitting app's Pending and Processing orders")
    oldest_pending: OldestOrder | None
    oldest_processing: OldestOrder | None
    expired_supervised: int = Field(ge=0)
    dead_letters: dict[str, DeadLetterDepth | DeadLetterUnreadable]
    breakers: list[Breaker]
    supervisor: SupervisorCheckpoint | None
    alarms: list[Alarm] = Field(description="Every alarm, dead-letters once per queue")


class ResubmitRequest(_Answer):
    """Why (the audit entry). Who is the signed-in principal, never the body: a `by` field is refused (400)."""

    reason: str = Field(min_length=1, pattern=r"\S", description="Not blank")


class CancelRequest(_Answer):
    """Why (on the order's cancelReason, after the signed-in principal's name). The body may be left out; a `by` field
    is refused (400)."""

    reason: str | None = None


MODELS: tuple[type[BaseModel], ...] = (
    Error,
    OrderView,
    OrdersPage,
    Resubmitted,
    CancelAccepted,
    Summary,
    ResubmitRequest,
    CancelRequest,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel] | None, description: str) -> dict[str, Any]:
    if model is None:
        return {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "Bad input: an invalid order key, parameter or body",
        404: "No such order in the state store",
        409: "The order's state does not allow this",
        500: "The request failed (details in the function's log)",
    }
    out: dict[str, Any] = {str(s): _json(Error, text[s]) for s in statuses}
    out["401"] = _json(
        Error,
        "Not signed in. Without this body: the Functions host (no valid function key, x-functions-key header or code "
        "query parameter: no body) or App Service Authentication (no valid Entra ID token: its own answer) refused "
        "the request before the app saw it. With it: the app refused it (App Service Authentication is off, or no "
        "signed-in principal).",
    )
    out["403"] = _json(Error, f"The signed-in principal does not hold the app role {DEFAULT_ROLE} (OperatorAppRole)")
    return out


_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The order key: `<app>.<orderId>` (e.g. `partner.X1`), or the legacy app's bare orderId (`X1`)",
    "schema": {"type": "string", "pattern": ORDER_KEY_REGEX},
}


def _app_schema(apps: tuple[str, ...]) -> dict[str, Any]:
    """The `app` parameter: one of the deployment's apps when they are known, else any well-formed app name."""
    return {"type": "string", "enum": list(apps)} if apps else {"type": "string", "pattern": APP_NAME_REGEX}


def _paths(apps: tuple[str, ...]) -> dict[str, Any]:
    return {
        f"/{ROUTE_ORDER}": {
            "get": {
                "operationId": "getOrder",
                "summary": "One order: state record, stored order, each attempt's orchestration",
                "parameters": [_ID],
                "responses": {"200": _json(OrderView, "The order"), **_errors(400, 404, 500)},
            }
        },
        f"/{ROUTE_ORDERS}": {
            "get": {
                "operationId": "listOrders",
                "summary": "The orders in one state, a page at a time, oldest change first",
                # An empty optional parameter is as good as absent: the Functions host drops empty query values before
                # the worker sees them (azure-functions-host GrpcMessageConversionExtensions.ToRpcHttp).
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "required": True,
                        "description": "A ProcessState (any case)",
                        "schema": {"type": "string", "pattern": STATE_REGEX},
                    },
                    {
                        "name": "app",
                        "in": "query",
                        "allowEmptyValue": True,
                        "description": "Only this app's orders: one of the submitting apps (SubmittingApps), any other "
                        "name is a 400",
                        "schema": _app_schema(apps),
                    },
                    {
                        "name": "olderThan",
                        "in": "query",
                        "allowEmptyValue": True,
                        "description": (
                            f"Only those unchanged for this long: 90s, 15m, 2h, 3d (at most {OLDER_THAN_MAX})"
                        ),
                        "schema": {"type": "string", "pattern": OLDER_THAN_PATTERN},
                    },
                    {
                        "name": "pageSize",
                        "in": "query",
                        "allowEmptyValue": True,
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": PAGE_SIZE_MAX,
                            "default": DEFAULT_PAGE_SIZE,
                        },
                    },
                    {
                        "name": "continuation",
                        "in": "query",
                        "allowEmptyValue": True,
                        "description": (
                            "The previous page's continuation, unchanged (URL-encoded); any other value is a 400"
                        ),
                        "schema": {"type": "string", "format": CONTINUATION_FORMAT},
                    },
                ],
                "responses": {"200": _json(OrdersPage, "One page"), **_errors(400, 500)},
            }
        },
        f"/{ROUTE_RESUBMIT}": {
            "post": {
                "operationId": "resubmitOrder",
                "summary": "Error → Pending, CompensationFailed → CompensationInProgress, with a fresh failure budget; "
                "audited on the record",
                "parameters": [_ID],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(ResubmitRequest)}}},
                "responses": {"200": _json(Resubmitted, "Resubmitted"), **_errors(400, 404, 409, 500)},
            }
        },
        f"/{ROUTE_CANCEL}": {
            "post": {
                "operationId": "cancelOrder",
                "summary": "Cancel the order through the CancelOrder use case (a Pending or Processing order only)",
                "parameters": [_ID],
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref(CancelRequest)}}},
                "responses": {
                    "202": _json(CancelAccepted, "The cancel is on its way (or was already recorded)"),
                    **_errors(400, 404, 409, 500),
                },
            }
        },
        f"/{ROUTE_SUMMARY}": {
            "get": {
                "operationId": "getSummary",
                "summary": "Counts per state, oldest Pending and Processing, expired work, dead letters, "
                "breakers, the Supervisor's last run, the alarms",
                "responses": {"200": _json(Summary, "The figures"), **_errors(500)},
            }
        },
        f"/{ROUTE_OPENAPI}": {
            "get": {
                "operationId": "getOpenApi",
                "summary": "This document",
                "responses": {"200": _json(None, "The OpenAPI 3.1 document"), **_errors()},
            }
        },
    }


@functools.cache
def document(apps: tuple[str, ...] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once per process and `apps`; callers must not mutate it). `apps`: the
    deployment's submitting apps (SubmittingApps), the values the `app` parameter takes; () for any app name."""
    _, defs = models_json_schema(
        [(m, "serialization") for m in MODELS], by_alias=True, ref_template="#/components/schemas/{model}"
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "orderflow operator API",
            "version": API_VERSION,
            "description": "Find and repair stuck orders (Scheduler Agent Supervisor). The same operations as "
            "the `orderflow` CLI; docs/operations.md.",
        },
        "servers": [{"url": "/api"}],
        # Both at once: a function key (either way) and a signed-in operator.
        "security": [{"functionKey": [], "entraId": []}, {"functionKeyQuery": [], "entraId": []}],
        "paths": _paths(apps),
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {
                "functionKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-functions-key",
                    "description": "A function key or the host key (`az functionapp keys list`)",
                },
                "functionKeyQuery": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "code",
                    "description": "The same key as a query parameter",
                },
                "entraId": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "An Entra ID access token for the function app's app registration, checked by App "
                    f"Service Authentication; its principal must hold the app role {DEFAULT_ROLE} (app setting "
                    "OperatorAppRole). Locally, devhost's stand-in takes `local:<name>:<role>[,<role>...]` "
                    "(docs/devhost.md, Easy Auth).",
                },
            },
        },
    }
