"""Entry point of the Agent process: `python -m agent [flags]`; stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from agent.config import config_from_args
from agent.health import serve_health
from agent.worker import AgentBus, serve
from orderflow import telemetry
from orderflow.telemetry import configure_logging

AGENT_SERVICE_NAME = "orderflow-agent"


def create_client(connection: str | None, env: Mapping[str, str]) -> AgentBus:
    """An azure-servicebus aio client: `--connection` if given, else the app settings (`orderflow.adapters`).

    `Endpoint=embedded://...` selects the embedded broker; another connection string, or
    `ServiceBusConnection__fullyQualifiedNamespace` (identity-based), selects Azure Service Bus.
    """
    from orderflow.adapters import aio_bus_from_connection_string, aio_bus_from_settings

    client = aio_bus_from_connection_string(connection) if connection else aio_bus_from_settings(env)
    # The adapters return the core's `BusClient` port; both clients they build also take session receivers.
    return cast(AgentBus, client)


async def _run(argv: Sequence[str] | None) -> int:
    config, args = config_from_args(argv)
    configure_logging(args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with create_client(args.connection, os.environ) as client:
        serving = asyncio.create_task(serve(client, config, stop, env=os.environ))  # opens and closes the breaker
        health = await _health(config.health_port, lambda: not serving.done() and not stop.is_set())
        try:
            await serving
        finally:
            if health is not None:
                health.close()
    return 0


async def _health(port: int, alive: Callable[[], bool]) -> asyncio.Server | None:
    """The liveness endpoint on AGENT_HEALTH_PORT (agent/health.py), on every interface (the probe comes from the
    Container Apps environment); none for port 0, the default (local runs)."""
    return await serve_health("0.0.0.0", port, alive) if port else None  # noqa: S104 - the probe's network


def main(argv: Sequence[str] | None = None) -> int:
    # Application Insights via OpenTelemetry when APPLICATIONINSIGHTS_CONNECTION_STRING is set (Azure: agent.bicep
    # sets it, with Entra ID ingestion as the Agent's identity), as the service `orderflow-agent` (cloud_RoleName)
    # unless OTEL_SERVICE_NAME says otherwise; else the console for OTEL_TRACES_EXPORTER=console (and the metrics
    # and logs equivalents); else nothing is exported.
    telemetry.configure_from_env(service_name=AGENT_SERVICE_NAME)
    return asyncio.run(_run(argv))


if __name__ == "__main__":
    sys.exit(main())
