"""Test harness: a DurableEngine built from tests/host/sample_app, served on an aiohttp server on 127.0.0.1 (port
0).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from azure.durable_functions import DurableOrchestrationClient
from azure.durable_functions.models.utils import http_utils

from devhost.durable import DurableEngine
from devhost.durable.http_api import add_routes
from devhost.invoke import Invoker
from tests.host.sample_app.function_app import app

FUNCTIONS = app.get_functions()  # indexed once, as the host does
WAIT = 20.0  # bound for every condition wait; a passing test never gets near it


def function(name: str) -> Any:
    return next(f for f in FUNCTIONS if f.get_function_name() == name)


@dataclass
class Hub:
    """One running engine: its real SDK client, a raw HTTP session and the webhook base URL."""

    engine: DurableEngine
    client: DurableOrchestrationClient
    http: aiohttp.ClientSession
    base: str
    invoker: Invoker

    async def wait(self, instance_id: str, *statuses: str) -> dict[str, Any]:
        return await self.engine.wait_for_status(instance_id, statuses or ("Completed", "Failed", "Terminated"), WAIT)


class ManualClock:
    """The engine's clock; durable timers fire only when the test moves it (and pokes the engine)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, hub: Hub, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        hub.engine.poke()


class HubFactory:
    """Starts engines on a db path; a test may stop one and start another on the same db (recovery)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._open: list[tuple[DurableEngine, web.AppRunner, aiohttp.ClientSession, Invoker]] = []

    async def start(self, functions: list[Any] | None = None, **engine_options: Any) -> Hub:
        """An engine serving `functions` (default: tests/host/sample_app's), behind the HTTP API on 127.0.0.1."""
        invoker = Invoker()
        engine = DurableEngine(
            db_path=self.db_path,
            functions=FUNCTIONS if functions is None else functions,
            invoke=invoker,
            **engine_options,
        )
        web_app = web.Application()
        add_routes(web_app, engine)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        engine.set_base_url(base_url)
        await engine.start()
        session = aiohttp.ClientSession()
        self._open.append((engine, runner, session, invoker))
        return Hub(
            engine,
            DurableOrchestrationClient(engine.client_binding_json()),
            session,
            f"{base_url}/runtime/webhooks/durabletask",
            invoker,
        )

    async def stop(self, hub: Hub) -> None:
        for item in list(self._open):
            if item[0] is hub.engine:
                self._open.remove(item)
                await _close(*item)

    async def close(self) -> None:
        while self._open:
            await _close(*self._open.pop())
        await http_utils._close_session()  # the SDK keeps one global aiohttp session per process


async def _close(
    engine: DurableEngine, runner: web.AppRunner, session: aiohttp.ClientSession, invoker: Invoker
) -> None:
    await engine.stop()
    await session.close()
    await runner.cleanup()
    invoker.close()
