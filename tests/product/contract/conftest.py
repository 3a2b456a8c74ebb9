"""Contract-test fixtures: store backends (embedded SQLite; azure-cosmos against a Cosmos protocol server).

The Cosmos backend talks to `@vercel/cosmosdb-server` (node_modules, `make setup`) through the harness's wrapper
`tests/support/cosmosdb_server.js`, started once per session (`tests/support/cosmos_server.py`). The wrapper
answers a point read of a missing document with 404 as Cosmos DB does, where the package itself answers 500: the
quirk is fixed in the harness, not in the product. It also gives tests a fault hook and a request log.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.cosmos_server import CosmosServer, missing_prerequisite, run_cosmos_server
from support.store_backends import Backend, CosmosUnderTest

from orderflow.adapters import Stores
from orderflow.azure.cosmos import CosmosNames, CosmosStateStore, open_cosmos_with_key
from orderflow.embedded.store import open_sqlite_stores

ANY_KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"  # the protocol server accepts any key


@pytest.fixture(scope="session")
def cosmos_server() -> Iterator[CosmosServer]:
    problem = missing_prerequisite()
    if problem is not None:
        pytest.fail(problem)
    with run_cosmos_server() as server:
        yield server


@pytest.fixture(scope="session")
def cosmos_endpoint(cosmos_server: CosmosServer) -> str:
    return cosmos_server.endpoint


def fresh_cosmos_names() -> CosmosNames:
    tag = uuid.uuid4().hex[:12]
    return CosmosNames(f"orders-{tag}", "orders", f"state-{tag}", "orderState", "supervisorCheckpoints")


def _sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "store.db"

    async def open_() -> Stores:
        return Stores(*open_sqlite_stores(path))

    return Backend("sqlite", open_, open_, charges_request_units=False)


def _cosmos_backend(endpoint: str) -> Backend:
    names = fresh_cosmos_names()

    async def open_() -> Stores:
        return Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names))

    async def open_peer() -> Stores:
        return Stores(*await open_cosmos_with_key(endpoint, ANY_KEY, names, create_containers=False))

    return Backend("cosmos", open_, open_peer, charges_request_units=True)


@pytest.fixture(params=["sqlite", pytest.param("cosmos", marks=pytest.mark.cosmos)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return _sqlite_backend(tmp_path)
    return _cosmos_backend(request.getfixturevalue("cosmos_endpoint"))


@pytest.fixture
async def stores(backend: Backend) -> AsyncIterator[Stores]:
    opened = await backend.open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def peer(backend: Backend, stores: Stores) -> AsyncIterator[Stores]:
    """A second, independent connection to the same store as `stores`."""
    opened = await backend.open_peer()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def cosmos_state(cosmos_endpoint: str) -> AsyncIterator[CosmosStateStore]:
    """The Cosmos state-store adapter alone, for checks of the protocol server itself."""
    _, state = await open_cosmos_with_key(cosmos_endpoint, ANY_KEY, fresh_cosmos_names())
    try:
        yield state
    finally:
        await state.aclose()


@pytest.fixture
async def cosmos(cosmos_server: CosmosServer) -> AsyncIterator[CosmosUnderTest]:
    names = fresh_cosmos_names()
    opened = Stores(*await open_cosmos_with_key(cosmos_server.endpoint, ANY_KEY, names))
    try:
        yield CosmosUnderTest(cosmos_server, names, opened)
    finally:
        await opened.aclose()
