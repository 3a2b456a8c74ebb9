"""Async twin of `orderflow.bus`: the embedded aio client or `azure.servicebus.aio.ServiceBusClient`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orderflow.settings import SERVICE_BUS_CONNECTION

from . import make_client, make_client_from_settings

__all__ = ["client_from_settings", "from_connection_string"]


def from_connection_string(conn_str: str, **kwargs: Any) -> Any:
    """The embedded aio client for `Endpoint=embedded://...`, else the azure-servicebus aio client."""
    return make_client(conn_str, aio=True, **kwargs)


def client_from_settings(
    env: Mapping[str, str] | None = None, connection: str = SERVICE_BUS_CONNECTION
) -> Any:
    """As `orderflow.bus.client_from_settings`, with `azure.identity.aio.DefaultAzureCredential`."""
    return make_client_from_settings(env, connection, aio=True)
