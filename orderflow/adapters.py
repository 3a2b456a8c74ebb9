"""Adapter choice: the one module that picks, from the app settings, the stand-ins of `orderflow.embedded` or the Azure
adapters of `orderflow.azure`, importing only the side it picks.

Stores: `CosmosDb__accountEndpoint = embedded://<path>` selects the embedded SQLite store; anything else is a Cosmos
DB account endpoint, reached with Microsoft Entra ID only. Service Bus, as the Functions host reads
`connection="ServiceBusConnection"`: `ServiceBusConnection__fullyQualifiedNamespace` gives an identity-based client,
`Endpoint=embedded://...` the embedded broker, any other string `ServiceBusClient.from_connection_string`. Both sides
return objects with the azure-servicebus surface, sync (`bus_from_*`) or aio (`aio_bus_from_*`).
Settings in detail: docs/modules-product.md."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from orderflow import settings
from orderflow.embedded.connection import EMBEDDED_SCHEME, is_embedded_connection
from orderflow.ports import BusClient, DocumentStore, OrdersDb, RecoveryIndex, StateStore
from orderflow.settings import SERVICE_BUS_CONNECTION

if TYPE_CHECKING:
    from azure.cosmos.aio import CosmosClient
    from azure.identity.aio import DefaultAzureCredential

    from orderflow.azure.cosmos import CosmosNames

__all__ = [
    "EMBEDDED_SCHEME",
    "Stores",
    "aio_bus_from_connection_string",
    "aio_bus_from_settings",
    "bus_from_connection_string",
    "bus_from_settings",
    "connection_string_from_settings",
    "is_embedded_connection",
    "open_breaker_documents",
    "open_recovery_index",
    "open_stores",
]


class Stores(NamedTuple):
    """The two ports; unpacks as `(orders, state)`; closes both (`await stores.aclose()`, `async with`)."""

    orders: OrdersDb
    state: StateStore

    async def aclose(self) -> None:
        await self.state.aclose()
        await self.orders.aclose()

    async def __aenter__(self) -> Stores:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _endpoint(source: Mapping[str, str]) -> str:
    endpoint = settings.get("CosmosDb__accountEndpoint", source)
    if not endpoint:
        raise KeyError("app setting CosmosDb__accountEndpoint is not set (use embedded://PATH locally)")
    return endpoint


def _embedded_path(endpoint: str) -> str | None:
    """The SQLite file of an `embedded://PATH` endpoint; None for a Cosmos DB account."""
    return endpoint[len(EMBEDDED_SCHEME) :] if endpoint.startswith(EMBEDDED_SCHEME) else None


def _cosmos(endpoint: str, source: Mapping[str, str]) -> tuple[CosmosClient, DefaultAzureCredential, CosmosNames]:
    """A Cosmos DB client on the app's identity (DefaultAzureCredential, `CosmosDb__clientId` for a user-assigned
    one), its credential (closed with the adapter) and the configured names."""
    from azure.cosmos.aio import CosmosClient
    from azure.identity.aio import DefaultAzureCredential

    from orderflow.azure.cosmos import CosmosNames

    credential = DefaultAzureCredential(managed_identity_client_id=settings.get("CosmosDb__clientId", source))
    return CosmosClient(endpoint, credential=credential), credential, CosmosNames.from_env(source)


def open_stores(env: Mapping[str, str] | None = None) -> Stores:
    """Open both ports as configured by `CosmosDb__accountEndpoint` (see the module docstring)."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.embedded.store import open_sqlite_stores

        return Stores(*open_sqlite_stores(path, source))
    from orderflow.azure.cosmos import cosmos_stores

    client, credential, names = _cosmos(endpoint, source)
    return Stores(*cosmos_stores(client, names, credential))


def open_breaker_documents(env: Mapping[str, str] | None = None) -> DocumentStore:
    """The circuit-breaker documents (`CircuitBreakerContainerName`), as configured by `CosmosDb__accountEndpoint`:
    what the Agent opens (it needs nothing else of the store) and what the Starter reads."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.embedded.store import open_sqlite_documents

        container = settings.get("CircuitBreakerContainerName", source) or "circuitBreakers"
        return open_sqlite_documents(path, container, source)
    from orderflow.azure.cosmos import cosmos_breaker_documents

    client, credential, names = _cosmos(endpoint, source)
    return cosmos_breaker_documents(client, names, credential)


def open_recovery_index(env: Mapping[str, str] | None = None) -> RecoveryIndex:
    """The recovery index (`RecoveryIndexContainerName`), as configured by `CosmosDb__accountEndpoint`."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    bucket_seconds = settings.get_int("RecoveryIndexBucketSeconds", source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.embedded.store import open_sqlite_recovery_index

        return open_sqlite_recovery_index(path, bucket_seconds, source)
    from orderflow.azure.cosmos import cosmos_recovery_index

    client, credential, names = _cosmos(endpoint, source)
    return cosmos_recovery_index(client, names, bucket_seconds, credential)


# -- Service Bus ----------------------------------------------------------------------------------------------------


def bus_from_connection_string(conn_str: str, **kwargs: Any) -> Any:
    """The embedded client for `Endpoint=embedded://...`, else the azure-servicebus client."""
    if is_embedded_connection(conn_str):
        from orderflow.embedded.client import ServiceBusClient as Embedded

        return Embedded.from_connection_string(conn_str, **kwargs)
    from orderflow.azure.servicebus import client_from_connection_string

    return client_from_connection_string(conn_str, **kwargs)


def aio_bus_from_connection_string(conn_str: str, **kwargs: Any) -> BusClient:
    """The embedded aio client for `Endpoint=embedded://...`, else the azure-servicebus aio client."""
    if is_embedded_connection(conn_str):
        from orderflow.embedded.client_aio import ServiceBusClient as EmbeddedAio

        return EmbeddedAio.from_connection_string(conn_str, **kwargs)
    from orderflow.azure.servicebus import aio_client_from_connection_string

    return aio_client_from_connection_string(conn_str, **kwargs)


def bus_from_settings(env: Mapping[str, str] | None = None, connection: str = SERVICE_BUS_CONNECTION) -> Any:
    """A client for the binding connection `connection`: identity-based namespace first, then a string."""
    source = os.environ if env is None else env
    if namespace := source.get(f"{connection}__fullyQualifiedNamespace"):
        from orderflow.azure.servicebus import client_for_namespace

        return client_for_namespace(namespace)
    return bus_from_connection_string(connection_string_from_settings(source, connection))


def aio_bus_from_settings(env: Mapping[str, str] | None = None, connection: str = SERVICE_BUS_CONNECTION) -> BusClient:
    """As `bus_from_settings`, with the aio clients and `azure.identity.aio.DefaultAzureCredential`."""
    source = os.environ if env is None else env
    if namespace := source.get(f"{connection}__fullyQualifiedNamespace"):
        from orderflow.azure.servicebus import aio_client_for_namespace

        return aio_client_for_namespace(namespace)
    return aio_bus_from_connection_string(connection_string_from_settings(source, connection))


def connection_string_from_settings(source: Mapping[str, str], connection: str = SERVICE_BUS_CONNECTION) -> str:
    """The connection string setting, or a KeyError that says which settings are missing."""
    value = source.get(connection)
    if not value:
        raise KeyError(
            f"no Service Bus connection: set {connection}__fullyQualifiedNamespace (Azure, identity) or "
            f"{connection} (a connection string, e.g. "
            "Endpoint=embedded://.devhost/servicebus.db;ConfigFile=servicebus.config.json)"
        )
    return value
