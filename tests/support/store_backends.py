"""The store backends the contract tests run against (tests/product/contract/conftest.py builds them): an adapter
under test, and the Cosmos adapters with the protocol server they talk to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from orderflow.adapters import Stores
from orderflow.azure.cosmos import CosmosNames
from support.cosmos_server import CosmosServer


@dataclass
class Backend:
    """One adapter under test. `open()` gives a fresh, isolated store; `open_peer()` a second, independent
    connection to the same data (another process, as far as the store is concerned)."""

    name: str
    open: Callable[[], Awaitable[Stores]]
    open_peer: Callable[[], Awaitable[Stores]]
    charges_request_units: bool


@dataclass
class CosmosUnderTest:
    """The Cosmos adapters on fresh databases, with the protocol server they talk to (its fault hook and log)."""

    server: CosmosServer
    names: CosmosNames
    stores: Stores

    def state_doc_path(self, order_id: str) -> str:
        """The REST path of a state record's point read (https://learn.microsoft.com/rest/api/cosmos-db/get-a-document)."""
        return f"/dbs/{self.names.state_database}/colls/{self.names.state_container}/docs/{order_id}"
