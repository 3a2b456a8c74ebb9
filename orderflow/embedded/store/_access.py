"""Who an embedded store acts as (its endpoint's `identity=` option) and the refusal of an operation outside the
identity's Cosmos DB data-plane roles in infra/: the 403 (substatus 5301) Cosmos DB answers, raised as azure-cosmos
raises it and translated as the Cosmos adapter translates it. Sources: docs/modules-product.md, section
orderflow/embedded/store/_access.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orderflow import settings
from orderflow.embedded.rights import load_rights

IDENTITY_OPTION = "identity"
# The data actions of the Cosmos adapter's calls (orderflow/azure/cosmos.py, _cosmos_io.py): read_item, create_item,
# replace_item, upsert_item, delete_item, query_items (https://learn.microsoft.com/azure/cosmos-db/nosql/security/
# reference-data-plane-actions).
READ, CREATE, REPLACE, UPSERT, DELETE = (
    f"sqlDatabases/containers/items/{a}" for a in ("read", "create", "replace", "upsert", "delete")
)
QUERY = "sqlDatabases/containers/executeQuery"
METADATA = "readMetadata"  # every SDK client reads the account's metadata first
# Each table of the store file and the settings naming its database and container (documents: the collection).
_TABLES: dict[str, tuple[str, str | None]] = {
    "orders": ("OrdersDatabaseName", "OrdersContainerName"),
    "order_state": ("StateDatabaseName", "StateContainerName"),
    "checkpoints": ("StateDatabaseName", "CheckpointContainerName"),
    "recovery_index": ("StateDatabaseName", "RecoveryIndexContainerName"),
    "documents": ("StateDatabaseName", None),
}
SUBSTATUS_RBAC = 5301  # "the principal has no role assignment that allows the action"


def split_identity(path: str) -> tuple[str, str | None]:
    """`PATH?identity=NAME&...` → (`PATH?...` without it, NAME); the identity is None when the path names none."""
    file, sep, query = path.partition("?")
    options = [o for o in query.split("&") if o]
    identity = next((o.partition("=")[2] for o in options if o.partition("=")[0] == IDENTITY_OPTION), None)
    rest = [o for o in options if o.partition("=")[0] != IDENTITY_OPTION]
    return file + ("?" + "&".join(rest) if rest else ""), identity or None


@dataclass
class StoreAccess:
    """The identity a store acts as, its container names (the app settings: `env`, default the environment) and
    the infra folder its rights are read from (None: infra/)."""

    identity: str
    env: Mapping[str, str] | None = None
    infra: Path | None = None

    def path(self, table: str, collection: str | None = None) -> str:
        database, container = _TABLES[table]
        name = settings.get(container, self.env) if container else collection
        return f"/dbs/{settings.get(database, self.env)}/colls/{name}"

    def check(self, table: str, action: str, collection: str | None = None) -> None:
        """Raise what the Cosmos adapter raises when the identity may not perform `action` on the table's
        container. First the metadata the SDK reads before it (readMetadata, granted with the container in scope:
        the Agent's custom role is scoped to its container alone); an identity without any Cosmos DB role fails
        that read on the account itself (resource [/]), as Cosmos DB answers."""
        rights = load_rights(self.infra)
        path = self.path(table, collection)
        if not rights.store_allows(self.identity, METADATA, path):
            cosmos = any(g.service == "cosmos" for g in rights.of(self.identity))
            raise forbidden(self.identity, METADATA, path if cosmos else "/")
        if not rights.store_allows(self.identity, action, path):
            raise forbidden(self.identity, action, path)


class _Response:
    """What azure-core and azure-cosmos read of a failed response (status, reason, headers, body)."""

    def __init__(self, body: dict[str, Any], activity_id: str) -> None:
        self.status_code, self.reason = 403, "Forbidden"
        self.headers = {"x-ms-substatus": str(SUBSTATUS_RBAC), "x-ms-activity-id": activity_id}
        self._body = json.dumps(body)

    def text(self, encoding: str | None = None) -> str:
        return self._body


def forbidden(identity: str, action: str, path: str) -> Exception:
    """Cosmos DB's 403 for a missing data-plane role, as azure-cosmos raises it (CosmosHttpResponseError with the
    response body as message, sub_status 5301: aio/_asynchronous_request.py), translated by the Cosmos adapter
    (`_cosmos_io.translate`: a StoreError with status_code 403) with the SDK's error as its cause."""
    from azure.cosmos.exceptions import CosmosHttpResponseError

    from orderflow.azure._cosmos_io import translate

    activity = str(uuid.uuid4())
    message = (
        f"Request blocked by Auth embedded : Request is blocked because principal [{identity}] does not have "
        f"required RBAC permissions to perform action [Microsoft.DocumentDB/databaseAccounts/{action}] on resource "
        f"[{path}]. Learn more: https://aka.ms/cosmos-native-rbac.\r\nActivityId: {activity}, "
        "Microsoft.Azure.Documents.Common/2.14.0"
    )
    response = _Response({"code": "Forbidden", "message": message}, activity)
    error = CosmosHttpResponseError(message=response.text(), response=response)  # type: ignore[no-untyped-call]
    translated = translate(error)
    translated.__cause__ = error
    return translated
