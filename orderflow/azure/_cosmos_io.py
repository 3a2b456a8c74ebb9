"""The Cosmos DB plumbing under `orderflow.azure.cosmos`: the container names from app settings (`CosmosNames`),
the shared client (`CosmosConnection`), SDK errors mapped to the store taxonomy (`translate`), the request-charge
meter, and the point reads and writes every port uses (`read_doc`: None for a missing item, 404)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from azure.core import MatchConditions
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosHttpResponseError, CosmosResourceNotFoundError

from orderflow import settings
from orderflow.errors import (
    Conflict,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    is_transient_status,
)

REQUEST_CHARGE_HEADER = "x-ms-request-charge"


@dataclass(frozen=True)
class CosmosNames:
    orders_database: str
    orders_container: str
    state_database: str
    state_container: str
    checkpoint_container: str
    breaker_container: str = "circuitBreakers"
    recovery_index_container: str = "recoveryIndex"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CosmosNames:
        def name(setting: str) -> str:
            value = settings.get(setting, env)
            assert value is not None  # every name setting has a default
            return value

        return cls(
            name("OrdersDatabaseName"),
            name("OrdersContainerName"),
            name("StateDatabaseName"),
            name("StateContainerName"),
            name("CheckpointContainerName"),
            name("CircuitBreakerContainerName"),
            name("RecoveryIndexContainerName"),
        )


def translate(exc: CosmosHttpResponseError) -> StoreError:
    """Map an SDK error to the store taxonomy (the SDK's own 429 retries have already run)."""
    status = exc.status_code
    message = str(exc.message or exc)
    if status == 404:
        return NotFound(message)
    if status == 409:
        return Conflict(message)
    if status == 412:
        return PreconditionFailed(message)
    if is_transient_status(status):
        return TransientStoreError(message, status)
    error = StoreError(message)
    error.status_code = status
    return error


class ChargeMeter:
    """A response hook that sums `x-ms-request-charge` over every request of one operation."""

    def __init__(self) -> None:
        self.total = 0.0

    def clear(self) -> None:  # the SDK calls clear() when a query starts
        self.total = 0.0

    def __call__(self, headers: Mapping[str, Any], _result: Any) -> None:
        try:
            self.total += float(headers.get(REQUEST_CHARGE_HEADER) or 0.0)
        except (TypeError, ValueError):
            pass


async def read_doc(container: ContainerProxy, item_id: str, partition: str) -> dict[str, Any] | None:
    """Point read; None when the item is missing (404). Every other error propagates, translated."""
    try:
        return dict(await container.read_item(item_id, partition_key=partition))
    except CosmosResourceNotFoundError:
        return None
    except CosmosHttpResponseError as exc:
        raise translate(exc) from exc


async def create_or_read(container: ContainerProxy, doc: dict[str, Any], partition: str) -> tuple[dict[str, Any], bool]:
    """create_item; on 409 return the stored item instead (idempotent create)."""
    try:
        return dict(await container.create_item(doc)), True
    except CosmosHttpResponseError as exc:
        if exc.status_code != 409:
            raise translate(exc) from exc
    existing = await read_doc(container, doc["id"], partition)
    if existing is None:  # created and deleted in between: records are never deleted, so report it
        raise Conflict(f"item {doc['id']!r} conflicted on create but cannot be read")
    return existing, False


async def replace_if_match(container: ContainerProxy, doc: dict[str, Any], etag: str) -> str:
    try:
        stored = await container.replace_item(doc["id"], doc, etag=etag, match_condition=MatchConditions.IfNotModified)
    except CosmosHttpResponseError as exc:
        raise translate(exc) from exc
    return str(stored["_etag"])


async def get_data(container: ContainerProxy, name: str) -> tuple[dict[str, Any], str] | None:
    """The `data` of document {id: name, data} (partition key /id) and its etag, or None."""
    doc = await read_doc(container, name, name)
    return None if doc is None else (dict(doc["data"]), str(doc["_etag"]))


async def put_data(container: ContainerProxy, name: str, data: dict[str, Any], etag: str | None) -> str:
    """Create (etag None; Conflict when present) or If-Match replace of {id: name, data}; the new etag."""
    doc = {"id": name, "data": data}
    if etag is not None:
        return await replace_if_match(container, doc, etag)
    try:
        return str((await container.create_item(doc))["_etag"])
    except CosmosHttpResponseError as exc:
        raise translate(exc) from exc


class AsyncClosable(Protocol):
    async def close(self) -> None: ...


class CosmosConnection:
    """The shared CosmosClient of one app, closed once by whichever port closes first."""

    def __init__(self, client: CosmosClient, credential: AsyncClosable | None = None) -> None:
        self.client = client
        self._credential = credential
        self._closed = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.client.close()
            # aiohttp discards TLS transports without waiting for connection_lost (aio-libs/aiohttp#1925); one
            # loop iteration lets them close, so a caller that closes its loop right after does not leak them.
            await asyncio.sleep(0)
            if self._credential is not None:
                await self._credential.close()
