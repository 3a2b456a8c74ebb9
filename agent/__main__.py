"""Entry point of the Agent process: `python -m agent [flags]`; stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import cast

from agent.config import config_from_args
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
        await serve(client, config, stop, env=os.environ)  # opens the circuit breaker's store, closes it on exit
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # Application Insights via OpenTelemetry when APPLICATIONINSIGHTS_CONNECTION_STRING is set (Azure: agent.bicep
    # sets it, with Entra ID ingestion as the Agent's identity), as the service `orderflow-agent` (cloud_RoleName)
    # unless OTEL_SERVICE_NAME says otherwise; else the console for OTEL_TRACES_EXPORTER=console (and the metrics
    # and logs equivalents); else nothing is exported.
    telemetry.configure_from_env(service_name=AGENT_SERVICE_NAME)
    return asyncio.run(_run(argv))


if __name__ == "__main__":
    sys.exit(main())
