"""Store error taxonomy (transient vs permanent, picklable) and the `open_stores` adapter factory."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError
from azure.cosmos.exceptions import CosmosHttpResponseError

from orderflow.store import (
    Conflict,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    is_transient,
    open_stores,
)
from orderflow.store.cosmos_store import CosmosOrdersDb, CosmosStateStore, translate
from orderflow.store.ports import OrdersDb, StateStore
from orderflow.store.sqlite_store import SqliteOrdersDb, SqliteStateStore


def cosmos_error(status: int) -> CosmosHttpResponseError:
    return CosmosHttpResponseError(status_code=status, message=f"status {status}")


# 408 / 429 / 5xx are retryable (Cosmos DB HTTP status codes:
# https://learn.microsoft.com/rest/api/cosmos-db/http-status-codes-for-cosmosdb).
@pytest.mark.parametrize(
    "status, kind, transient",
    [
        (404, NotFound, False),
        (409, Conflict, False),
        (412, PreconditionFailed, False),
        (400, StoreError, False),
        (403, StoreError, False),
        (408, TransientStoreError, True),
        (429, TransientStoreError, True),
        (500, TransientStoreError, True),
        (503, TransientStoreError, True),
    ],
)
def test_cosmos_errors_translate_to_the_taxonomy(
    status: int, kind: type[StoreError], transient: bool
) -> None:
    error = translate(cosmos_error(status))
    assert type(error) is kind and error.status_code == status
    assert is_transient(error) is transient
    assert is_transient(cosmos_error(status)) is transient  # the raw SDK error classifies the same


@pytest.mark.parametrize(
    "exc, transient",
    [
        (ServiceRequestError("connection refused"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (HttpResponseError(message="x"), False),
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("no such table: x"), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient_classifies_other_errors(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


@pytest.mark.parametrize(
    "error", [NotFound("a"), Conflict("b"), PreconditionFailed("c"), TransientStoreError("d", 503)]
)
def test_store_errors_are_picklable(error: StoreError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), str(back), back.status_code, back.transient) == (
        type(error),
        str(error),
        error.status_code,
        error.transient,
    )


async def test_embedded_endpoint_opens_the_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.db"
    async with open_stores({"CosmosDb__accountEndpoint": f"embedded://{path}"}) as (orders, state):
        assert isinstance(orders, SqliteOrdersDb) and isinstance(state, SqliteStateStore)
        assert isinstance(orders, OrdersDb) and isinstance(state, StateStore)
        assert await state.get("nope") is None
    assert path.exists()


async def test_account_endpoint_opens_cosmos_with_managed_identity() -> None:
    env = {
        "CosmosDb__accountEndpoint": "https://acct.documents.azure.com:443/",
        "CosmosDb__clientId": "cid",
        "StateContainerName": "st",
    }
    stores = open_stores(env)  # builds clients only; no network call until the first request
    try:
        assert isinstance(stores.orders, CosmosOrdersDb) and isinstance(stores.state, CosmosStateStore)
        assert isinstance(stores.state, StateStore)
        assert stores.state._container.id == "st" and stores.state._checkpoints.id == "supervisorCheckpoints"
        credential = stores.state._connection._credential
        assert type(credential).__name__ == "DefaultAzureCredential"
    finally:
        await stores.aclose()


def test_missing_endpoint_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="CosmosDb__accountEndpoint"):
        open_stores({})
