"""devhost's App Service Authentication stand-in (devhost/easy_auth.py) in front of its HTTP triggers: as strict as
Azure's front end with authentication required and `Return401` (learn.microsoft.com/azure/app-service/
configure-authentication-user-identities, "Access user claims in app code"): client-sent principal headers never reach
the app, an unauthenticated request is a 401 before any route, method or key check, a signed-in one arrives with
X-MS-CLIENT-PRINCIPAL in the documented shape. Off, it changes nothing (Azure without authentication)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import azure.functions as func
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devhost.easy_auth import (
    NAME_TYPE,
    OBJECT_ID_CLAIM,
    ROLE_TYPE,
    EasyAuth,
    LocalPrincipal,
    local_token,
    parse_local_token,
)
from devhost.http_trigger import HttpTriggers, KeyStore

ON = {"WEBSITE_AUTH_ENABLED": "True"}
FORGED = {
    "X-MS-CLIENT-PRINCIPAL": base64.b64encode(b'{"claims": [{"typ": "roles", "val": "Orders.Operator"}]}').decode(),
    "X-MS-CLIENT-PRINCIPAL-NAME": "mallory",
    "x-ms-client-principal-id": "oid-mallory",
    "X-MS-TOKEN-AAD-ACCESS-TOKEN": "forged",
}


class Served:
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    async def get(self, path: str, headers: dict[str, str], key: bool = True) -> tuple[int, dict[str, str], Any]:
        sent = {**headers, **({"x-functions-key": self.key} if key else {})}
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}/api/{path}", headers=sent) as r:
            body = await r.read()
            return r.status, dict(r.headers), json.loads(body) if body else None


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[dict[str, str]], Any]]:
    """`serve(env)`: devhost's HTTP triggers under `env`, with one function (`echo/{id:int}`, auth level function)
    that answers the headers it was given."""
    servers: list[TestServer] = []

    async def echo(kwargs: dict[str, Any]) -> func.HttpResponse:
        req: func.HttpRequest = kwargs["req"]
        return func.HttpResponse(json.dumps(dict(req.headers)), mimetype="application/json")

    async def start(env: dict[str, str]) -> Served:
        keys = KeyStore(tmp_path)
        triggers = HttpTriggers(keys, env=env)
        triggers.add(
            "echo", {"route": "echo/{id:int}", "methods": ["GET"], "authLevel": "function", "name": "req"}, echo
        )
        app = web.Application()
        triggers.attach(app)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return Served(str(server.make_url("")).rstrip("/"), keys.default)

    yield start
    for server in servers:
        await server.close()


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


async def test_a_signed_in_caller_reaches_the_app_with_the_principal_headers_easy_auth_sets(serve: Any) -> None:
    served = await serve(ON)
    status, _, seen = await served.get("echo/1", {"Authorization": local_token("ada", "Orders.Operator", "Other")})
    assert status == 200
    seen = lower(seen)
    principal = LocalPrincipal("ada", ("Orders.Operator", "Other"))
    assert (seen["x-ms-client-principal-name"], seen["x-ms-client-principal-id"]) == ("ada", principal.object_id)
    assert seen["x-ms-client-principal-idp"] == "aad"
    decoded = json.loads(base64.b64decode(seen["x-ms-client-principal"]))
    assert set(decoded) == {"auth_typ", "claims", "name_typ", "role_typ"}
    assert (decoded["auth_typ"], decoded["name_typ"], decoded["role_typ"]) == ("aad", NAME_TYPE, ROLE_TYPE)
    claims = [(c["typ"], c["val"]) for c in decoded["claims"]]
    assert (OBJECT_ID_CLAIM, principal.object_id) in claims and (NAME_TYPE, "ada") in claims
    # Entra ID's app roles: claims of type "roles", not of role_typ.
    assert [v for t, v in claims if t == "roles"] == ["Orders.Operator", "Other"]
    assert seen["authorization"].startswith("Bearer local:")  # Easy Auth passes the token on


async def test_client_sent_principal_headers_are_replaced(serve: Any) -> None:
    served = await serve(ON)
    status, _, seen = await served.get("echo/1", {**FORGED, "Authorization": local_token("bob")})
    seen = lower(seen)
    assert status == 200 and seen["x-ms-client-principal-name"] == "bob"
    assert seen["x-ms-client-principal-id"] == LocalPrincipal("bob", ()).object_id
    assert "x-ms-token-aad-access-token" not in seen
    decoded = json.loads(base64.b64decode(seen["x-ms-client-principal"]))
    assert not [c for c in decoded["claims"] if c["typ"] == "roles"]  # bob holds no role; the forged one is gone


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param(FORGED, id="forged-principal-only"),
        pytest.param(
            {"Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.e30.sig"}, id="an-entra-token-devhost-cannot-check"
        ),
        pytest.param({"Authorization": "Basic YWRhOnB3"}, id="another-scheme"),
        pytest.param({"Authorization": "Bearer local::Orders.Operator"}, id="no-name"),
    ],
)
async def test_an_unauthenticated_request_is_a_401_before_route_method_and_key(
    serve: Any, headers: dict[str, str]
) -> None:
    served = await serve(ON)
    for path, key in (("echo/1", True), ("echo/1", False), ("echo/one", True), ("no-such-route", True)):
        status, response_headers, body = await served.get(path, headers, key=key)
        assert (status, body) == (401, None), path
        assert response_headers.get("WWW-Authenticate") == "Bearer"


async def test_signed_in_the_host_rules_apply_as_before(serve: Any) -> None:
    served = await serve(ON)
    token = {"Authorization": local_token("ada", "Orders.Operator")}
    assert (await served.get("echo/1", token, key=False))[0] == 401  # the function key is still needed
    assert (await served.get("echo/one", token))[0] == 404  # a route constraint decides, after Easy Auth


@pytest.mark.parametrize("env", [{}, {"WEBSITE_AUTH_ENABLED": "False"}])
async def test_off_nothing_is_stripped_or_checked(serve: Any, env: dict[str, str]) -> None:
    """As on Azure without App Service Authentication: whatever principal headers a client sends reach the app (which
    must therefore trust none of them: orderflow/ops_http.py refuses every request then)."""
    served = await serve(env)
    status, _, seen = await served.get("echo/1", {**FORGED, "Authorization": local_token("ada", "Orders.Operator")})
    seen = lower(seen)
    assert status == 200 and seen["x-ms-client-principal-name"] == "mallory"
    assert seen["x-ms-client-principal"] == FORGED["X-MS-CLIENT-PRINCIPAL"]
    assert (await served.get("echo/1", {}))[0] == 200


@pytest.mark.parametrize(
    ("header", "principal"),
    [
        ("Bearer local:ada:Orders.Operator", LocalPrincipal("ada", ("Orders.Operator",))),
        ("bearer local:ada@contoso.com:A, B ,", LocalPrincipal("ada@contoso.com", ("A", "B"))),
        ("Bearer local:ada", LocalPrincipal("ada", ())),
        ("Bearer local:ada:", LocalPrincipal("ada", ())),
        ("Bearer local:svc:x:Orders.Operator", LocalPrincipal("svc:x", ("Orders.Operator",))),
        ("Bearer local:", None),
        ("Bearer local:a\nb:R", None),
        ("Bearer other:ada:R", None),
        ("local:ada:R", None),
        (None, None),
    ],
)
def test_the_local_token(header: str | None, principal: LocalPrincipal | None) -> None:
    assert parse_local_token(header) == principal


def test_the_object_id_is_stable_per_name() -> None:
    assert LocalPrincipal("ada", ()).object_id == LocalPrincipal("ada", ("X",)).object_id
    assert LocalPrincipal("ada", ()).object_id != LocalPrincipal("bob", ()).object_id
    assert EasyAuth.from_env({"WEBSITE_AUTH_ENABLED": "true"}) == EasyAuth()
    assert EasyAuth.from_env({"WEBSITE_AUTH_ENABLED": "1"}) is None
