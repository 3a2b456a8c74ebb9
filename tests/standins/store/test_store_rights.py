"""Rights on the embedded store (orderflow/embedded/store/_access.py, the roles of infra/): an identity may do in
each container exactly what its Cosmos DB data-plane roles allow, and anything else is refused as Cosmos DB refuses
it, as the Cosmos adapter hands it to its callers.

What Cosmos DB and azure-cosmos do:
- a request outside the principal's role assignments answers 403, substatus 5301, body message "Request blocked by
  Auth <account> : Request is blocked because principal [<id>] does not have required RBAC permissions to perform
  action [<data action>] on resource [<resource>]. Learn more: https://aka.ms/cosmos-native-rbac." (reported in
  Azure/azure-cosmos-dotnet-v3#2891 and #3110: a principal without a role fails the first metadata read,
  `readMetadata` on resource [/]);
- azure-cosmos raises it as CosmosHttpResponseError(message=<body>, response=<response>) (aio/_asynchronous_request.py),
  its `sub_status` read from the x-ms-substatus header (exceptions.py `CosmosHttpResponseError.__init__`);
- the Cosmos adapter translates it (orderflow/azure/_cosmos_io.py `translate`): a StoreError with that status code,
  not transient.
The data actions are Azure's (learn.microsoft.com/azure/cosmos-db/nosql/security/reference-data-plane-actions); the
Agent's custom role (infra/app/rbac.bicep circuitBreakerDataActions): read, create, replace on its container only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from azure.cosmos.exceptions import CosmosHttpResponseError

from orderflow.embedded.rights import AGENT, FUNCTION_APP, OPERATORS
from orderflow.embedded.store import open_sqlite_documents, open_sqlite_file, open_sqlite_stores
from orderflow.embedded.store._access import DELETE, UPSERT
from orderflow.errors import StoreError, is_transient
from orderflow.messages import SubmitOrder
from orderflow.records import OrderRecord

NOW = datetime(2025, 1, 1, tzinfo=UTC)
BREAKERS = "circuitBreakers"  # CircuitBreakerContainerName's default, the container of the Agent's custom role
ENV = {"OrdersDatabaseName": "orders", "StateDatabaseName": "state"}


def _order(order_id: str) -> OrderRecord:
    submit = SubmitOrder.model_validate(
        {
            "orderId": order_id,
            "replyTo": "app-status",
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": Decimal("9.99")}],
            "currency": "EUR",
            "submittedAt": NOW,
        }
    )
    return OrderRecord.from_order(submit, NOW)


def _forbidden(error: pytest.ExceptionInfo[StoreError], action: str, resource: str) -> None:
    exc = error.value
    assert exc.status_code == 403 and not is_transient(exc)  # type: ignore[attr-defined]
    cause = exc.__cause__
    assert isinstance(cause, CosmosHttpResponseError) and cause.status_code == 403 and cause.sub_status == 5301
    expected = (
        "(Forbidden) Request blocked by Auth embedded : Request is blocked because principal [{who}] does not have "
        f"required RBAC permissions to perform action [Microsoft.DocumentDB/databaseAccounts/{action}] on resource "
        f"[{resource}]. Learn more: https://aka.ms/cosmos-native-rbac."
    )
    who = exc.args[0].split("principal [", 1)[1].split("]", 1)[0]
    assert str(exc).startswith(expected.format(who=who)), str(exc)


async def test_the_agent_reads_creates_and_replaces_its_breaker_documents_and_nothing_else(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store.db'}?identity={AGENT}"
    breakers = open_sqlite_documents(store, BREAKERS, ENV)
    etag = await breakers.put("fulfilment", {"state": "closed"}, None)
    await breakers.put("fulfilment", {"state": "open"}, etag)
    assert (await breakers.get("fulfilment") or ({}, ""))[0] == {"state": "open"}
    # Upsert and delete are left out of its role on purpose (rbac.bicep: no delete, upsert, query, change feed).
    db = open_sqlite_file(store, ENV)
    for action in (UPSERT, DELETE):
        with pytest.raises(StoreError) as refused:
            db.authorize("documents", action, BREAKERS)
        _forbidden(refused, action, f"/dbs/state/colls/{BREAKERS}")
    # Another container: the metadata read the SDK starts with is already refused there.
    with pytest.raises(StoreError) as refused:
        await open_sqlite_documents(store, "somethingElse", ENV).get("fulfilment")
    _forbidden(refused, "readMetadata", "/dbs/state/colls/somethingElse")
    orders, state = open_sqlite_stores(store, ENV)
    with pytest.raises(StoreError) as refused:
        await state.get("o-1")
    _forbidden(refused, "readMetadata", "/dbs/state/colls/orderState")
    for closing in (breakers, orders, state):
        await closing.aclose()
    await db.aclose()


async def test_the_function_app_uses_both_databases_and_the_operators_only_read_the_orders(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    orders, _ = open_sqlite_stores(f"{path}?identity={FUNCTION_APP}", ENV)
    created, new = await orders.create_if_absent(_order("o-1"))
    assert new and (await orders.get("o-1")) == created
    operators, _ = open_sqlite_stores(f"{path}?identity={OPERATORS}", ENV)
    assert await operators.get("o-1") == created  # Cosmos DB Built-in Data Reader on the orders database
    with pytest.raises(StoreError) as refused:
        await operators.create_if_absent(_order("o-2"))
    _forbidden(refused, "sqlDatabases/containers/items/create", "/dbs/orders/colls/orders")
    await orders.aclose()
    await operators.aclose()


async def test_an_identity_without_any_cosmos_role_fails_the_accounts_metadata_read(tmp_path: Path) -> None:
    # The submitting application has no Cosmos DB role: Cosmos DB refuses its first request on the account itself.
    _, state = open_sqlite_stores(f"{tmp_path / 'store.db'}?identity=app", ENV)
    with pytest.raises(StoreError) as refused:
        await state.get("o-1")
    _forbidden(refused, "readMetadata", "/")
    await state.aclose()


async def test_a_store_without_an_identity_is_the_owners(tmp_path: Path) -> None:
    orders, _ = open_sqlite_stores(tmp_path / "store.db")  # what the lab's own checks read with
    assert (await orders.create_if_absent(_order("o-1")))[1]
    await orders.aclose()
