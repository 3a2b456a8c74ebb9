"""What every `orderflow` command shares: the app settings it runs with, the connections built from them, one-line
errors, and JSON output.

Settings are the Functions app's own (orderflow/settings.py), read from the environment over the `Values` of
`<app-dir>/local.settings.json`, as `func start` and devhost apply them: the same command works against the local
system (embedded broker and store) and Azure (`ServiceBusConnection__fullyQualifiedNamespace`, a Cosmos account
endpoint, DefaultAzureCredential).

One-line errors (`CliError`, `one_line`) and `operator_name` serve every command, the breaker command's too.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from rich.markup import escape

from orderflow import text
from orderflow.alarms import AlarmConfig
from orderflow.breaker import BreakerUnreadable
from orderflow.clock import Clock, SystemClock
from orderflow.operations import Operations
from orderflow.runtime import Services, Tunables
from orderflow.text import shown


class CliError(Exception):
    """A failure to report as one line (no traceback)."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message (with its type unless it is a CliError, a BreakerUnreadable or a
    ValueError)."""
    return text.one_line(exc, (CliError, BreakerUnreadable))


def operator_name(explicit: str | None, env: Mapping[str, str]) -> str:
    if explicit:
        return explicit
    name = env.get("USER") or env.get("USERNAME")
    if name:
        return name
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "operator"


DURABLE_PREFIX = "/runtime/webhooks/durabletask"
DEFAULT_HOST = "http://127.0.0.1:7071"


def load_settings(app_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment over local.settings.json's Values (a variable already set wins, as in Core Tools)."""
    values: dict[str, str] = {}
    path = app_dir / "local.settings.json"
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CliError(f"{path} is not valid JSON: {exc}") from exc
        values = {str(k): str(v) for k, v in ((data or {}).get("Values") or {}).items()}
    return {**values, **(os.environ if environ is None else environ)}


def safe(value: object) -> str:
    """Sender-chosen text for a rich markup string: bounded, control characters escaped (orderflow.text.shown), and
    markup escaped, so a MessageId `[/]` prints as itself instead of raising MarkupError."""
    return escape(shown(value))


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def started_by_up(app_dir: Path) -> dict[str, dict[str, Any]]:
    """The processes `python -m devhost up` recorded in <app-dir>/.devhost/up.json, by name ({} when none)."""
    try:
        data = json.loads((app_dir / ".devhost" / "up.json").read_text())
        return {str(p["name"]): dict(p) for p in data["processes"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def durable_api_url(app_dir: Path, env: Mapping[str, str]) -> str:
    """The Durable extension's HTTP API: `DurableTaskApiUrl`, else the devhost `devhost up` recorded, else
    127.0.0.1:7071 (devhost's and `func start`'s default port)."""
    explicit = env.get("DurableTaskApiUrl")
    if explicit:
        return explicit.rstrip("/")
    host = str(started_by_up(app_dir).get("devhost", {}).get("url") or DEFAULT_HOST)
    return host.rstrip("/") + DURABLE_PREFIX


class DurableHttpStatuses:
    """`DurableStatuses` over the Durable HTTP API (GET /instances/{id}?showHistory=true). On Azure the API needs
    the `durabletask_extension` system key: `DurableTaskApiKey` (read from the environment only, never stored); and,
    since App Service authentication guards the whole app (infra/app/function.bicep, no path excluded), an Entra ID
    token for the operator API's scope, `DurableTaskApiScope` (azd output OPERATOR_API_SCOPE), taken with
    DefaultAzureCredential (`az login`) when set."""

    def __init__(self, base_url: str, key: str | None = None, timeout: float = 10.0, scope: str | None = None) -> None:
        self.base_url = base_url
        self.key = key
        self.timeout = timeout
        self.scope = scope
        self._token: str | None = None

    async def _headers(self) -> dict[str, str]:
        if not self.scope:
            return {}
        if self._token is None:
            from azure.identity.aio import DefaultAzureCredential  # heavy; only when a scope is set

            async with DefaultAzureCredential() as credential:
                self._token = (await credential.get_token(self.scope)).token
        return {"Authorization": f"Bearer {self._token}"}

    async def status(self, instance: str) -> dict[str, Any] | None:
        params = {"showHistory": "true", "showHistoryOutput": "false"}
        if self.key:
            params["code"] = self.key
        url = f"{self.base_url}/instances/{quote(instance, safe='')}"
        headers = await self._headers()
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
            session.get(url, params=params, headers=headers) as response,
        ):
            if response.status == 404:
                return None
            if response.status == 401 and not self.scope:
                raise CliError(
                    f"the Durable HTTP API at {self.base_url} answered 401: App Service authentication guards it; set "
                    "DurableTaskApiScope to the operator API's scope (azd output OPERATOR_API_SCOPE) and `az login` "
                    "as an operator"
                )
            if response.status >= 400:
                raise CliError(f"the Durable HTTP API at {self.base_url} answered {response.status}")
            data = await response.json(content_type=None)
            return data if isinstance(data, dict) else None


@asynccontextmanager
async def operations(
    app_dir: Path, env: Mapping[str, str], clock: Clock | None = None, need_durable: bool = False
) -> AsyncIterator[Operations]:
    """The app's ports, opened from `env` (identity-based on Azure), as one `Operations`; closed on exit."""
    from orderflow.adapters import (
        aio_bus_from_settings,  # the SDKs are heavy; only when needed
        open_breaker_documents,
        open_stores,
    )

    try:
        tunables = Tunables.from_env(env)
        alarm_config = AlarmConfig.from_env(tunables, env)
    except (ValueError, KeyError, AssertionError) as exc:
        raise CliError(f"invalid app settings: {one_line(exc)}") from exc
    if not env.get("CosmosDb__accountEndpoint"):
        raise CliError(
            "app setting CosmosDb__accountEndpoint is not set: run in the app folder or pass --app-dir "
            "(locally: cp local.settings.sample.json local.settings.json), or set it in the environment"
        )
    try:
        stores = open_stores(env)
        breakers = open_breaker_documents(env)
        bus = aio_bus_from_settings(env)
    except Exception as exc:
        raise CliError(f"cannot open the app's stores or bus: {one_line(exc)}") from exc
    durable = (
        DurableHttpStatuses(
            durable_api_url(app_dir, env), env.get("DurableTaskApiKey"), scope=env.get("DurableTaskApiScope")
        )
        if need_durable
        else None
    )
    services = Services(
        orders=stores.orders,
        state=stores.state,
        bus=bus,
        tunables=tunables,
        clock=clock or SystemClock(),
        breakers=breakers,
    )
    try:
        yield Operations(services, durable, alarm_config=alarm_config)
    finally:
        for closing in (stores.aclose(), breakers.aclose(), bus.close()):
            try:
                await closing
            except Exception:  # noqa: BLE001 - S110 - closing after a failure must not hide the failure
                pass
