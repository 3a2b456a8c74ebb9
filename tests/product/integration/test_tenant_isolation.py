"""Issue 25: each submitting app acts on its own orders only, on the embedded store and broker.

Two apps: `app` (the legacy app, LegacyOrdersApp: its keys stay the bare orderId) and `partner` (keys
`partner.<orderId>`). The app of a message is the queue's (`Inbound`), never the body's. One test per trick the issue
names, each of which worked on the code before per-app queues: statuses into another app's queue, a cancel of another
app's order (and what its refusal told), claiming another app's order ids first, and filling the one shared backlog;
and the fair share of MaxOrdersInProcessing among apps with pending work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.integration_support import Pipeline, RecordingStartNew, encode, open_pipeline, order_body

from orderflow.admission import BACKLOG_FULL, refresh
from orderflow.apps import SubmittingApps, status_queue
from orderflow.messages import AlertKind, CancelOrder, OrderStatus, StatusMessage
from orderflow.records import ProcessState
from orderflow.starter import due_fairly, run_starter
from orderflow.submission import Accepted, Inbound, Refused, Rejected, receive

APPS = SubmittingApps(names=("app", "partner"), legacy="app")


@pytest.fixture
async def p(tmp_path: Path) -> AsyncIterator[Pipeline]:
    deployment = await open_pipeline(tmp_path)
    deployment.services = replace(deployment.services, tunables=replace(deployment.services.tunables, apps=APPS))
    yield deployment
    await deployment.aclose()


def with_tunables(p: Pipeline, **overrides: Any) -> None:
    p.services = replace(p.services, tunables=replace(p.services.tunables, **overrides))


async def send(p: Pipeline, app: str, body: dict[str, Any], *, claim: bool = False) -> Any:
    """One message as the app's own submission trigger receives it from `<app>-orders`."""
    order_id = body["orderId"]
    source = Inbound.of_app(app)
    return await receive(
        p.services, encode(body), order_id, f"{app}:{order_id}:{body['type']}", source=source, claim=claim
    )


def submit_body(app: str, order_id: str, **fields: Any) -> dict[str, Any]:
    return {**order_body(order_id, reply_to=status_queue(app), **fields), "type": "SubmitOrder"}


def cancel_body(app: str, order_id: str) -> dict[str, Any]:
    return CancelOrder.model_validate(
        {"orderId": order_id, "replyTo": status_queue(app), "requestedAt": "2024-01-01T00:00:01+00:00"}
    ).to_dict()


async def statuses(p: Pipeline, app: str, order_id: str) -> list[StatusMessage]:
    async with p.services.bus.get_queue_receiver(status_queue(app), session_id=order_id) as receiver:
        msgs = await receiver.peek_messages(max_message_count=100)
    return [StatusMessage.model_validate_json(b"".join(m.body)) for m in msgs]


async def test_an_order_is_stored_under_its_apps_key_and_its_status_carries_the_apps_own_id(p: Pipeline) -> None:
    outcome = await send(p, "partner", submit_body("partner", "X1"))

    assert isinstance(outcome, Accepted) and outcome.key == "partner.X1"
    found = await p.services.state.get("partner.X1")
    assert found is not None and found[0].app == "partner" and found[0].order_id == "partner.X1"
    stored = await p.services.orders.get("partner.X1")
    assert stored is not None and stored.app == "partner" and stored.submit_order().order_id == "X1"
    assert await p.services.state.get("X1") is None  # the legacy app's key of the same id: not touched
    [status] = await statuses(p, "partner", "X1")
    assert (status.order_id, status.state) == ("X1", OrderStatus.RECEIVED)


@pytest.mark.parametrize(("app", "other"), [("partner", "app"), ("app", "partner")])
async def test_an_app_cannot_direct_its_statuses_into_another_apps_queue(p: Pipeline, app: str, other: str) -> None:
    """Trick 1: replyTo naming another app's status queue is refused with a reason; nothing is stored or sent."""
    outcome = await send(p, app, {**submit_body(app, "X2"), "replyTo": status_queue(other)})

    assert isinstance(outcome, Rejected) and outcome.reason == "InvalidField:replyTo"
    assert f"app {app!r}'s status queue" in outcome.description
    assert await p.services.state.get(APPS.order_key(app, "X2")) is None
    assert await statuses(p, other, "X2") == [] and await statuses(p, app, "X2") == []
    [alert] = await p.alerts()
    assert alert.kind is AlertKind.POISON_MESSAGE and alert.details["app"] == app


async def test_a_cancel_of_another_apps_order_changes_nothing_and_answers_as_for_an_unknown_order(p: Pipeline) -> None:
    """Trick 2: partner cancels app's pending order by its id: the order stays Pending, and the answer (dead-letter
    reason and description, alert, statuses) is exactly that of an id no app ever used: nothing leaks."""
    assert isinstance(await send(p, "app", submit_body("app", "V1")), Accepted)

    theirs = await send(p, "partner", cancel_body("partner", "V1"))
    unknown = await send(p, "partner", cancel_body("partner", "V9"))

    rec = (await p.services.state.get("V1"))[0]  # type: ignore[index]
    assert rec.process_state is ProcessState.PENDING and rec.cancel_requested_at is None
    assert isinstance(theirs, Rejected) and isinstance(unknown, Rejected)
    assert (theirs.reason, theirs.description.replace("V1", "V9")) == (unknown.reason, unknown.description)
    assert theirs.reason == "UnknownOrder"
    assert await statuses(p, "partner", "V1") == [] and await statuses(p, "partner", "V9") == []
    assert [s.state for s in await statuses(p, "app", "V1")] == [OrderStatus.RECEIVED]
    alerts = {a.order_id: a for a in await p.alerts()}
    assert alerts["partner.V1"].reason == alerts["partner.V9"].reason == "UnknownOrder"


async def test_a_cancel_of_a_finished_order_of_another_app_tells_nothing_of_its_state(p: Pipeline) -> None:
    """The refusal of a too-late cancel names the order's state; for another app's order it must not be sent."""
    assert isinstance(await send(p, "app", submit_body("app", "V2")), Accepted)
    await p.services.state.update_with_retry(
        "V2", lambda r: r.model_copy(update={"process_state": ProcessState.PROCESSED})
    )

    outcome = await send(p, "partner", cancel_body("partner", "V2"))

    assert isinstance(outcome, Rejected) and outcome.reason == "UnknownOrder"
    assert await statuses(p, "partner", "V2") == []


async def test_the_same_order_id_from_two_apps_is_two_orders_never_a_conflict(p: Pipeline) -> None:
    """Trick 3: partner takes app's order id first, with other data; app's real order is accepted all the same."""
    first = await send(p, "partner", submit_body("partner", "C1", quantity=7))
    real = await send(p, "app", submit_body("app", "C1"))

    assert isinstance(first, Accepted) and isinstance(real, Accepted) and real.created
    assert (await p.services.state.get("C1"))[0].app == "app"  # type: ignore[index]
    assert (await p.services.state.get("partner.C1"))[0].app == "partner"  # type: ignore[index]
    assert [a for a in await p.alerts() if a.kind is AlertKind.ORDER_CONFLICT] == []
    assert [s.state for s in await statuses(p, "app", "C1")] == [OrderStatus.RECEIVED]
    assert [s.state for s in await statuses(p, "partner", "C1")] == [OrderStatus.RECEIVED]


async def test_one_apps_flood_never_rejects_another_apps_orders(p: Pipeline) -> None:
    """Trick 4: MaxPendingOrders holds per app: partner's flood fills its own backlog, not app's."""
    with_tunables(p, apps=replace(APPS, max_pending=3))

    flood = [await send(p, "partner", submit_body("partner", f"F{i}")) for i in range(6)]
    own = [await send(p, "app", submit_body("app", f"A{i}")) for i in range(3)]

    assert [type(o) for o in flood] == [Accepted] * 3 + [Refused] * 3
    assert all(isinstance(o, Refused) and o.reason == BACKLOG_FULL for o in flood[3:])
    assert [type(o) for o in own] == [Accepted] * 3


async def test_max_pending_orders_per_app_sizes_each_app(p: Pipeline) -> None:
    with_tunables(p, apps=replace(APPS, max_pending=10, pending_bounds={"partner": 1}))

    partner = [await send(p, "partner", submit_body("partner", f"F{i}")) for i in range(2)]
    own = [await send(p, "app", submit_body("app", f"A{i}")) for i in range(4)]

    assert [type(o) for o in partner] == [Accepted, Refused]
    assert [type(o) for o in own] == [Accepted] * 4


async def test_the_starter_shares_processing_slots_round_robin_among_apps_with_pending_work(p: Pipeline) -> None:
    """MaxOrdersInProcessing stays global: a flood of partner's Pending orders, older than app's, takes half the
    slots, not all of them."""
    with_tunables(p, max_in_processing=4)
    for i in range(8):
        await send(p, "partner", submit_body("partner", f"F{i}"))
    p.clock.advance(1)
    for i in range(2):
        await send(p, "app", submit_body("app", f"A{i}"))

    started = RecordingStartNew()
    run = await run_starter(p.services, started)

    assert sorted(run.claimed) == ["A0:1", "A1:1", "partner.F0:1", "partner.F1:1"]


async def test_the_fast_path_takes_no_slot_while_another_app_has_orders_waiting(p: Pipeline) -> None:
    """At submission an order is claimed at once only while no other app's orders wait in Pending: else it waits
    for the Starter's fair share, so one app's stream of new orders cannot take every slot that frees."""
    alone = await send(p, "app", submit_body("app", "A0"), claim=True)
    assert isinstance(alone, Accepted) and alone.claimed is not None

    await send(p, "partner", submit_body("partner", "F0"))  # Pending: nothing claimed it
    behind = await send(p, "app", submit_body("app", "A1"), claim=True)

    assert isinstance(behind, Accepted) and behind.claimed is None
    assert (await p.services.state.get("A1"))[0].process_state is ProcessState.PENDING  # type: ignore[index]


async def test_a_record_from_before_per_app_queues_is_the_legacy_apps_on_either_queue(p: Pipeline) -> None:
    """Migration: a record the previous version wrote (bare key, no `app`) stays the legacy app's. Its cancel is
    honoured from the shared queue and from the app's own queue alike, and never from another app's."""
    assert isinstance(await send(p, "app", submit_body("app", "M1")), Accepted)
    doc = (await p.services.state.get("M1"))[0].to_doc()  # type: ignore[index]
    assert doc.pop("app") == "app"
    old = type((await p.services.state.get("M1"))[0]).from_doc(doc)  # type: ignore[index]
    assert old.app is None and APPS.owner(old.order_id) == "app"

    shared = Inbound.shared(p.services)
    theirs = await send(p, "partner", cancel_body("partner", "M1"))
    from_shared = await receive(p.services, encode(cancel_body("app", "M1")), "M1", "m1-cancel", source=shared)

    assert isinstance(theirs, Rejected) and theirs.reason == "UnknownOrder"
    assert shared == Inbound("app", "orders-inbound")
    assert (await p.services.state.get("M1"))[0].process_state is ProcessState.CANCELLED  # type: ignore[index]
    assert from_shared.__class__.__name__ == "CancelDone"


async def test_a_record_of_another_app_from_before_per_app_queues_stays_that_apps(p: Pipeline) -> None:
    """Before per-app queues every app's order had a bare key. Such a record of partner's (no `app`, replyTo
    partner-status) is partner's, not the legacy app's: the legacy app's cancel of that id is answered as for an
    unknown order, and its submission of the same id is a conflict (nothing written, no status)."""
    body = {**submit_body("partner", "P1"), "replyTo": "partner-status"}
    assert isinstance(await send(p, "app", {**body, "replyTo": "app-status"}), Accepted)  # written as app's...
    rec = (await p.services.state.get("P1"))[0]  # type: ignore[index]
    # ...then made what the previous version wrote for partner: no `app`, partner's status queue.
    old = rec.model_copy(update={"app": None, "reply_to": "partner-status"})
    await p.services.state.replace(old, (await p.services.state.get("P1"))[1])  # type: ignore[index]
    assert APPS.owner_of(old.order_id, old.app, old.reply_to) == "partner"

    cancel = await send(p, "app", cancel_body("app", "P1"))
    again = await send(p, "app", {**body, "replyTo": "app-status"})

    assert isinstance(cancel, Rejected) and cancel.reason == "UnknownOrder"
    assert isinstance(again, Rejected) and again.reason == "OrderConflict"
    assert (await p.services.state.get("P1"))[0].process_state is ProcessState.PENDING  # type: ignore[index]


async def test_the_first_free_slot_goes_to_each_app_in_turn(p: Pipeline) -> None:
    """With one slot free per Starter run, the first claim goes to each app in turn (the admission document's
    `turn`), not always to the app with the oldest orders: partner's older flood cannot starve app."""
    for i in range(4):
        await send(p, "partner", submit_body("partner", f"F{i}"))
    p.clock.advance(1)
    await send(p, "app", submit_body("app", "A0"))

    firsts = [(await due_fairly(p.services, 1, turn=t))[0][0].order_id for t in range(2)]

    assert sorted(firsts) == ["A0", "partner.F0"]


async def test_the_fast_path_reads_another_apps_backlog_from_the_fresh_figures(p: Pipeline) -> None:
    """A gate of another app last read long ago must not keep this app off the fast path once that app's backlog
    has drained: the waiting of others comes from the figures this submission just read."""
    await send(p, "partner", submit_body("partner", "F0"))  # partner's gate, with stale figures, in this process
    await p.services.state.update_with_retry(
        "partner.F0", lambda r: r.model_copy(update={"process_state": ProcessState.PROCESSED})
    )
    await refresh(p.services)  # the Starter's count: partner has nothing Pending
    p.clock.advance(5)

    fresh = await send(p, "app", submit_body("app", "A0"), claim=True)

    assert isinstance(fresh, Accepted) and fresh.claimed is not None
