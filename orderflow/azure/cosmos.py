"""Azure Cosmos DB adapter (azure-cosmos async client) of the orders DB and the state store.

Containers (names from app settings): orders `/orderId`, state `/orderId`, checkpoints `/id`; Bicep creates them in
Azure, `ensure_containers` for tests. The state container needs `STATE_INDEXING_POLICY`'s composite indexes for the
multi-field ORDER BY queries. A point read's 404 is None (https://learn.microsoft.com/rest/api/cosmos-db/
get-a-document); any other error propagates, a 5xx or 408 as TransientStoreError after azure-cosmos's own retries.
The point reads and writes, `translate`, `ChargeMeter`, `CosmosNames` and `CosmosConnection` live in `_cosmos_io.py`;
this module re-exports `CosmosNames` and `translate`. Notes: docs/modules-product.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosHttpResponseError, CosmosResourceNotFoundError

from orderflow.apps import SCOPE, KeyFilter
from orderflow.azure._cosmos_io import (
    AsyncClosable,
    ChargeMeter,
    CosmosConnection,
    create_or_read,
    get_data,
    put_data,
    read_doc,
    replace_if_match,
)
from orderflow.azure._cosmos_io import CosmosNames as CosmosNames  # re-exported: callers name it through this module
from orderflow.azure._cosmos_io import translate as translate  # re-exported, as CosmosNames
from orderflow.errors import NotFound, PreconditionFailed
from orderflow.ports import (
    ExpiredCursor,
    IndexEntry,
    KeysetCursor,
    Page,
    UpdateWithRetry,
    Versioned,
    bucket_of,
    next_cursor,
)
from orderflow.records import (
    CLAIMABLE_STATES,
    SUPERVISED_STATES,
    TERMINAL_STATES,
    TTL_NEVER,
    OrderRecord,
    OrderStateRecord,
    ProcessState,
    format_utc,
    parse_utc,
)

ORDER_PARTITION_PATH = "/orderId"
CHECKPOINT_PARTITION_PATH = "/id"
INDEX_PARTITION_PATH = "/bucket"
# The recovery index's single-partition ORDER BY on two fields needs a composite index.
INDEX_INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [{"path": "/*"}],
    "excludedPaths": [{"path": '/"_etag"/?'}],
    "compositeIndexes": [[{"path": "/completeBy", "order": "ascending"}, {"path": "/orderId", "order": "ascending"}]],
}
_INDEX_PAGE_SQL = (
    "SELECT TOP @n * FROM c WHERE c.completeBy >= @start AND c.completeBy < @end"
    " AND (c.completeBy > @afterCompleteBy OR (c.completeBy = @afterCompleteBy AND c.orderId > @afterId))"
    " ORDER BY c.completeBy ASC, c.orderId ASC"
)
_INDEX_FIRST_SQL = (
    "SELECT TOP 1 c.completeBy FROM c WHERE c.completeBy >= @start AND c.completeBy < @end ORDER BY c.completeBy ASC"
)

# Composite indexes for the multi-field ORDER BY queries: query_claimable, query_expired, query_in_state (and
# oldest_in_state). A query whose ORDER BY names two or more properties fails without a composite index on exactly
# those paths in that order ("Queries that have an ORDER BY clause with two or more properties require a composite
# index", https://learn.microsoft.com/azure/cosmos-db/index-policy#composite-indexes).
STATE_INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [{"path": "/*"}],
    "excludedPaths": [{"path": '/"_etag"/?'}],
    "compositeIndexes": [
        [{"path": "/retryAt", "order": "ascending"}, {"path": "/createdAt", "order": "ascending"}],
        [{"path": "/completeBy", "order": "ascending"}, {"path": "/id", "order": "ascending"}],
        [
            {"path": "/processState", "order": "ascending"},
            {"path": "/updatedAt", "order": "ascending"},
            {"path": "/id", "order": "ascending"},
        ],
    ],
}


def _in_states(name: str, states: tuple[ProcessState, ...]) -> tuple[str, list[dict[str, object]]]:
    """`(c.processState = @name0 OR ...)` and its parameters (an OR of equalities: what every Cosmos query engine,
    the emulators included, evaluates with the index)."""
    params: list[dict[str, object]] = [{"name": f"@{name}{i}", "value": s.value} for i, s in enumerate(states)]
    return "(" + " OR ".join(f"c.processState = {p['name']}" for p in params) + ")", params


def _of_app(keys: KeyFilter | None) -> tuple[str, list[dict[str, object]]]:
    """` AND <one app's ids>` and its parameters; nothing for None (every app). A scoped filter is a prefix of the
    id, `STARTSWITH(c.id, @prefix)` (case-sensitive by default, and served by the range index on /id:
    https://learn.microsoft.com/azure/cosmos-db/nosql/query/startswith); the unscoped one (the legacy app's bare
    orderIds) is every id without the scope separator, `NOT CONTAINS(c.id, ".")`
    (https://learn.microsoft.com/azure/cosmos-db/nosql/query/contains)."""
    if keys is None:
        return "", []
    prefix = keys.prefix()
    if prefix is None:
        return " AND NOT CONTAINS(c.id, @scopeSep)", [{"name": "@scopeSep", "value": SCOPE}]
    return " AND STARTSWITH(c.id, @keyPrefix)", [{"name": "@keyPrefix", "value": prefix}]


def _claimable_sql(states: tuple[ProcessState, ...], keys: KeyFilter | None) -> tuple[str, list[dict[str, object]]]:
    where, params = _in_states("claimable", states)
    of_app, app_params = _of_app(keys)
    return (
        f"SELECT TOP @limit * FROM c WHERE {where} AND IS_NULL(c.lockedBy)"
        f" AND (IS_NULL(c.retryAt) OR c.retryAt <= @now){of_app} ORDER BY c.retryAt ASC, c.createdAt ASC"
    ), [*params, *app_params]


_TERMINAL_IN, _TERMINAL_PARAMS = _in_states("terminal", TERMINAL_STATES)
_UNNOTIFIED_SQL = (
    f"SELECT TOP @limit * FROM c WHERE {_TERMINAL_IN}"
    " AND (NOT IS_DEFINED(c.notifiedAt) OR IS_NULL(c.notifiedAt)) AND c.updatedAt < @before"
)
_SUPERVISED_IN, _SUPERVISED_PARAMS = _in_states("supervised", SUPERVISED_STATES)
# Keyset paging, not SDK continuation tokens: azure-cosmos does not resume cross-partition ORDER BY queries
# from a token (Azure/azure-sdk-for-python#41434 "Invalid Continuation Token", #37230 "Incorrect
# continuationToken returned from orderBy query"; #13953 documents tokens as single-partition only).
# One query per page (TOP n+1), drained by the SDK across partitions; needs the (completeBy, id) composite
# index.
_EXPIRED_SQL = (
    f"SELECT TOP @n * FROM c WHERE {_SUPERVISED_IN}"
    " AND c.completeBy >= @start AND c.completeBy < @end"
    " AND (c.completeBy > @afterCompleteBy OR (c.completeBy = @afterCompleteBy AND c.id > @afterId))"
    " ORDER BY c.completeBy ASC, c.id ASC"
)
_EXPIRED_COUNT_SQL = f"SELECT VALUE COUNT(1) FROM c WHERE {_SUPERVISED_IN} AND c.completeBy < @now"


def _in_state_sql(after: bool, before: bool, of_app: str = "") -> str:
    """The operator's list: one state, ordered by (updatedAt, id), keyset-paged like `_EXPIRED_SQL`.

    ORDER BY starts with processState, which the equality filter fixes, so the order is (updatedAt, id) all the
    same, but the query can use the composite index (processState, updatedAt, id) for filter and order at once: a
    seek to the state's first entry, where ORDER BY c.updatedAt, c.id alone would walk every state's records in
    updatedAt order ("Queries with a filter and ORDER BY": add the filtered properties to the ORDER BY, in the
    composite index's order, https://learn.microsoft.com/azure/cosmos-db/index-policy#composite-indexes). The plain
    `>=` bounds that seek; the OR alone does not."""
    where = ["c.processState = @state"]
    if after:
        where += ["c.updatedAt >= @afterAt", "(c.updatedAt > @afterAt OR (c.updatedAt = @afterAt AND c.id > @afterId))"]
    if before:
        where.append("c.updatedAt < @before")
    return (
        f"SELECT TOP @n * FROM c WHERE {' AND '.join(where)}{of_app}"
        " ORDER BY c.processState ASC, c.updatedAt ASC, c.id ASC"
    )


def _strip(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if not k.startswith("_")}


class CosmosOrdersDb:
    def __init__(self, connection: CosmosConnection, container: ContainerProxy) -> None:
        self._connection = connection
        self._container = container

    async def create_if_absent(self, record: OrderRecord) -> tuple[OrderRecord, bool]:
        doc, created = await create_or_read(self._container, record.to_doc(), record.order_id)
        return OrderRecord.from_doc(doc), created

    async def get(self, order_id: str) -> OrderRecord | None:
        doc = await read_doc(self._container, order_id, order_id)
        return None if doc is None else OrderRecord.from_doc(doc)

    async def set_ttl(self, order_id: str, ttl: int) -> None:
        # A point read and an If-Match replace (items/read, items/replace: the rights infra/app/rbac.bicep grants);
        # a concurrent writer is retried once, then PreconditionFailed propagates.
        for attempt in range(2):
            doc = await read_doc(self._container, order_id, order_id)
            if doc is None:
                raise NotFound(f"order {order_id!r} does not exist")
            if doc.get("ttl") == TTL_NEVER:
                return  # kept: stays kept
            try:
                await replace_if_match(self._container, {**_strip(doc), "ttl": ttl}, str(doc["_etag"]))
                return
            except PreconditionFailed:
                if attempt:
                    raise

    async def aclose(self) -> None:
        await self._connection.aclose()


def _versioned(doc: Mapping[str, Any]) -> Versioned:
    return OrderStateRecord.from_doc(_strip(doc)), str(doc["_etag"])


class CosmosStateStore(UpdateWithRetry):
    def __init__(self, connection: CosmosConnection, container: ContainerProxy, checkpoints: ContainerProxy) -> None:
        self._connection = connection
        self._container = container
        self._checkpoints = checkpoints

    async def create_if_absent(self, rec: OrderStateRecord) -> tuple[OrderStateRecord, bool]:
        doc, created = await create_or_read(self._container, rec.to_doc(), rec.order_id)
        return OrderStateRecord.from_doc(doc), created

    async def get(self, order_id: str) -> Versioned | None:
        doc = await read_doc(self._container, order_id, order_id)
        return None if doc is None else _versioned(doc)

    async def replace(self, rec: OrderStateRecord, etag: str) -> str:
        return await replace_if_match(self._container, rec.to_doc(), etag)

    async def _query_records(self, sql: str, params: list[dict[str, object]]) -> list[Versioned]:
        """Run one whole (TOP-bounded) query of state records, with store errors translated."""
        try:
            return [_versioned(d) async for d in self._container.query_items(sql, parameters=params)]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc

    async def query_claimable(
        self,
        now: datetime,
        limit: int,
        states: tuple[ProcessState, ...] = CLAIMABLE_STATES,
        *,
        keys: KeyFilter | None = None,
    ) -> list[Versioned]:
        sql, in_states = _claimable_sql(states, keys)
        params: list[dict[str, object]] = [
            {"name": "@limit", "value": int(limit)},
            *in_states,
            {"name": "@now", "value": format_utc(now)},
        ]
        return await self._query_records(sql, params)

    async def query_unnotified(self, updated_before: datetime, limit: int) -> list[Versioned]:
        params: list[dict[str, object]] = [
            {"name": "@limit", "value": int(limit)},
            *_TERMINAL_PARAMS,
            {"name": "@before", "value": format_utc(updated_before)},
        ]
        return await self._query_records(_UNNOTIFIED_SQL, params)

    async def query_expired(
        self, window_start: datetime, window_end: datetime, page_size: int, continuation: str | None = None
    ) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        after = ExpiredCursor.start(window_start, continuation)
        params: list[dict[str, object]] = [
            {"name": "@n", "value": page_size + 1},
            *_SUPERVISED_PARAMS,
            {"name": "@start", "value": format_utc(window_start)},
            {"name": "@end", "value": format_utc(window_end)},
            {"name": "@afterCompleteBy", "value": after.complete_by},
            {"name": "@afterId", "value": after.id},
        ]
        meter = ChargeMeter()
        query = self._container.query_items(
            _EXPIRED_SQL, parameters=params, max_item_count=page_size + 1, response_hook=meter
        )
        try:
            rows = [_versioned(d) async for d in query]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc
        items = rows[:page_size]
        return Page(items=items, continuation=next_cursor(items, len(rows) > page_size), request_charge=meter.total)

    async def _count(self, sql: str, params: list[dict[str, object]]) -> int:
        try:
            # A cross-partition aggregate: the SDK sums the partial counts of every partition.
            counts = [int(n) async for n in self._container.query_items(sql, parameters=params)]  # type: ignore[call-overload]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc
        return sum(counts)

    async def count_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> int:
        of_app, app_params = _of_app(keys)
        sql = f"SELECT VALUE COUNT(1) FROM c WHERE c.processState = @state{of_app}"
        return await self._count(sql, [{"name": "@state", "value": state.value}, *app_params])

    async def count_expired(self, now: datetime) -> int:
        # A record without a CompleteBy is not counted: comparing null with a string is undefined in Cosmos DB
        # (https://learn.microsoft.com/azure/cosmos-db/nosql/query/equality-comparison-operators), as NULL < text is
        # in SQLite.
        return await self._count(_EXPIRED_COUNT_SQL, [*_SUPERVISED_PARAMS, {"name": "@now", "value": format_utc(now)}])

    async def query_in_state(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None = None,
        updated_before: datetime | None = None,
        *,
        keys: KeyFilter | None = None,
    ) -> Page:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        after = None if continuation is None else KeysetCursor.decode(continuation)
        of_app, app_params = _of_app(keys)
        params: list[dict[str, object]] = [
            {"name": "@n", "value": page_size + 1},
            {"name": "@state", "value": state.value},
            *app_params,
        ]
        if after is not None:
            params += [{"name": "@afterAt", "value": after.at}, {"name": "@afterId", "value": after.id}]
        if updated_before is not None:
            params.append({"name": "@before", "value": format_utc(updated_before)})
        meter = ChargeMeter()
        query = self._container.query_items(
            _in_state_sql(after is not None, updated_before is not None, of_app),
            parameters=params,
            max_item_count=page_size + 1,
            response_hook=meter,
        )
        try:
            rows = [_versioned(d) async for d in query]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc
        items = rows[:page_size]
        more = len(rows) > page_size
        return Page(
            items=items, continuation=next_cursor(items, more, lambda r: r.updated_at), request_charge=meter.total
        )

    async def oldest_in_state(self, state: ProcessState, *, keys: KeyFilter | None = None) -> OrderStateRecord | None:
        page = await self.query_in_state(state, 1, keys=keys)
        return page.items[0][0] if page.items else None

    async def get_checkpoint(self, name: str) -> tuple[dict[str, Any], str] | None:
        return await get_data(self._checkpoints, name)

    async def put_checkpoint(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        return await put_data(self._checkpoints, name, data, etag)

    async def aclose(self) -> None:
        await self._connection.aclose()


async def ensure_containers(client: CosmosClient, names: CosmosNames) -> None:
    """Create databases and containers if missing (tests, key-based local servers; Bicep does it in Azure)."""
    orders_db = await client.create_database_if_not_exists(names.orders_database)
    await orders_db.create_container_if_not_exists(
        names.orders_container, partition_key=PartitionKey(ORDER_PARTITION_PATH)
    )
    state_db = await client.create_database_if_not_exists(names.state_database)
    await state_db.create_container_if_not_exists(
        names.state_container,
        partition_key=PartitionKey(ORDER_PARTITION_PATH),
        indexing_policy=STATE_INDEXING_POLICY,
    )
    await state_db.create_container_if_not_exists(
        names.checkpoint_container, partition_key=PartitionKey(CHECKPOINT_PARTITION_PATH)
    )
    await state_db.create_container_if_not_exists(
        names.breaker_container, partition_key=PartitionKey(CHECKPOINT_PARTITION_PATH)
    )
    await state_db.create_container_if_not_exists(
        names.recovery_index_container,
        partition_key=PartitionKey(INDEX_PARTITION_PATH),
        indexing_policy=INDEX_INDEXING_POLICY,
    )


def cosmos_stores(
    client: CosmosClient,
    names: CosmosNames,
    credential: AsyncClosable | None = None,
) -> tuple[CosmosOrdersDb, CosmosStateStore]:
    """Both ports over one client (container proxies only; no network call); closing either closes both."""
    connection = CosmosConnection(client, credential)
    orders = client.get_database_client(names.orders_database).get_container_client(names.orders_container)
    state_db = client.get_database_client(names.state_database)
    return (
        CosmosOrdersDb(connection, orders),
        CosmosStateStore(
            connection,
            state_db.get_container_client(names.state_container),
            state_db.get_container_client(names.checkpoint_container),
        ),
    )


class CosmosDocuments:
    """`DocumentStore` over one container of {id, data} documents (partition key /id): the circuit breakers."""

    def __init__(self, connection: CosmosConnection, container: ContainerProxy) -> None:
        self._connection = connection
        self._container = container

    async def get(self, name: str) -> tuple[dict[str, Any], str] | None:
        return await get_data(self._container, name)

    async def put(self, name: str, data: dict[str, Any], etag: str | None) -> str:
        return await put_data(self._container, name, data, etag)

    async def aclose(self) -> None:
        await self._connection.aclose()


class CosmosRecoveryIndex:
    """`RecoveryIndex` over one container partitioned by /bucket (the CompleteBy time bucket)."""

    def __init__(self, connection: CosmosConnection, container: ContainerProxy, bucket_seconds: int) -> None:
        self._connection = connection
        self._container = container
        self.bucket_seconds = bucket_seconds

    def _doc(self, entry: IndexEntry) -> dict[str, Any]:
        return {
            "id": entry.id,
            "bucket": format_utc(bucket_of(entry.complete_by, self.bucket_seconds)),
            "orderId": entry.order_id,
            "completeBy": format_utc(entry.complete_by),
            "lockedBy": entry.locked_by,
        }

    async def add(self, entry: IndexEntry) -> None:
        try:
            await self._container.upsert_item(self._doc(entry))
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc

    async def page(
        self, bucket: datetime, window_start: datetime, window_end: datetime, after: ExpiredCursor, limit: int
    ) -> tuple[list[IndexEntry], float]:
        params: list[dict[str, object]] = [
            {"name": "@n", "value": int(limit)},
            {"name": "@start", "value": format_utc(window_start)},
            {"name": "@end", "value": format_utc(window_end)},
            {"name": "@afterCompleteBy", "value": after.complete_by},
            {"name": "@afterId", "value": after.id},
        ]
        meter = ChargeMeter()
        try:
            docs = [
                d
                async for d in self._container.query_items(
                    _INDEX_PAGE_SQL, parameters=params, partition_key=format_utc(bucket), response_hook=meter
                )
            ]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc
        return [IndexEntry(d["orderId"], parse_utc(d["completeBy"]), d.get("lockedBy")) for d in docs], meter.total

    async def first_at_or_after(self, start: datetime, end: datetime) -> tuple[datetime | None, float]:
        params: list[dict[str, object]] = [
            {"name": "@start", "value": format_utc(start)},
            {"name": "@end", "value": format_utc(end)},
        ]
        meter = ChargeMeter()
        try:
            # Cross-partition, but over the index only (live entries), and only to jump over an empty stretch.
            found = [
                d async for d in self._container.query_items(_INDEX_FIRST_SQL, parameters=params, response_hook=meter)
            ]
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc
        return (parse_utc(found[0]["completeBy"]) if found else None), meter.total

    async def remove(self, entry: IndexEntry) -> None:
        try:
            await self._container.delete_item(
                entry.id, partition_key=format_utc(bucket_of(entry.complete_by, self.bucket_seconds))
            )
        except CosmosResourceNotFoundError:
            return
        except CosmosHttpResponseError as exc:
            raise translate(exc) from exc

    async def aclose(self) -> None:
        await self._connection.aclose()


def cosmos_recovery_index(
    client: CosmosClient, names: CosmosNames, bucket_seconds: int, credential: AsyncClosable | None = None
) -> CosmosRecoveryIndex:
    container = client.get_database_client(names.state_database).get_container_client(names.recovery_index_container)
    return CosmosRecoveryIndex(CosmosConnection(client, credential), container, bucket_seconds)


def cosmos_breaker_documents(
    client: CosmosClient, names: CosmosNames, credential: AsyncClosable | None = None
) -> CosmosDocuments:
    """The breaker container only: all the Agent's identity may touch (infra: a custom role on that container)."""
    container = client.get_database_client(names.state_database).get_container_client(names.breaker_container)
    return CosmosDocuments(CosmosConnection(client, credential), container)


async def open_cosmos_with_key(
    endpoint: str,
    key: str,
    names: CosmosNames,
    create_containers: bool = True,
    **client_kwargs: Any,
) -> tuple[CosmosOrdersDb, CosmosStateStore]:
    """For tests and local protocol servers: key auth, containers created on demand."""
    client = CosmosClient(endpoint, credential=key, **client_kwargs)
    if create_containers:
        try:
            await ensure_containers(client, names)
        except BaseException:
            await client.close()
            raise
    return cosmos_stores(client, names)
