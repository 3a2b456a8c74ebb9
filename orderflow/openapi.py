"""The operator HTTP API's OpenAPI 3.1 document (GET /api/openapi.json), and its routes.

The response schemas come from pydantic models that mirror, field for field, what `orderflow.operations` returns;
the state record, the resubmit audit entry and the stored order reuse the models they are written with
(`OrderStateRecord`, `Resubmission`, `SubmitOrder`). Response models refuse unknown fields, so a field added to an
answer without its schema fails tests/product/e2e/test_ops_api_e2e.py, which validates every real response of every
endpoint against this document.

Auth: every route, the document's own included, is auth level `function` (a function or host key in the
`x-functions-key` header or the `code` query parameter; docs/operations.md says why the document is not anonymous).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import models_json_schema

from orderflow.breaker import BreakerState
from orderflow.messages import ORDER_ID_PATTERN, SubmitOrder
from orderflow.operations import OLDER_THAN_MAX, OLDER_THAN_PATTERN, PAGE_SIZE_MAX
from orderflow.ops_http import DEFAULT_PAGE_SIZE
from orderflow.records import OrderStateRecord, ProcessState, Resubmission

API_VERSION = "1.0.0"
ROUTE_ORDER = "orders/{id}"
ROUTE_ORDERS = "orders"
ROUTE_RESUBMIT = "orders/{id}/resubmit"
ROUTE_CANCEL = "orders/{id}/cancel"
ROUTE_SUMMARY = "ops/summary"
ROUTE_OPENAPI = "openapi.json"
# ORDER_ID_PATTERN in ECMA-262 terms (JSON Schema's regex dialect has no \A or \Z).
ORDER_ID_REGEX = ORDER_ID_PATTERN.pattern.replace("\\A", "^").replace("\\Z", "$")
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
    """A refusal (400 bad input, 404 unknown order, 409 wrong state) or a failure (500, no details)."""

    error: Literal["BadRequest", "NotFound", "Conflict", "InternalError"]
    message: str


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


class OrderView(_Answer):
    """GET /orders/{id}: the state record, the stored order and every attempt's orchestration."""

    order_id: str
    etag: str
    state: OrderStateRecord
    order: SubmitOrder | None
    attempts: list[Attempt]


class OrderRow(_Answer):
    order_id: str
    process_state: ProcessState
    attempt: int = Field(ge=0)
    failure_count: int = Field(ge=0)
    locked_by: str | None
    complete_by: datetime | None
    updated_at: datetime
    age_seconds: float | None
    last_error: str | None


class OrdersPage(_Answer):
    """GET /orders: one page, oldest change first; `continuation` is null on the last page."""

    state: ProcessState
    items: list[OrderRow]
    continuation: str | None


class Resubmitted(_Answer):
    """POST /orders/{id}/resubmit: the state it is in now and the audit entry written."""

    order_id: str
    process_state: ProcessState
    resubmission: Resubmission


class CancelAccepted(_Answer):
    """POST /orders/{id}/cancel (202): the cancel applied to the state record (Pending → Cancelled, Processing →
    `cancelRequestedAt`), or already recorded (`alreadyRequested`); `messageId` is null (nothing is sent). Its outcome
    arrives on the order's reply queue."""

    order_id: str
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


class OldestPending(_Answer):
    order_id: str
    since: datetime
    age_seconds: float | None


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
    oldest_pending: OldestPending | None
    expired_supervised: int = Field(ge=0)
    dead_letters: dict[str, DeadLetterDepth | DeadLetterUnreadable]
    breakers: list[Breaker]
    supervisor: SupervisorCheckpoint | None


class ResubmitRequest(_Answer):
    """Who resubmits and why (the audit entry). Without `by`: the Easy Auth caller when App Service Authentication is
    on, else "api"."""

    reason: str = Field(min_length=1, pattern=r"\S", description="Not blank")
    by: str | None = None


class CancelRequest(_Answer):
    """Why (shown on the order); `by` as for a resubmit. The body may be left out."""

    reason: str | None = None
    by: str | None = None


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
        400: "Bad input: an invalid order id, parameter or body",
        404: "No such order in the state store",
        409: "The order's state does not allow this",
        500: "The request failed (details in the function's log)",
    }
    out: dict[str, Any] = {str(s): _json(Error, text[s]) for s in statuses}
    # The Functions host itself answers a missing or wrong key, with no body.
    out["401"] = {"description": "No valid function key (x-functions-key header or code query parameter)"}
    return out


_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The order id",
    "schema": {"type": "string", "pattern": ORDER_ID_REGEX},
}


def _paths() -> dict[str, Any]:
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
                "summary": "Counts per state, oldest Pending, expired work, dead letters, "
                "breakers, the Supervisor's last run",
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
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once per process; callers must not mutate it)."""
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
        "security": [{"functionKey": []}, {"functionKeyQuery": []}],
        "paths": _paths(),
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
            },
        },
    }
