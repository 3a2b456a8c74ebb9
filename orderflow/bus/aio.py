"""Async twin of `orderflow.bus`: the embedded aio client or `azure.servicebus.aio.ServiceBusClient`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orderflow.settings import SERVICE_BUS_CONNECTION

from . import connection_string_from_settings
from ._core import is_embedded

__all__ = ["client_from_settings", "from_connection_string"]


def from_connection_string(conn_str: str, **kwargs: Any) -> Any:
    """The embedded aio client for `Endpoint=embedded://...`, else the azure-servicebus aio client."""
    if is_embedded(conn_str):
        from .embedded_aio import ServiceBusClient as EmbeddedClient

        return EmbeddedClient.from_connection_string(conn_str, **kwargs)
    from azure.servicebus.aio import ServiceBusClient

    return ServiceBusClient.from_connection_string(conn_str, **kwargs)


def client_from_settings(
    env: Mapping[str, str] | None = None, connection: str = SERVICE_BUS_CONNECTION
) -> Any:
    """As `orderflow.bus.client_from_settings`, with `azure.identity.aio.DefaultAzureCredential`."""
    source = os.environ if env is None else env
    namespace = source.get(f"{connection}__fullyQualifiedNamespace")
    if namespace:
        from azure.identity.aio import DefaultAzureCredential
        from azure.servicebus.aio import ServiceBusClient

        return ServiceBusClient(namespace, credential=DefaultAzureCredential())
    return from_connection_string(connection_string_from_settings(source, connection))
