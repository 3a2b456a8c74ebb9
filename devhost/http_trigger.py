"""httpTrigger: functions served under `/api/` with route templates, methods and auth levels, as the host does.

As "Azure Functions HTTP trigger" (learn.microsoft.com/azure/azure-functions/functions-bindings-http-webhook-trigger)
and azure-functions-host's WebScriptHostHttpRoutesManager.cs: default route `api/<function name>`; route templates
with `{name}`, `{name:constraint}` and optional `{name?}`; auth level `function` needs a function or host key in the
`x-functions-key` header or the `code` query parameter, `admin` the master key, `anonymous` none; a missing or wrong
key answers 401. A method no trigger on that path declares matches no route: 404 with no body, before any key check.
A repeated query parameter's values are joined with ",", empty values dropped (GrpcMessageConversionExtensions).
Sources: docs/modules-host.md. In front of it all, with WEBSITE_AUTH_ENABLED: the Easy Auth stand-in, easy_auth.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import azure.functions as func
from aiohttp import web

from .easy_auth import EasyAuth

_PARAM = re.compile(r"\{(\*?)([A-Za-z_][A-Za-z0-9_]*)(?::([A-Za-z]+)(?:\([^)]*\))?)?(\?)?\}")
_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "guid": r"[0-9a-fA-F-]{36}",
    "alpha": r"[A-Za-z]+",
    "bool": r"(?:true|false)",
    "double": r"-?\d+(?:\.\d+)?",
    "float": r"-?\d+(?:\.\d+)?",
}


def compile_route(template: str) -> re.Pattern[str]:
    """Turn a Functions route template into an anchored regex whose groups are the route parameters."""
    pattern, pos = "", 0
    template = template.strip("/")
    for m in _PARAM.finditer(template):
        literal = template[pos : m.start()]
        catch_all, name, constraint, optional = m.groups()
        body = r".*" if catch_all else _CONSTRAINTS.get((constraint or "").lower(), r"[^/]+")
        group = f"(?P<{name}>{body})"
        if optional and literal.endswith("/"):
            pattern += re.escape(literal[:-1]) + f"(?:/{group})?"
        else:
            pattern += re.escape(literal) + (f"{group}?" if optional else group)
        pos = m.end()
    pattern += re.escape(template[pos:])
    return re.compile(f"^{pattern}/?\\Z", re.IGNORECASE | re.DOTALL)


class KeyStore:
    """Function keys kept in the state dir (`keys.json`), created on first start: a `default` key and a master key."""

    def __init__(self, state_dir: Path) -> None:
        path = state_dir / "keys.json"
        if not path.exists():
            # Written whole, then linked into place: hosts that share the state folder (scale-out) and start at once
            # all end up with the keys of the one that linked first.
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"keys.{os.getpid()}.{secrets.token_hex(4)}.tmp")
            tmp.write_text(
                json.dumps({"default": secrets.token_urlsafe(32), "master": secrets.token_urlsafe(32)}, indent=2)
            )
            tmp.chmod(0o600)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
            tmp.unlink()
        data = json.loads(path.read_text())
        self.default: str = data["default"]
        self.master: str = data["master"]

    def allows(self, auth_level: str, presented: str | None) -> bool:
        level = (auth_level or "function").lower()
        if level == "anonymous":
            return True
        if presented is None:
            return False
        if level == "admin":
            return secrets.compare_digest(presented, self.master)
        return any(secrets.compare_digest(presented, k) for k in (self.default, self.master))


@dataclass(frozen=True)
class HttpRoute:
    name: str
    pattern: re.Pattern[str]
    methods: frozenset[str]
    auth_level: str
    param: str
    invoke: Callable[[dict[str, Any]], Awaitable[Any]]


class HttpTriggers:
    """Dispatches `/api/...` requests to http-triggered functions."""

    def __init__(
        self, keys: KeyStore, default_auth_level: str = "function", env: Mapping[str, str] | None = None
    ) -> None:
        """`env`: the app settings (default: the environment, where devhost applied local.settings.json), for the
        Easy Auth stand-in's WEBSITE_AUTH_ENABLED."""
        self.keys = keys
        self.default_auth_level = default_auth_level
        self.routes: list[HttpRoute] = []
        self.easy_auth = EasyAuth.from_env(os.environ if env is None else env)

    def add(self, name: str, trigger: dict[str, Any], invoke: Callable[[dict[str, Any]], Awaitable[Any]]) -> None:
        methods = frozenset(str(m).upper() for m in (trigger.get("methods") or ["GET", "POST"]))
        self.routes.append(
            HttpRoute(
                name=name,
                pattern=compile_route(trigger.get("route") or name),
                methods=methods,
                auth_level=str(trigger.get("authLevel") or self.default_auth_level),
                param=str(trigger["name"]),
                invoke=invoke,
            )
        )

    def attach(self, app: web.Application) -> None:
        # [\s\S]: a route value may hold any decoded character but "/", a newline (%0A) too, as in ASP.NET routing.
        app.router.add_route("*", r"/api/{tail:[\s\S]*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers: dict[str, str] | None = dict(request.headers)
        if self.easy_auth is not None:  # the front end runs first: no route, method or key check before it
            headers = self.easy_auth.admit(request.headers)
            if headers is None:
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
        path = request.match_info["tail"]
        allowed = [(r, m) for r in self.routes if request.method in r.methods and (m := r.pattern.match(path))]
        if not allowed:
            return web.Response(status=404)
        route, match = allowed[0]
        key = request.headers.get("x-functions-key") or request.query.get("code")
        if not self.keys.allows(route.auth_level, key):
            return web.Response(status=401)
        body = await request.read()
        route_params = {k: v for k, v in match.groupdict().items() if v is not None}
        req = func.HttpRequest(
            method=request.method,
            url=str(request.url),
            headers=headers,
            params=query_params(request.query),
            route_params=route_params,
            body=body,
        )
        result = await route.invoke({route.param: req})
        return to_response(result)


def query_params(query: Mapping[str, str]) -> dict[str, str]:
    """The query as the host passes it to the worker: each name once, its values joined with "," (StringValues.
    ToString), left out when that is empty."""
    joined: dict[str, list[str]] = {}
    for name, value in query.items():
        joined.setdefault(name, []).append(value)
    return {name: text for name, values in joined.items() if (text := ",".join(values))}


def to_response(result: Any) -> web.Response:
    if result is None:
        return web.Response(status=204)
    if isinstance(result, func.HttpResponse):
        headers = dict(result.headers.items())
        if not any(k.lower() == "content-type" for k in headers):
            mimetype = result.mimetype or "text/plain"
            headers["Content-Type"] = f"{mimetype}; charset={result.charset}" if result.charset else mimetype
        return web.Response(status=result.status_code, body=result.get_body(), headers=headers)
    if isinstance(result, (bytes, str)):
        return web.Response(status=200, body=result if isinstance(result, bytes) else result.encode())
    return web.json_response(result)
