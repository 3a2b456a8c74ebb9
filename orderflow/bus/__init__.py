"""The bus port: one way to get a Service Bus client, embedded broker or Azure, chosen by configuration.

Connection strings:

* `Endpoint=embedded://<path to sqlite file>[;ConfigFile=<path to config json>]` selects the embedded broker
  (`orderflow.bus.embedded`): queues in one SQLite file shared by every local process. Relative paths are
  resolved against the current directory. `ConfigFile` names a Service Bus emulator-style Config.json (the
  repo's `servicebus.config.json`) whose queues are declared (idempotently) when the client is created.
  Example: `Endpoint=embedded://.devhost/servicebus.db;ConfigFile=servicebus.config.json`. `DuplicateDelivery=true`
  (off by default) is a fault-injection switch for drills: every message completed in peek-lock mode is delivered a
  second time, as a lost settlement would make Service Bus do (orderflow/bus/broker.py).
* anything else (`Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=...;SharedAccessKey=...`)
  is handed to `azure.servicebus.ServiceBusClient.from_connection_string`.

`client_from_settings` reads app settings as the Functions host reads `connection="ServiceBusConnection"`:
`ServiceBusConnection__fullyQualifiedNamespace` set → identity-based `ServiceBusClient(namespace,
DefaultAzureCredential())` (Azure); otherwise the connection string in `ServiceBusConnection` (local).
Both return objects with the azure-servicebus surface; the async twins live in `orderflow.bus.aio`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orderflow.settings import SERVICE_BUS_CONNECTION

from ._core import EMBEDDED_SCHEME, is_embedded
from .broker import EmbeddedBroker, QueueCounts
from .config import QueueProperties

__all__ = [
    "EMBEDDED_SCHEME",
    "EmbeddedBroker",
    "QueueCounts",
    "QueueProperties",
    "client_from_settings",
    "from_connection_string",
    "is_embedded",
]


def from_connection_string(conn_str: str, **kwargs: Any) -> Any:
    """The embedded client for `Endpoint=embedded://...`, else the azure-servicebus client."""
    return make_client(conn_str, aio=False, **kwargs)


def client_from_settings(
    env: Mapping[str, str] | None = None, connection: str = SERVICE_BUS_CONNECTION
) -> Any:
    """A client for the binding connection `connection`: identity-based namespace first, then a string."""
    return make_client_from_settings(env, connection, aio=False)


def make_client(conn_str: str, *, aio: bool, **kwargs: Any) -> Any:
    """The one place that chooses the implementation (sync or aio) from a connection string."""
    if is_embedded(conn_str):
        if aio:
            from .embedded_aio import ServiceBusClient as EmbeddedAio

            return EmbeddedAio.from_connection_string(conn_str, **kwargs)
        from .embedded import ServiceBusClient as Embedded

        return Embedded.from_connection_string(conn_str, **kwargs)
    client_class = _azure_client_class(aio)
    return client_class.from_connection_string(conn_str, **kwargs)


def make_client_from_settings(env: Mapping[str, str] | None, connection: str, *, aio: bool) -> Any:
    source = os.environ if env is None else env
    namespace = source.get(f"{connection}__fullyQualifiedNamespace")
    if namespace:
        if aio:
            from azure.identity.aio import DefaultAzureCredential as AioCredential

            return _azure_client_class(True)(namespace, credential=AioCredential())
        from azure.identity import DefaultAzureCredential

        return _azure_client_class(False)(namespace, credential=DefaultAzureCredential())
    return make_client(connection_string_from_settings(source, connection), aio=aio)


def _azure_client_class(aio: bool) -> Any:
    if aio:
        from azure.servicebus.aio import ServiceBusClient as AioClient

        return AioClient
    from azure.servicebus import ServiceBusClient

    return ServiceBusClient


def connection_string_from_settings(
    source: Mapping[str, str], connection: str = SERVICE_BUS_CONNECTION
) -> str:
    """The connection string setting, or a KeyError that says which settings are missing."""
    value = source.get(connection)
    if not value:
        raise KeyError(
            f"no Service Bus connection: set {connection}__fullyQualifiedNamespace (Azure, identity) or "
            f"{connection} (a connection string, e.g. "
            "Endpoint=embedded://.devhost/servicebus.db;ConfigFile=servicebus.config.json)"
        )
    return value
