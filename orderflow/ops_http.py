"""The operator HTTP API's mapping (triggers/ops_api.py): route values, query string, headers and body in, an HTTP
status and a JSON body out, over `orderflow.operations.Operations`. No azure.functions here (orderflow/ stays free of
it): the trigger turns a func.HttpRequest into these arguments and a `Reply` into a func.HttpResponse.

A refusal (`OpsError`) is answered with its status and `{"error", "message"}`; any other failure is a 500 of the same
shape that names no exception and carries no traceback (the exception goes to the function's log). The response
shapes are documented, and tested against the real responses, in orderflow/openapi.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orderflow.operations import BadRequest, Operations, OpsError, RaiseEvent, app_listens, parse_duration
from orderflow.runtime import get_services
from orderflow.starter import never_started

log = logging.getLogger("orderflow.ops")

DEFAULT_PAGE_SIZE = 50
DEFAULT_BY = "api"
# App Service Authentication ("Easy Auth") puts the signed-in caller's name in this header and sets
# WEBSITE_AUTH_ENABLED=True on the app (learn.microsoft.com/azure/app-service/configure-authentication-user-identities,
# "Access user claims in app code"; .../reference-app-settings, "Authentication & Authorization"). Without Easy Auth
# anyone holding a function key could send the header, so it is trusted only when Easy Auth is on.
PRINCIPAL_HEADER = "x-ms-client-principal-name"
EASY_AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
INTERNAL_ERROR = {"error": "InternalError", "message": "the request failed; the function app's log has the details"}
_WHOLE_NUMBER = re.compile(r"-?[0-9]{1,12}")

Handler = Callable[[Operations], Awaitable[dict[str, Any]]]
GetStatus = Callable[..., Awaitable[Any]]  # DurableOrchestrationClient.get_status


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]

    def text(self) -> str:
        return json.dumps(self.body)


class ClientStatuses:
    """`operations.DurableStatuses` over the Durable client binding (`DurableOrchestrationClient.get_status`)."""

    def __init__(self, get_status: GetStatus) -> None:
        self._get_status = get_status

    async def status(self, instance: str) -> dict[str, Any] | None:
        found = await self._get_status(instance, show_history=True, show_history_output=False)
        if never_started(found):  # a 404 comes back as a status without a runtime status (orderflow/starter.py)
            return None
        doc: dict[str, Any] = found.to_json()
        # DurableOrchestrationStatus.to_json() (azure-functions-durable 1.x) writes `history`, which the HTTP API never
        # fills: the events arrive as `historyEvents` and the constructor keeps unknown fields as attributes.
        doc.pop("history", None)
        doc["historyEvents"] = getattr(found, "historyEvents", None)
        return doc


async def serve(handler: Handler, get_status: GetStatus | None = None, ok: int = 200) -> Reply:
    """Run one operation on this process's services: `ok` with its answer, an `OpsError`'s status, or a bare 500."""
    try:
        ops = Operations(
            await get_services(), None if get_status is None else ClientStatuses(get_status), listens=app_listens
        )
        return Reply(ok, await handler(ops))
    except OpsError as exc:
        return Reply(exc.status, exc.to_json())
    except Exception:
        log.exception("ops API request failed")
        return Reply(500, dict(INTERNAL_ERROR))


def order(order_id: str) -> Handler:
    return lambda ops: ops.order(order_id)


def orders(query: Mapping[str, str]) -> Handler:
    """GET /orders. An empty parameter counts as absent, as on Azure, where the host drops empty query values before
    the Python worker sees them."""

    async def run(ops: Operations) -> dict[str, Any]:
        state = query.get("state")
        if not state:
            raise BadRequest("the query parameter state is required (Pending, Processing, Error, ...)")
        return await ops.orders(
            state,
            _older_than(query.get("olderThan") or None),
            _page_size(query.get("pageSize")),
            query.get("continuation") or None,
        )

    return run


def resubmit(order_id: str, body: bytes, headers: Mapping[str, str], env: Mapping[str, str]) -> Handler:
    async def run(ops: Operations) -> dict[str, Any]:
        fields = _body(body, required=True)
        reason = fields.get("reason")
        if reason is None:
            raise BadRequest('the body needs a reason: {"reason": "..."}')
        return await ops.resubmit(order_id, _caller(fields, headers, env), reason)

    return run


def cancel(
    order_id: str, body: bytes, headers: Mapping[str, str], env: Mapping[str, str], tell: RaiseEvent | None = None
) -> Handler:
    async def run(ops: Operations) -> dict[str, Any]:
        fields = _body(body, required=False)
        return await ops.cancel(order_id, _caller(fields, headers, env), fields.get("reason"), tell)

    return run


def summary() -> Handler:
    return lambda ops: ops.summary()


def _older_than(text: str | None) -> str | None:
    if text is not None:
        parse_duration(text)  # a BadRequest names the bound
    return text


def _page_size(text: str | None) -> int:
    if not text:
        return DEFAULT_PAGE_SIZE
    if not _WHOLE_NUMBER.fullmatch(text):
        raise BadRequest(f"pageSize must be a whole number, got {text[:40]!r}")
    return int(text)


def _body(raw: bytes, *, required: bool) -> dict[str, str]:
    """The request body: a JSON object of `reason` and `by`, each a string or null (null: as if left out); unknown
    fields are refused, so that a misspelt one is not silently dropped from the audit trail. Any body that is not
    such an object is a BadRequest: malformed, nested too deeply to parse, or not UTF-8 text."""
    if not raw.strip():
        if required:
            raise BadRequest('the body must be a JSON object like {"reason": "...", "by": "..."}')
        return {}
    try:
        fields = json.loads(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, and an integer too long to convert
        raise BadRequest("the body is not JSON") from None
    except RecursionError:
        raise BadRequest("the body is not JSON: it is nested too deeply") from None
    if not isinstance(fields, dict):
        raise BadRequest('the body must be a JSON object like {"reason": "...", "by": "..."}')
    unknown = sorted(set(fields) - {"reason", "by"})
    if unknown:
        raise BadRequest(f"unknown field(s) in the body: {', '.join(unknown)} (expected reason, by)")
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"field {name!r} must be a string")
        if isinstance(value, str) and not _is_utf8(value):
            raise BadRequest(f"field {name!r} is not Unicode text (it holds an unpaired surrogate escape)")
    return {name: value for name, value in fields.items() if value is not None}


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _caller(fields: Mapping[str, str], headers: Mapping[str, str], env: Mapping[str, str]) -> str:
    """Who acts, for the audit entry: the Easy Auth principal when Easy Auth is on (a signed-in caller cannot record
    another name), else the body's `by`, else "api"."""
    if env.get(EASY_AUTH_SETTING, "").lower() == "true":
        principal = next((v for k, v in headers.items() if k.lower() == PRINCIPAL_HEADER), "").strip()
        if principal:
            return principal
    return fields.get("by", "").strip() or DEFAULT_BY
