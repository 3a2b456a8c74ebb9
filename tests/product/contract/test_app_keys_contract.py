"""Contract of the StateStore queries by app (issue 25), run on every adapter (fixture `backend`: the embedded SQLite
store, azure-cosmos on the Cosmos protocol server).

`query_claimable`, `count_in_state`, `query_in_state` and `oldest_in_state` take `keys: apps.KeyFilter | None`:
`KeyFilter("partner")` selects the ids `partner.<orderId>`, `KeyFilter(None)` the unscoped ids (no '.': the legacy
app's), None every record. The seed holds two apps, a legacy record and look-alikes that a sloppy filter would take
(`partner-b.`, `partnerx.` and `xpartner.` hold the letters of `partner.` or `partner`; `Partner.` differs only
in case).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orderflow.adapters import Stores
from orderflow.apps import KeyFilter
from orderflow.messages import SubmitOrder
from orderflow.ports import Versioned
from orderflow.records import OrderStateRecord, ProcessState

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
US = timedelta(microseconds=1)
PENDING, PROCESSING = ProcessState.PENDING, ProcessState.PROCESSING
PARTNER, SHOP, LEGACY = KeyFilter("partner"), KeyFilter("shop"), KeyFilter(None)


def keyed(key: str, at: datetime, state: ProcessState = PENDING) -> OrderStateRecord:
    """A record under order key `key`, created and last written at `at`."""
    order = SubmitOrder.model_validate(
        {
            "orderId": key.rpartition(".")[2],
            "replyTo": "app-status",
            "customer": {"id": "c1", "name": "Ada"},
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-05-01T12:00:00+00:00",
        }
    )
    app = key.rpartition(".")[0] or None
    return OrderStateRecord.new(order, at).model_copy(
        update={"id": key, "order_id": key, "app": app, "process_state": state, "updated_at": at}
    )


# (key, created and updated at); all Pending and claimable. In time order: the oldest of every app comes first.
SEED = [
    ("partner.o-2", T0),
    ("o-1", T0 + US),
    ("shop.o-1", T0 + 2 * US),
    ("partner.o-1", T0 + 3 * US),
    ("partner-b.o-1", T0 + 4 * US),
    ("partnerx.o-9", T0 + 5 * US),
    ("Partner.o-3", T0 + 6 * US),
    ("o-2", T0 + 7 * US),
    ("xpartner.o-4", T0 + 8 * US),
]
ALL = [k for k, _ in SEED]


async def seed(stores: Stores) -> None:
    for key, at in SEED:
        _, created = await stores.state.create_if_absent(keyed(key, at))
        assert created
    _, created = await stores.state.create_if_absent(keyed("partner.busy", T0, PROCESSING))
    assert created


def keys(items: list[Versioned]) -> list[str]:
    return [rec.order_id for rec, _ in items]


async def test_query_claimable_by_app(stores: Stores) -> None:
    await seed(stores)
    now = T0 + timedelta(seconds=1)
    assert keys(await stores.state.query_claimable(now, 100, keys=PARTNER)) == ["partner.o-2", "partner.o-1"]
    assert keys(await stores.state.query_claimable(now, 100, keys=SHOP)) == ["shop.o-1"]
    assert keys(await stores.state.query_claimable(now, 100, keys=LEGACY)) == ["o-1", "o-2"]
    assert keys(await stores.state.query_claimable(now, 1, keys=LEGACY)) == ["o-1"]
    assert keys(await stores.state.query_claimable(now, 100, keys=KeyFilter("nobody"))) == []
    assert keys(await stores.state.query_claimable(now, 100)) == ALL
    assert keys(await stores.state.query_claimable(now, 100, keys=None)) == ALL


async def test_count_in_state_by_app(stores: Stores) -> None:
    await seed(stores)
    assert await stores.state.count_in_state(PENDING, keys=PARTNER) == 2
    assert await stores.state.count_in_state(PROCESSING, keys=PARTNER) == 1
    assert await stores.state.count_in_state(PENDING, keys=SHOP) == 1
    assert await stores.state.count_in_state(PROCESSING, keys=SHOP) == 0
    assert await stores.state.count_in_state(PENDING, keys=LEGACY) == 2
    assert await stores.state.count_in_state(PROCESSING, keys=LEGACY) == 0
    assert await stores.state.count_in_state(PENDING) == len(SEED)


async def test_query_in_state_by_app_on_every_page(stores: Stores) -> None:
    await seed(stores)
    page = await stores.state.query_in_state(PENDING, 100, keys=PARTNER)
    assert keys(page.items) == ["partner.o-2", "partner.o-1"] and page.continuation is None
    assert keys((await stores.state.query_in_state(PROCESSING, 100, keys=PARTNER)).items) == ["partner.busy"]
    assert keys((await stores.state.query_in_state(PROCESSING, 100, keys=LEGACY)).items) == []
    before = await stores.state.query_in_state(PENDING, 100, updated_before=T0 + 2 * US, keys=LEGACY)
    assert keys(before.items) == ["o-1"]
    assert keys((await stores.state.query_in_state(PENDING, 100)).items) == ALL
    # One record a page: the filter holds on every page, and the last page has no continuation.
    for wanted, expected in ((LEGACY, ["o-1", "o-2"]), (PARTNER, ["partner.o-2", "partner.o-1"])):
        seen, token = [], None
        for _ in range(len(expected)):
            page = await stores.state.query_in_state(PENDING, 1, token, keys=wanted)
            seen += keys(page.items)
            token = page.continuation
        assert seen == expected and token is None, wanted


async def test_oldest_in_state_by_app(stores: Stores) -> None:
    await seed(stores)

    async def oldest(state: ProcessState, of: KeyFilter | None) -> str | None:
        rec = await stores.state.oldest_in_state(state, keys=of)
        return None if rec is None else rec.order_id

    assert await oldest(PENDING, PARTNER) == "partner.o-2"
    assert await oldest(PENDING, SHOP) == "shop.o-1"
    assert await oldest(PENDING, LEGACY) == "o-1"
    assert await oldest(PENDING, KeyFilter("partner-b")) == "partner-b.o-1"
    assert await oldest(PENDING, KeyFilter("nobody")) is None
    assert await oldest(PROCESSING, LEGACY) is None
    assert await oldest(PENDING, None) == "partner.o-2"
