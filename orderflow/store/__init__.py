"""Store factory: `open_stores(env)` picks the adapter of the orders DB and the state store from app settings.

`CosmosDb__accountEndpoint = embedded://<path>` → the embedded SQLite store at <path> (local runs, devhost).
Anything else is a Cosmos DB account endpoint, reached with Microsoft Entra ID only
(`DefaultAzureCredential(managed_identity_client_id=CosmosDb__clientId)`); no account keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from orderflow import settings
from orderflow.store.errors import (
    Conflict,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    is_transient,
)
from orderflow.store.ports import DocumentStore, IndexEntry, OrdersDb, Page, RecoveryIndex, StateStore, Versioned

if TYPE_CHECKING:
    from azure.cosmos.aio import CosmosClient
    from azure.identity.aio import DefaultAzureCredential

    from orderflow.store.cosmos_store import CosmosNames

EMBEDDED_SCHEME = "embedded://"

__all__ = [
    "Conflict",
    "DocumentStore",
    "IndexEntry",
    "RecoveryIndex",
    "EMBEDDED_SCHEME",
    "NotFound",
    "OrdersDb",
    "Page",
    "PreconditionFailed",
    "StateStore",
    "StoreError",
    "Stores",
    "TransientStoreError",
    "Versioned",
    "is_transient",
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
    return endpoint[len(EMBEDDED_SCHEME):] if endpoint.startswith(EMBEDDED_SCHEME) else None


def _cosmos(endpoint: str, source: Mapping[str, str]) -> tuple[CosmosClient, DefaultAzureCredential, CosmosNames]:
    """A Cosmos DB client on the app's identity (DefaultAzureCredential, `CosmosDb__clientId` for a user-assigned
    one), its credential (closed with the adapter) and the configured names."""
    from azure.cosmos.aio import CosmosClient
    from azure.identity.aio import DefaultAzureCredential

    from orderflow.store.cosmos_store import CosmosNames

    credential = DefaultAzureCredential(managed_identity_client_id=settings.get("CosmosDb__clientId", source))
    return CosmosClient(endpoint, credential=credential), credential, CosmosNames.from_env(source)


def open_stores(env: Mapping[str, str] | None = None) -> Stores:
    """Open both ports as configured by `CosmosDb__accountEndpoint` (see the module docstring)."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.store.sqlite_store import open_sqlite_stores

        return Stores(*open_sqlite_stores(path))
    from orderflow.store.cosmos_store import cosmos_stores

    client, credential, names = _cosmos(endpoint, source)
    return Stores(*cosmos_stores(client, names, credential))


def open_breaker_documents(env: Mapping[str, str] | None = None) -> DocumentStore:
    """The circuit-breaker documents (`CircuitBreakerContainerName`), as configured by `CosmosDb__accountEndpoint`:
    what the Agent opens (it needs nothing else of the store) and what the Starter reads."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.store.sqlite_store import open_sqlite_documents

        return open_sqlite_documents(path, settings.get("CircuitBreakerContainerName", source) or "circuitBreakers")
    from orderflow.store.cosmos_store import cosmos_breaker_documents

    client, credential, names = _cosmos(endpoint, source)
    return cosmos_breaker_documents(client, names, credential)


def open_recovery_index(env: Mapping[str, str] | None = None) -> RecoveryIndex:
    """The recovery index (`RecoveryIndexContainerName`), as configured by `CosmosDb__accountEndpoint`."""
    source = os.environ if env is None else env
    endpoint = _endpoint(source)
    bucket_seconds = settings.get_int("RecoveryIndexBucketSeconds", source)
    if (path := _embedded_path(endpoint)) is not None:
        from orderflow.store.sqlite_store import open_sqlite_recovery_index

        return open_sqlite_recovery_index(path, bucket_seconds)
    from orderflow.store.cosmos_store import cosmos_recovery_index

    client, credential, names = _cosmos(endpoint, source)
    return cosmos_recovery_index(client, names, bucket_seconds, credential)
