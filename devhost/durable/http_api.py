"""The Durable extension's HTTP API on devhost, under /runtime/webhooks/durabletask/ (what `rpcBaseUrl` names).

Routes, status codes and bodies follow the extension's HttpApiHandler.cs and the "HTTP API reference" page:
start 202 (+Location) / 400 / 500 (an id still running); status 200 / 202 / 404; query 200 with
x-ms-continuation-token; raiseEvent 202 / 400 / 404 / 410; terminate 202 / 404 / 410; purge 200 / 404 / 412; any
path or method no route takes, 404 with no body (HandleRequestAsync's last `CreateResponse(HttpStatusCode.NotFound)`).
Entities, suspend/resume, rewind and restart answer 501 "not supported by devhost".

Fault switch (off by default): with DEVHOST_DURABLE_API_OUTAGE_FILE naming a file, the start and status routes answer
503 while it exists, doing nothing, and append a JSON line per refused request to `<file>.jsonl` (docs/modules-host.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from . import history as h
from .episode import TERMINAL
from .errors import (
    ENTITIES_NOT_SUPPORTED,
    InstanceAlreadyExists,
    InstanceGone,
    InstanceNotFound,
    InstanceNotTerminal,
    InvalidInstanceId,
    OrchestratorNotFound,
)

if TYPE_CHECKING:
    from .engine import DurableEngine

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RUNNING = frozenset({"Running", "Pending", "ContinuedAsNew", "Suspended"})
CONTINUATION = "x-ms-continuation-token"
OUTAGE_SETTING = "DEVHOST_DURABLE_API_OUTAGE_FILE"


def error(status: int, message: str) -> web.Response:
    """The extension's CreateErrorResponse body; the Python client reads ExceptionMessage on 400."""
    return web.json_response({"Message": message, "ExceptionMessage": message}, status=status)


def exception_error(status: int, message: str, exception_type: str, exc: BaseException) -> web.Response:
    """CreateErrorResponse(status, message, e) (HttpRequestMessageExtensions.cs): Message, ExceptionMessage,
    ExceptionType, StackTrace."""
    return web.json_response(
        {
            "Message": message,
            "ExceptionMessage": str(exc),
            "ExceptionType": exception_type,
            "StackTrace": "   at devhost.durable.http_api (devhost has no .NET stack)",
        },
        status=status,
    )


def already_exists(exc: InstanceAlreadyExists) -> web.Response:
    """start on an id whose instance is still Pending/Running/ContinuedAsNew/Suspended: 500, not 409.

    Conformance (Azure/azure-functions-durable-extension): HttpApiHandler.HandleStartOrchestratorRequestAsync catches
    only JsonReaderException; DurableClient.StartNewAsync lets OrchestrationAlreadyExistsException (an
    InvalidOperationException, not an ArgumentException) through, so HttpApiHandler.HandleRequestAsync's generic
    `catch (Exception e)` answers CreateErrorResponse(InternalServerError, "Something went wrong while processing your
    request", e) (HttpRequestMessageExtensions.CreateErrorResponse: Message, ExceptionMessage, ExceptionType,
    StackTrace). The Python client's start_new then raises Exception(<that body>).
    """
    return web.json_response(
        {
            "Message": "Something went wrong while processing your request",
            "ExceptionMessage": str(exc),
            "ExceptionType": "DurableTask.Core.Exceptions.OrchestrationAlreadyExistsException",
            "StackTrace": "   at devhost.durable.engine.DurableEngine.start_with_token (devhost has no .NET stack)",
        },
        status=500,
    )


def _flag(request: web.Request, name: str, default: bool) -> bool:
    value = request.query.get(name)
    return default if value is None else value.lower() == "true"


def _time(request: web.Request, name: str) -> datetime | None:
    value = request.query.get(name)
    return h.parse_time(value) if value else None


def _statuses(request: web.Request) -> list[str] | None:
    values = [v for raw in request.query.getall("runtimeStatus", []) for v in raw.split(",") if v]
    return values or None


class DurableHttpApi:
    """Request handlers bound to one engine."""

    def __init__(self, engine: DurableEngine) -> None:
        self.engine = engine

    async def start(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["functionName"]
        body = await request.text()
        try:
            if body:
                json.loads(body)
            # `?version=` is how DurableOrchestrationClient.start_new(version=...) sends the version (the SDK's
            # `_get_start_new_url`; extension PR #3213 reads it in HttpApiHandler); absent: host.json defaultVersion.
            instance_id = await self.engine.start_with_token(
                name, request.match_info.get("instanceId"), body or None, version=request.query.get("version")
            )
        except ValueError as exc:
            if isinstance(exc, (InvalidInstanceId, OrchestratorNotFound)):
                return error(400, str(exc))
            return error(400, "Invalid JSON content")
        except InstanceAlreadyExists as exc:
            return already_exists(exc)
        payload = self.engine.management_payload(instance_id)
        return web.json_response(
            payload, status=202, headers={"Location": payload["statusQueryGetUri"], "Retry-After": "10"}
        )

    async def status(self, request: web.Request) -> web.StreamResponse:
        status = await self.engine.get_status(
            request.match_info["instanceId"],
            show_history=_flag(request, "showHistory", False),
            show_history_output=_flag(request, "showHistoryOutput", False),
            show_input=_flag(request, "showInput", True),
        )
        if status is None:
            return web.Response(status=404)
        if status["runtimeStatus"] in RUNNING:
            return web.json_response(status, status=202, headers={"Location": str(request.url), "Retry-After": "5"})
        failed_500 = status["runtimeStatus"] == "Failed" and _flag(request, "returnInternalServerErrorOnFailure", False)
        return web.json_response(status, status=500 if failed_500 else 200)

    async def query(self, request: web.Request) -> web.StreamResponse:
        top = request.query.get("top")
        statuses, token = await self.engine.query(
            runtime_status=_statuses(request),
            created_from=_time(request, "createdTimeFrom"),
            created_to=_time(request, "createdTimeTo"),
            instance_id_prefix=request.query.get("instanceIdPrefix"),
            top=int(top) if top and top.isdigit() else None,
            continuation=request.headers.get(CONTINUATION),
            show_input=_flag(request, "showInput", False),
        )
        return web.json_response(statuses, headers={CONTINUATION: token or ""})

    async def raise_event(self, request: web.Request) -> web.StreamResponse:
        instance_id, event_name = request.match_info["instanceId"], request.match_info["eventName"]
        # The extension checks in this order: 404 (unknown), 410 (finished), then the content type
        # (HttpApiHandler.HandleRaiseEventRequestAsync).
        row = self.engine.store.instance(instance_id)
        if row is None:
            return web.Response(status=404)
        if row.status in TERMINAL:
            return web.Response(status=410)
        if request.content_type.lower() != "application/json":
            # CreateErrorResponse(BadRequest, message) without an exception: the body is {"Message": ...} only.
            return web.json_response({"Message": "Only application/json request content is supported"}, status=400)
        body = await request.text()
        try:
            json.loads(body or "null")
            await self.engine.raise_event_token(instance_id, event_name, body or None)
        except InstanceGone:
            return web.Response(status=410)
        except InstanceNotFound:
            return web.Response(status=404)
        except ValueError as exc:
            return exception_error(400, "Invalid JSON content", "Newtonsoft.Json.JsonReaderException", exc)
        return web.Response(status=202)

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        """Every path (or method) no route of the extension takes: 404 with no body, as HandleRequestAsync's last
        `return request.CreateResponse(HttpStatusCode.NotFound)` (no content). That covers an instance id with '/'
        (an extra path segment), '?' or '#' (the client's URL ends the path there, leaving POST /instances/<id>),
        '..' (the client's URL normalization leaves the instances/ segment) and an empty id (devhost answers 404:
        no instance has an empty id; see docs/devhost.md). aiohttp's own answer would be a text/plain "404: Not
        Found" or a 405, which the Python client fails to read as JSON (`response.json(content_type=None)`)."""
        return web.Response(status=404)

    async def terminate(self, request: web.Request) -> web.StreamResponse:
        try:
            await self.engine.terminate(request.match_info["instanceId"], request.query.get("reason"))
        except InstanceNotFound:
            return web.Response(status=404)
        except InstanceGone:
            return web.Response(status=410)
        return web.Response(status=202)

    async def purge(self, request: web.Request) -> web.StreamResponse:
        try:
            deleted = await self.engine.purge(request.match_info["instanceId"])
        except InstanceNotFound:
            return web.Response(status=404)
        except InstanceNotTerminal as exc:
            return error(412, str(exc))
        return web.json_response({"instancesDeleted": deleted})

    async def purge_by(self, request: web.Request) -> web.StreamResponse:
        created_from = _time(request, "createdTimeFrom")
        if created_from is None:
            return error(400, "Please provide value for 'createdTimeFrom' parameter.")
        deleted = await self.engine.purge_by(
            created_from=created_from,
            created_to=_time(request, "createdTimeTo"),
            runtime_status=_statuses(request),
        )
        return web.json_response({"instancesDeleted": deleted}) if deleted else web.Response(status=404)

    async def entities(self, request: web.Request) -> web.StreamResponse:
        return error(501, ENTITIES_NOT_SUPPORTED)

    async def unsupported(self, request: web.Request) -> web.StreamResponse:
        operation = request.match_info.get("operation", "this operation")
        return error(501, f"'{operation}' is not supported by devhost.")


class OutageSwitch:
    """The fault switch of the start and status routes: 503 while `path` exists; each refusal is a line of
    `ledger` {at, route, instanceId}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ledger = ledger_of(path)

    @classmethod
    def from_settings(cls, environ: Mapping[str, str] = os.environ) -> OutageSwitch | None:
        value = environ.get(OUTAGE_SETTING, "").strip()
        return cls(Path(value)) if value else None

    def guard(self, route: str, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.path.exists():
                return await handler(request)
            line = {"at": time.time(), "route": route, "instanceId": request.match_info.get("instanceId")}
            with self.ledger.open("a") as ledger:
                ledger.write(json.dumps(line) + "\n")
            # What the client makes of it (azure-functions-durable 1.x, DurableOrchestrationClient): get_status
            # raises Exception("The operation failed with an unexpected status code 503") (its status switch takes
            # 200/202/400/404/500 only); start_new raises Exception(<this body>) (its catch-all after 400).
            return web.json_response(
                {"Message": "The Durable HTTP API is unavailable (devhost fault switch)."},
                status=503,
                headers={"Retry-After": "1"},
            )

        return guarded


def ledger_of(outage_file: Path) -> Path:
    """Where the switch of `outage_file` records its refusals."""
    return outage_file.with_name(outage_file.name + ".jsonl")


def add_routes(app: web.Application, engine: DurableEngine, outage: OutageSwitch | None = None) -> None:
    """The extension's routes on `app`; `outage` (default: from DEVHOST_DURABLE_API_OUTAGE_FILE) guards start and
    status."""
    api = DurableHttpApi(engine)
    switch = outage or OutageSwitch.from_settings()
    start = api.start if switch is None else switch.guard("start", api.start)
    status = api.status if switch is None else switch.guard("status", api.status)
    prefix = "/runtime/webhooks/durabletask"
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "/orchestrators/{functionName}", start),
        ("POST", "/orchestrators/{functionName}/{instanceId}", start),
        ("GET", "/instances", api.query),
        ("GET", "/instances/", api.query),
        ("DELETE", "/instances", api.purge_by),
        ("DELETE", "/instances/", api.purge_by),
        ("GET", "/instances/{instanceId}", status),
        ("DELETE", "/instances/{instanceId}", api.purge),
        ("POST", "/instances/{instanceId}/raiseEvent/{eventName}", api.raise_event),
        ("POST", "/instances/{instanceId}/terminate", api.terminate),
        ("POST", "/instances/{instanceId}/{operation:suspend|resume|rewind|restart}", api.unsupported),
        ("*", "/entities/{tail:.*}", api.entities),
        # Last: whatever no route above takes (an unknown path, or a known path with another method).
        ("*", "/{tail:.*}", api.not_found),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, prefix + path, handler)


__all__ = ["OUTAGE_SETTING", "DurableHttpApi", "OutageSwitch", "add_routes", "error", "ledger_of"]
