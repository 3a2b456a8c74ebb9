"""The operator HTTP API's mapping (triggers/ops_api.py): route values, query string, headers and body in, an HTTP
status and a JSON body out, over `orderflow.operations.Operations`. No azure.functions here (orderflow/ stays free of
it): the trigger turns a func.HttpRequest into these arguments and a `Reply` into a func.HttpResponse.

Every route needs, on top of the function key, a caller signed in through App Service Authentication (Easy Auth,
Entra ID) who holds the app role OperatorAppRole: else a 401 or 403 (`authorize`). A refusal (`OpsError`) is answered
with its status and `{"error", "message"}`; any other failure is a 500 of the same shape that names no exception and
carries no traceback (the exception goes to the function's log). The audit names the signed-in principal; a body's
`by` is refused. The response shapes are documented, and tested against the real responses, in orderflow/openapi.py.
"""

from __future__ import annotations

import base64
import binascii
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
# App Service Authentication ("Easy Auth") authenticates the caller before the Functions host, sets
# WEBSITE_AUTH_ENABLED=True on the app, and hands the app the signed-in principal in request headers that "external
# requests aren't allowed to set ... they're present only if set by App Service": X-MS-CLIENT-PRINCIPAL (Base64 JSON
# {auth_typ, claims: [{typ, val}], name_typ, role_typ}), X-MS-CLIENT-PRINCIPAL-NAME and -ID
# (learn.microsoft.com/azure/app-service/configure-authentication-user-identities, "Access user claims in app code",
# "Decode the client principal header"; .../reference-app-settings, "Authentication & Authorization"). Without Easy
# Auth anyone holding a function key could send those headers, so they are trusted only when Easy Auth is on.
PRINCIPAL_HEADER = "x-ms-client-principal"
PRINCIPAL_NAME_HEADER = "x-ms-client-principal-name"
PRINCIPAL_ID_HEADER = "x-ms-client-principal-id"
EASY_AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
# The app role an operator's principal must hold (app setting OperatorAppRole; infra/ defines it on the app
# registration and assigns it).
ROLE_SETTING, DEFAULT_ROLE = "OperatorAppRole", "Orders.Operator"
# Entra ID's app roles arrive as claims of type "roles", while role_typ names the long WS-Federation role type; either
# counts (the same doc's own sample looks for role_typ only, which misses Entra's).
ROLES_CLAIM = "roles"
# The object id, when X-MS-CLIENT-PRINCIPAL-ID is absent: Entra ID's `oid` claim under Easy Auth's claim mapping.
OBJECT_ID_CLAIMS = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid")
INTERNAL_ERROR = {"error": "InternalError", "message": "the request failed; the function app's log has the details"}
_WHOLE_NUMBER = re.compile(r"-?[0-9]{1,12}")

GetStatus = Callable[..., Awaitable[Any]]  # DurableOrchestrationClient.get_status


class Unauthenticated(OpsError):
    status, code = 401, "Unauthorized"


class Forbidden(OpsError):
    status, code = 403, "Forbidden"


@dataclass(frozen=True)
class Principal:
    """The signed-in caller, as Easy Auth describes it: name, object id and app roles."""

    name: str
    object_id: str | None
    roles: frozenset[str]

    @property
    def by(self) -> str:
        """Who acts, for an audit entry: `<name> (<object id>)` (the name cut so that both fit in 256)."""
        return self.name[:200] if not self.object_id else f"{self.name[:200]} ({self.object_id[:50]})"


Handler = Callable[[Operations, Principal], Awaitable[dict[str, Any]]]


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


async def serve(
    handler: Handler,
    headers: Mapping[str, str],
    env: Mapping[str, str],
    get_status: GetStatus | None = None,
    ok: int = 200,
) -> Reply:
    """Run one operation on this process's services for the signed-in operator: `ok` with its answer, an `OpsError`'s
    status (401 or 403 before anything else), or a bare 500."""
    try:
        caller = authorize(headers, env)
        ops = Operations(
            await get_services(), None if get_status is None else ClientStatuses(get_status), listens=app_listens
        )
        return Reply(ok, await handler(ops, caller))
    except OpsError as exc:
        return Reply(exc.status, exc.to_json())
    except Exception:
        log.exception("ops API request failed")
        return Reply(500, dict(INTERNAL_ERROR))


def refusal(headers: Mapping[str, str], env: Mapping[str, str]) -> Reply | None:
    """The 401 or 403 for a caller who may not use the API (None: an operator), for a route that needs no services."""
    try:
        authorize(headers, env)
    except OpsError as exc:
        return Reply(exc.status, exc.to_json())
    return None


def authorize(headers: Mapping[str, str], env: Mapping[str, str]) -> Principal:
    """The signed-in operator; Unauthenticated (401) without Easy Auth or without a principal, Forbidden (403) when
    the principal lacks the operator role."""
    role = (env.get(ROLE_SETTING) or "").strip() or DEFAULT_ROLE
    if env.get(EASY_AUTH_SETTING, "").strip().lower() != "true":
        raise Unauthenticated(
            f"App Service Authentication is off ({EASY_AUTH_SETTING} is not True): the operator API needs a caller "
            f"signed in with Entra ID who holds the app role {role}"
        )
    found = principal(headers)
    if found is None:
        raise Unauthenticated(f"no signed-in principal: sign in with Entra ID as a holder of the app role {role}")
    if role not in found.roles:
        raise Forbidden(f"{found.name} does not hold the app role {role} (OperatorAppRole)")
    return found


def principal(headers: Mapping[str, str]) -> Principal | None:
    """The principal in Easy Auth's headers, None when there is none or X-MS-CLIENT-PRINCIPAL is not Base64 JSON of
    the documented shape (only App Service sets it, so a broken one names nobody)."""
    seen = {k.lower(): v for k, v in headers.items()}
    raw = seen.get(PRINCIPAL_HEADER, "").strip()
    if not raw:
        return None
    try:
        data = json.loads(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError, RecursionError):
        return None
    claims = _claims(data)
    if claims is None:
        return None
    name = seen.get(PRINCIPAL_NAME_HEADER, "").strip() or _first(claims, (str(data.get("name_typ") or ""), "name"))
    if not name:
        return None
    object_id = seen.get(PRINCIPAL_ID_HEADER, "").strip() or _first(claims, OBJECT_ID_CLAIMS) or None
    role_types = {str(data.get("role_typ") or ""), ROLES_CLAIM} - {""}
    return Principal(name, object_id, frozenset(val for typ, val in claims if typ in role_types))


def _claims(data: object) -> list[tuple[str, str]] | None:
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        return None
    claims = data["claims"]
    if not all(isinstance(c, dict) and isinstance(c.get("typ"), str) and isinstance(c.get("val"), str) for c in claims):
        return None
    return [(c["typ"], c["val"]) for c in claims]


def _first(claims: list[tuple[str, str]], types: tuple[str, ...]) -> str:
    return next((val.strip() for typ, val in claims if typ in types and val.strip()), "")


def order(order_id: str) -> Handler:
    return lambda ops, _: ops.order(order_id)


def orders(query: Mapping[str, str]) -> Handler:
    """GET /orders. An empty parameter counts as absent, as on Azure, where the host drops empty query values before
    the Python worker sees them."""

    async def run(ops: Operations, _: Principal) -> dict[str, Any]:
        state = query.get("state")
        if not state:
            raise BadRequest("the query parameter state is required (Pending, Processing, Error, ...)")
        return await ops.orders(
            state,
            _older_than(query.get("olderThan") or None),
            _page_size(query.get("pageSize")),
            query.get("continuation") or None,
            query.get("app") or None,
        )

    return run


def resubmit(order_id: str, body: bytes) -> Handler:
    async def run(ops: Operations, caller: Principal) -> dict[str, Any]:
        fields = _body(body, required=True)
        reason = fields.get("reason")
        if reason is None:
            raise BadRequest('the body needs a reason: {"reason": "..."}')
        return await ops.resubmit(order_id, caller.by, reason)

    return run


def cancel(order_id: str, body: bytes, tell: RaiseEvent | None = None) -> Handler:
    async def run(ops: Operations, caller: Principal) -> dict[str, Any]:
        fields = _body(body, required=False)
        return await ops.cancel(order_id, caller.by, fields.get("reason"), tell)

    return run


def summary() -> Handler:
    return lambda ops, _: ops.summary()


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
    """The request body: a JSON object of `reason`, a string or null (null: as if left out); unknown fields are
    refused, so that a misspelt one is not silently dropped from the audit trail, and so is `by`: the audit names the
    signed-in principal, never what a body says. Any body that is not such an object is a BadRequest: malformed,
    nested too deeply to parse, or not UTF-8 text."""
    if not raw.strip():
        if required:
            raise BadRequest('the body must be a JSON object like {"reason": "..."}')
        return {}
    try:
        fields = json.loads(raw)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, and an integer too long to convert
        raise BadRequest("the body is not JSON") from None
    except RecursionError:
        raise BadRequest("the body is not JSON: it is nested too deeply") from None
    if not isinstance(fields, dict):
        raise BadRequest('the body must be a JSON object like {"reason": "..."}')
    if "by" in fields:
        raise BadRequest("field 'by' is not accepted: the audit names the signed-in principal (Easy Auth)")
    unknown = sorted(set(fields) - {"reason"})
    if unknown:
        raise BadRequest(f"unknown field(s) in the body: {', '.join(unknown)} (expected reason)")
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
