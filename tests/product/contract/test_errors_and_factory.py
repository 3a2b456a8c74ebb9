"""Error taxonomy (transient vs permanent, picklable), the store's and the bus's, and the `open_stores` factory."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError
from azure.cosmos.exceptions import CosmosHttpResponseError
from azure.servicebus import exceptions as bus_exceptions
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from support.bus_scenarios import put_token_refused

from orderflow import errors as orderflow_errors
from orderflow.adapters import open_stores
from orderflow.azure.cosmos import CosmosOrdersDb, CosmosStateStore, translate
from orderflow.embedded.store import SqliteOrdersDb, SqliteStateStore
from orderflow.errors import (
    BUS_LOCK_ERRORS,
    BUS_TRANSIENT,
    Conflict,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
    is_missing_entity,
    is_transient,
)
from orderflow.ports import OrdersDb, StateStore


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
def test_cosmos_errors_translate_to_the_taxonomy(status: int, kind: type[StoreError], transient: bool) -> None:
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


# ---- azure-servicebus errors: the SDK's own classes, classified as the SDK itself retries them --------------------


def _bus_error_classes() -> list[type[ServiceBusError]]:
    return [c for c in vars(bus_exceptions).values() if isinstance(c, type) and issubclass(c, ServiceBusError)]


def _raise_bus_error(cls: type[ServiceBusError]) -> ServiceBusError:
    """An instance of `cls`, raised and caught as a caller catches it."""
    try:
        raise cls(message=f"{cls.__name__} from the test")
    except ServiceBusError as exc:
        return exc


@pytest.mark.parametrize("cls", _bus_error_classes(), ids=lambda c: c.__name__)
def test_bus_errors_are_transient_exactly_when_the_sdk_retries_them(cls: type[ServiceBusError]) -> None:
    """azure-servicebus constructs each error class with `retryable=` (azure/servicebus/exceptions.py), the flag its
    retry policy honours (_pyamqp client `_do_retryable_operation`). Transient: every retryable class but the session
    lock error (never "the same operation again"); the SDK's non-retryable ones (lock lost, size, quota, not found)
    are permanent."""
    error = _raise_bus_error(cls)
    expected = error._retryable and cls not in BUS_LOCK_ERRORS
    assert is_transient(error) is expected
    assert (cls in BUS_TRANSIENT) is expected  # the classifier's list is the SDK's, nothing hand-picked beside it


@pytest.mark.parametrize(
    "cls",
    [ServiceBusConnectionError, OperationTimeoutError, ServiceBusServerBusyError, ServiceBusCommunicationError],
    ids=lambda c: c.__name__,
)
def test_bus_outages_and_throttling_are_transient(cls: type[ServiceBusError]) -> None:
    assert is_transient(_raise_bus_error(cls))


@pytest.mark.parametrize(
    "cls",
    [MessageLockLostError, SessionLockLostError, SessionCannotBeLockedError, MessageSizeExceededError],
    ids=lambda c: c.__name__,
)
def test_lock_and_size_errors_are_permanent(cls: type[ServiceBusError]) -> None:
    assert not is_transient(_raise_bus_error(cls))


def test_a_missing_queue_is_permanent_as_the_real_sdk_raises_it() -> None:
    """On Service Bus (and the local AMQP endpoint) a link to a queue that does not exist has its put-token answered
    404, which the pyamqp SDK raises as ServiceBusAuthenticationError, retryable (azure-sdk-for-python
    tests/test_sessions.py test_session_connection_failure_is_idempotent; tests/support/bus_scenarios.py
    entity_not_found): no retry finds the queue, so the product gives up at once, as for
    MessagingEntityNotFoundError."""
    error = put_token_refused(404)
    assert isinstance(error, ServiceBusAuthenticationError) and error._retryable  # the SDK's own view
    assert is_missing_entity(error) and not is_transient(error)
    not_found = _raise_bus_error(MessagingEntityNotFoundError)
    assert is_missing_entity(not_found) and not is_transient(not_found)


def test_an_authentication_failure_that_is_not_a_404_stays_transient() -> None:
    # A token refused (401) while a role assignment propagates: retrying lets it (BUS_TRANSIENT).
    error = put_token_refused(401)
    assert isinstance(error, ServiceBusAuthenticationError) and not is_missing_entity(error) and is_transient(error)


def test_the_store_reexports_the_one_classifier() -> None:
    assert is_transient is orderflow_errors.is_transient and issubclass(StoreError, orderflow_errors.Failure)
