"""`orderflow` (orderflow/cli): every command against the embedded broker and store, in-process, errors included.

The CLI reads an app folder's local.settings.json as the function app does; the tests seed state through the state
machine's own moves and then look only at what the command printed and what it changed in the store and the queues.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from support.integration_support import tunables
from support.ops_support import app_dir, direct_counts, seed

from orderflow.adapters import aio_bus_from_connection_string
from orderflow.cli.common import operator_name
from orderflow.cli.main import main
from orderflow.clock import FakeClock
from orderflow.embedded._retry import Timer
from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import OrderStatus, StatusMessage
from orderflow.records import ProcessState
from orderflow.runtime import Services
from orderflow.supervisor import run_supervisor

NOW = datetime.now(UTC).replace(microsecond=0)


class Cli:
    def __init__(self, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.folder, self.capsys = folder, capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        """Run `orderflow ARGV --app-dir FOLDER` (the option goes on the subcommand that takes it), on a thread of
        its own: the CLI runs its own event loop, as it does from a shell."""
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(main, [*argv, "--app-dir", str(self.folder)]).result()
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
async def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Services]:
    monkeypatch.chdir(tmp_path)  # the CLI changes into the app folder; put the test's cwd back afterwards
    for name in ("ServiceBusConnection", "CosmosDb__accountEndpoint", "DurableTaskApiUrl"):
        monkeypatch.delenv(name, raising=False)
    app_dir(tmp_path)
    orders, state = open_sqlite_stores(tmp_path / "store.db")
    bus = aio_bus_from_connection_string(app_settings(tmp_path)["ServiceBusConnection"])
    services = Services(orders=orders, state=state, bus=bus, tunables=tunables(), clock=FakeClock(NOW))
    yield services
    await bus.close()
    await state.aclose()


def app_settings(tmp_path: Path) -> dict[str, str]:
    return dict(json.loads((tmp_path / "app" / "local.settings.json").read_text())["Values"])


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tmp_path / "app", capsys)


async def test_order_shows_the_record_and_says_why_attempts_have_no_orchestration(system: Services, cli: Cli) -> None:
    await seed(system.orders, system.state, "o-err", ProcessState.ERROR, NOW)
    view = cli.json("order", "o-err")
    assert view["state"]["processState"] == "Error" and view["state"]["lastError"] == "reserve-inventory: OutOfStock"
    assert view["order"]["orderId"] == "o-err"
    [attempt] = view["attempts"]
    assert attempt["instanceId"] == "o-err:1" and attempt["orchestration"] is None
    assert "ClientConnectorError" in attempt["orchestrationError"]  # DurableTaskApiUrl: nothing listens there
    code, out, _ = cli("order", "o-err")
    assert code == 0 and "processState" in out and "reserve-inventory" in out and "attempt 1: o-err:1" in out


@pytest.mark.parametrize(
    ("order_id", "exit_code", "message"),
    [
        ("nope", 1, "orderflow order: error: no order 'nope' in the state store"),
        (
            "bad id!",
            2,
            "orderflow order: error: order 'bad id!' is not a valid order key: <app>.<orderId>, or the legacy app's "
            "bare orderId (app: 1-24 of a-z 0-9 - starting with a letter; orderId: 1-64 of A-Z a-z 0-9 _ -)",
        ),
        ("partner.nope", 1, "orderflow order: error: no order 'partner.nope' in the state store"),
    ],
)
async def test_order_errors_are_one_line_and_a_bad_value_is_a_usage_error(
    system: Services, cli: Cli, order_id: str, exit_code: int, message: str
) -> None:
    code, out, err = cli("order", order_id)
    assert (code, out, err.splitlines()) == (exit_code, "", [message])


async def test_orders_pages_through_one_state_oldest_first_and_filters_by_age(system: Services, cli: Cli) -> None:
    for n in range(5):
        await seed(system.orders, system.state, f"o-{n}", ProcessState.ERROR, NOW - timedelta(hours=5 - n))
    await seed(system.orders, system.state, "o-ok", ProcessState.PROCESSED, NOW - timedelta(hours=9))
    seen: list[str] = []
    token: str | None = None
    while True:
        page = cli.json("orders", "--state", "error", "--page-size", "2", *(("--continuation", token) if token else ()))
        assert page["state"] == "Error" and len(page["items"]) <= 2
        seen += [row["orderId"] for row in page["items"]]
        token = page["continuation"]
        if token is None:
            break
    assert seen == [f"o-{n}" for n in range(5)]
    old = cli.json("orders", "--state", "Error", "--older-than", "3h")
    assert [row["orderId"] for row in old["items"]] == ["o-0", "o-1", "o-2"]
    assert old["items"][0]["ageSeconds"] >= 5 * 3600 - 60
    code, out, _ = cli("orders", "--state", "Error", "--page-size", "2")
    assert code == 0 and "o-0" in out and "next page: --continuation" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--state", "Stuck"), "state 'Stuck' is not one of Pending, Processing, Processed, Error"),
        (
            ("--state", "Error", "--older-than", "soon"),
            "olderThan (--older-than) 'soon' is not a duration like 90s, 15m, 2h or 3d",
        ),
        # A duration whose age is no date (OverflowError in now - timedelta) is refused with its bound, not a traceback.
        (("--state", "Error", "--older-than", "99999999999d"), "(at most 999999999s, 99999999m, 999999h or 99999d)"),
        (("--state", "Error", "--continuation", "garbage"), "continuation"),
        (("--state", "Error", "--page-size", "0"), "pageSize (--page-size) must be 1..200, got 0"),
    ],
)
async def test_orders_refuses_bad_input_in_one_line(
    system: Services, cli: Cli, argv: tuple[str, ...], message: str
) -> None:
    code, _, err = cli("orders", *argv)
    assert code == 2 and len(err.splitlines()) == 1 and message in err and "Traceback" not in err


async def test_resubmit_runs_an_error_again_with_a_fresh_budget_and_audits_it(system: Services, cli: Cli) -> None:
    await seed(system.orders, system.state, "o-err", ProcessState.ERROR, NOW)
    code, out, _ = cli("resubmit", "o-err", "--reason", "stock arrived", "--by", "ada")
    assert code == 0 and "o-err (app app) resubmitted: Error → Pending" in out and "by ada: stock arrived" in out
    found = await system.state.get("o-err")
    assert found is not None
    rec = found[0]
    assert (rec.process_state, rec.failure_count, rec.locked_by, rec.notified_at) == (
        ProcessState.PENDING,
        0,
        None,
        None,
    )
    assert [(a.by, a.reason, a.from_state) for a in rec.resubmissions] == [("ada", "stock arrived", "Error")]
    again, _, err = cli("resubmit", "o-err", "--reason", "twice", "--by", "ada")
    assert again == 1 and err.strip() == (
        "orderflow resubmit: error: order o-err is Pending: only an order in Error "
        "or CompensationFailed can be resubmitted"
    )
    assert (await system.state.get("o-err")) == found  # the refused repeat wrote nothing


async def test_keep_holds_a_finished_order_from_expiring_as_the_operators_identity(system: Services, cli: Cli) -> None:
    # Issue 26: `orderflow keep` sets ttl -1 on both documents, with the operators' rights of infra/ (the keep role:
    # items/read and items/replace on the orders container), audited on the record.
    await seed(system.orders, system.state, "o-done", ProcessState.PROCESSED, NOW)
    await system.orders.set_ttl("o-done", 3600)  # finished: it would expire
    code, out, err = cli("keep", "o-done", "--reason", "audit 42", "--by", "ada")
    assert code == 0, err
    assert "o-done (app app, Processed) kept from expiring by ada: audit 42" in out
    found = await system.state.get("o-done")
    stored = await system.orders.get("o-done")
    assert found is not None and found[0].ttl == -1 and found[0].kept is not None and found[0].kept.by == "ada"
    assert stored is not None and (stored.model_extra or {}).get("ttl") == -1
    assert cli.json("keep", "o-done", "--reason", "again")["kept"]["by"] == "ada"  # repeatable: the first hold stays
    missing, _, err = cli("keep", "o-none", "--reason", "x")
    assert missing == 1 and "no order 'o-none'" in err


async def test_resubmit_of_a_failed_compensation_tries_it_again(system: Services, cli: Cli) -> None:
    await seed(system.orders, system.state, "o-cf", ProcessState.COMPENSATION_FAILED, NOW)
    result = cli.json("resubmit", "o-cf", "--reason", "undone by hand")
    assert result["processState"] == "CompensationInProgress"
    assert result["resubmission"]["fromState"] == "CompensationFailed"


async def test_cancel_sends_the_orders_cancel_in_its_session_and_refuses_what_is_past_cancelling(
    system: Services, cli: Cli
) -> None:
    await seed(system.orders, system.state, "o-wait", ProcessState.PENDING, NOW)
    await seed(system.orders, system.state, "o-done", ProcessState.PROCESSED, NOW)
    code, out, err = cli("cancel", "o-wait", "--reason", "changed my mind", "--wait", "0")
    assert code == 0 and "sent cancel of o-wait to app-orders" in out, err
    # The legacy app's order: its cancel goes to the app's own inbound queue, as the app's cancel, naming the operator.
    async with system.bus.get_queue_receiver("app-orders", session_id="o-wait") as receiver:
        [message] = await receiver.peek_messages(max_message_count=5)
    body = json.loads(b"".join(message.body))
    assert (body["type"], body["orderId"], body["replyTo"], body["reason"]) == (
        "CancelOrder",
        "o-wait",
        "app-status",
        f"cancelled by {operator_name(None, os.environ)}: changed my mind",
    )
    late, _, err = cli("cancel", "o-done", "--wait", "0")
    assert late == 1 and err.strip() == (
        "orderflow cancel: error: order o-done is Processed: only a Pending or Processing order can be cancelled"
    )
    unknown, _, err = cli("cancel", "o-none", "--wait", "0")
    assert unknown == 1 and err.strip() == "orderflow cancel: error: no order 'o-none' in the state store"


# --- apps (issue 25): each order's app, the list by app, the counts per app, the cancel in the app's session --------
@pytest.fixture
async def two_apps(system: Services, tmp_path: Path) -> Services:
    """The legacy app `app` and the app `partner`, each with orders; `partner.o-1` shares its orderId with `o-1`."""
    app_dir(tmp_path, SubmittingApps="app,partner", LegacyOrdersApp="app")
    for order_id, state, minutes, app in (
        ("o-1", ProcessState.PENDING, 50, None),
        ("o-1", ProcessState.PENDING, 40, "partner"),
        ("o-2", ProcessState.PROCESSING, 30, "partner"),
        ("o-3", ProcessState.ERROR, 20, "partner"),
        ("o-4", ProcessState.PROCESSING, 10, None),
    ):
        await seed(system.orders, system.state, order_id, state, NOW - timedelta(minutes=minutes), app)
    return system


async def test_orders_show_each_orders_app_and_filter_by_app(two_apps: Services, cli: Cli) -> None:
    rows = cli.json("orders", "--state", "Pending")["items"]
    assert [(r["orderId"], r["app"], r["clientOrderId"]) for r in rows] == [
        ("o-1", "app", "o-1"),
        ("partner.o-1", "partner", "o-1"),
    ]
    partner = cli.json("orders", "--state", "Pending", "--app", "partner")
    assert partner["app"] == "partner" and [r["orderId"] for r in partner["items"]] == ["partner.o-1"]
    legacy = cli.json("orders", "--state", "Processing", "--app", "app")
    assert [r["orderId"] for r in legacy["items"]] == ["o-4"]
    code, out, _ = cli("orders", "--state", "Pending", "--app", "partner")
    assert code == 0 and "Pending orders of app partner" in out and "partner.o-1" in out and " o-1 " in out
    code, _, err = cli("orders", "--state", "Pending", "--app", "nobody")
    assert code == 2 and err.splitlines() == [
        "orderflow orders: error: app (--app) 'nobody' is not a submitting app (SubmittingApps: app, partner)"
    ]


async def test_order_and_resubmit_address_an_order_by_its_key(two_apps: Services, cli: Cli) -> None:
    view = cli.json("order", "partner.o-1")
    assert (view["orderId"], view["app"], view["clientOrderId"]) == ("partner.o-1", "partner", "o-1")
    assert view["state"]["orderId"] == "partner.o-1" and view["attempts"] == []
    assert cli.json("order", "o-1")["app"] == "app"  # the legacy app's bare key
    code, out, _ = cli("order", "partner.o-1")
    assert code == 0 and "order partner.o-1" in out and "app's orderId" in out
    done = cli.json("resubmit", "partner.o-3", "--reason", "fixed", "--by", "ada")
    assert (done["orderId"], done["app"], done["clientOrderId"]) == ("partner.o-3", "partner", "o-3")
    assert done["resubmission"]["by"] == "ada"


async def test_summary_counts_pending_and_processing_per_app(two_apps: Services, cli: Cli) -> None:
    data = cli.json("summary")
    assert data["apps"] == {"app": {"Pending": 1, "Processing": 1}, "partner": {"Pending": 1, "Processing": 1}}
    assert (data["oldestPending"]["orderId"], data["oldestPending"]["app"]) == ("o-1", "app")
    code, out, _ = cli("summary")
    assert code == 0 and "orders per app" in out and "partner" in out


async def test_an_operators_cancel_goes_to_the_owning_apps_queue_in_its_session(two_apps: Services, cli: Cli) -> None:
    code, out, err = cli("cancel", "partner.o-1", "--reason", "duplicate", "--wait", "0")
    assert code == 0 and "sent cancel of partner.o-1 to partner-orders" in out, err
    async with two_apps.bus.get_queue_receiver("partner-orders", session_id="o-1") as receiver:
        [message] = await receiver.peek_messages(max_message_count=5)
    body = json.loads(b"".join(message.body))
    assert (message.session_id, body["orderId"], body["replyTo"]) == ("o-1", "o-1", "partner-status")
    assert body["reason"].endswith(": duplicate")
    for queue in ("app-orders", "orders-inbound"):  # nothing for the legacy app's o-1
        assert two_apps.bus.broker.counts(queue).active == 0


async def _dead_letter(services: Services, queue: str, body: str, session: str, reason: str) -> int:
    async with services.bus.get_queue_sender(queue) as sender:
        await sender.send_messages(
            ServiceBusMessage(
                body, session_id=session, message_id=f"{session}:m", application_properties={"source": "test"}
            )
        )
    async with services.bus.get_queue_receiver(queue, session_id=session) as receiver:
        [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
        await receiver.dead_letter_message(message, reason=reason, error_description=f"{reason}: the field")
    return int(message.sequence_number)


async def test_dlq_list_show_and_replay_with_the_marker(system: Services, cli: Cli) -> None:
    seq = await _dead_letter(system, "orders-inbound", '{"orderId": "o-p"}', "o-p", "InvalidField:items")
    [row] = cli.json("dlq", "list", "orders-inbound")
    assert (row["sequenceNumber"], row["messageId"], row["sessionId"], row["deadLetterReason"]) == (
        seq,
        "o-p:m",
        "o-p",
        "InvalidField:items",
    )
    shown = cli.json("dlq", "show", "orders-inbound", str(seq))
    # Service Bus keeps the dead-letter reason and description as application properties (the SDK reads them there:
    # azure/servicebus/_common/message.py dead_letter_reason), so `dlq show` lists them with the sender's.
    assert shown["body"] == {"orderId": "o-p"} and shown["applicationProperties"] == {
        "source": "test",
        "DeadLetterReason": "InvalidField:items",
        "DeadLetterErrorDescription": "InvalidField:items: the field",
    }
    missing, _, err = cli("dlq", "show", "orders-inbound", str(seq + 100))
    assert missing == 1 and err.strip() == (
        f"orderflow dlq: error: no dead-lettered message with sequence number {seq + 100} on orders-inbound"
    )
    [done] = cli.json("dlq", "replay", "orders-inbound", "--seq", str(seq), "--by", "ada")
    assert done["replayedAs"] == f"o-p:m:replay:{seq}"
    assert cli.json("dlq", "list", "orders-inbound") == []
    async with system.bus.get_queue_receiver("orders-inbound", session_id="o-p") as receiver:
        [copy] = await receiver.peek_messages(max_message_count=5)
    assert copy.message_id == f"o-p:m:replay:{seq}" and copy.session_id == "o-p"
    assert b"".join(copy.body) == b'{"orderId": "o-p"}'
    props = {
        k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
        for k, v in (copy.application_properties or {}).items()
    }
    assert props["source"] == "test" and props["orderflowReplayOf"] == f"orders-inbound/$deadletterqueue/{seq}"
    assert props["orderflowReplayedBy"] == "ada" and props["orderflowOriginalMessageId"] == "o-p:m"


async def test_a_replay_repeated_after_a_crash_between_send_and_complete_sends_one_copy(
    system: Services, cli: Cli
) -> None:
    """At least once: the first run sent its copy but died before completing the dead letter; the second run sends
    the same MessageId again, which duplicate detection absorbs (Service Bus: a MessageId seen within
    duplicateDetectionHistoryTimeWindow is accepted and dropped)."""
    from orderflow import deadletters

    seq = await _dead_letter(system, "orders-inbound", "{}", "o-c", "InvalidJson")
    async with system.bus.get_queue_receiver("orders-inbound", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [message] = await dlq.peek_messages(max_message_count=1)
    async with system.bus.get_queue_sender("orders-inbound") as sender:  # the crashed run's send
        await sender.send_messages(deadletters.replay_copy(message, "orders-inbound", "ada", NOW))
    cli.json("dlq", "replay", "orders-inbound", "--all")
    async with system.bus.get_queue_receiver("orders-inbound", session_id="o-c") as receiver:
        copies = await receiver.peek_messages(max_message_count=5)
    assert [m.message_id for m in copies] == [f"o-c:m:replay:{seq}"]
    assert cli.json("dlq", "list", "orders-inbound") == []


async def test_queues_shows_counts_dead_letter_reasons_and_alerts(system: Services, cli: Cli) -> None:
    await _dead_letter(system, "orders-inbound", "{}", "o-q", "InvalidJson")
    shown = cli.json("queues")
    assert shown["queues"]["orders-inbound"] == {
        "active": 0,
        "scheduled": 0,
        "deadLettered": 1,
        "sessionsWithBacklog": 0,
    }
    assert [r["deadLetterReason"] for r in shown["deadLetters"]["orders-inbound"]] == ["InvalidJson"]
    code, out, _ = cli("queues")
    assert code == 0 and "dead-lettered on orders-inbound: o-q:m  InvalidJson" in out


async def test_summary_agrees_with_a_direct_count_of_the_store(system: Services, cli: Cli, tmp_path: Path) -> None:
    plan = {
        ProcessState.PENDING: 3,
        ProcessState.PROCESSING: 2,
        ProcessState.ERROR: 2,
        ProcessState.PROCESSED: 4,
        ProcessState.COMPENSATION_FAILED: 1,
    }
    n = 0
    for state, count in plan.items():
        for _ in range(count):
            await seed(system.orders, system.state, f"o-{n:03d}", state, NOW - timedelta(minutes=60 - n))
            n += 1
    await _dead_letter(system, "orders-inbound", "{}", "o-x", "InvalidJson")
    system.clock.set(NOW + timedelta(minutes=5))  # the Processing records' claim leases (60 s) have expired
    await run_supervisor(system)  # recovers the two expired Processing records, then records its last run
    data = cli.json("summary")
    assert {k: v for k, v in data["states"].items() if v} == direct_counts(tmp_path / "store.db")
    assert data["oldestPending"]["orderId"] == "o-000"
    assert data["deadLetters"]["orders-inbound"] == {"count": 1, "capped": False}
    assert data["supervisor"]["lastRun"]["recovered"] == 2
    assert data["breakers"][0]["service"] == "fulfilment" and data["breakers"][0]["effectiveState"] == "closed"
    # Hour-old Pending orders fire oldest-pending (the recovered ones wait for their retryAt: not stuck); one dead
    # letter on a sender's queue does not fire; no alarm timer ran, so the backlog has no growth figure yet.
    assert {(a["name"], a["queue"]) for a in data["alarms"] if a["firing"]} == {("oldest-pending", None)}
    assert [a["orderId"] for a in data["alarms"] if a["name"] == "oldest-pending"] == ["o-000"]
    assert [a["value"] for a in data["alarms"] if a["queue"] == "orders-inbound"] == [1]
    assert [a["value"] for a in data["alarms"] if a["name"] == "backlog-growth"] == [None]
    assert data["oldestProcessing"] is None  # the Supervisor recovered both
    code, out, _ = cli("summary")
    assert code == 0 and "orders per state" in out and "dead letters" in out and "Supervisor's last run" in out
    assert "FIRING" in out and "Orders wait too long in Pending" in out and "A dead-letter queue grows" in out


async def test_top_refreshes_the_summary_with_throughput(system: Services, cli: Cli) -> None:
    await seed(system.orders, system.state, "o-1", ProcessState.PROCESSED, NOW)
    code, out, err = cli("top", "--iterations", "2", "--interval", "0")
    assert code == 0, err
    assert "orderflow top" in out and "throughput 0.00 orders/s" in out and "Processed" in out
    assert "no alarm firing" in out and "alarms (runbook: README, Operating it)" in out


async def test_submit_count_sends_that_many_orders_each_in_its_own_session(system: Services, cli: Cli) -> None:
    code, out, _ = cli("submit", "--count", "3", "--wait", "0.3")
    assert code == 1 and "sent 3 orders" in out and "0 of 3 ended" in out  # nothing runs them here
    counts = system.bus.broker.counts("app-orders")  # the app's own queue (issue 25)
    assert (counts.active, counts.sessions_with_backlog) == (3, 3)


async def test_watch_follows_a_reply_queue(system: Services, cli: Cli) -> None:
    async with system.bus.get_queue_sender("app-status") as sender:
        for order_id, state in (
            ("o-1", OrderStatus.RECEIVED),
            ("o-1", OrderStatus.COMPLETED),
            ("o-2", OrderStatus.FAILED),
        ):
            status = StatusMessage(order_id=order_id, state=state, attempt=1, timestamp=NOW, reason="r")
            await sender.send_messages(
                ServiceBusMessage(status.to_json(), session_id=order_id, message_id=status.message_id())
            )
    code, out, _ = cli("watch", "app-status", "--for", "10", "--max", "3", "--json")
    assert code == 0
    assert sorted((s["orderId"], s["state"]) for s in map(json.loads, out.splitlines())) == [
        ("o-1", "completed"),
        ("o-1", "received"),
        ("o-2", "failed"),
    ]


async def test_watch_on_a_missing_queue_says_there_is_none(
    system: Services, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK raises a missing queue as ServiceBusAuthenticationError (the put-token's 404, orderflow.errors
    # is_missing_entity), after its retries (_base_handler.py `_open_with_retry`): the backoffs are recorded, not slept.
    slept: list[float] = []
    monkeypatch.setattr(Timer, "sleep", lambda self, seconds: slept.append(seconds))
    code, _, err = cli("watch", "no-such-queue", "--for", "10")
    assert code == 1 and "there is no queue 'no-such-queue'" in err
    assert slept == [1.6, 3.2, 6.4]


async def test_breaker_open_and_show_through_the_cli(system: Services, cli: Cli) -> None:
    opened = cli.json("breaker", "open", "--by", "ada")
    assert opened["breaker"]["state"] == "open" and opened["alert"]["kind"] == "CircuitOpened"
    [row] = cli.json("breaker", "show")
    assert row["forced"] is True and row["reason"] == "forced open by ada"


def test_a_missing_setting_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CosmosDb__accountEndpoint", raising=False)
    (tmp_path / "local.settings.json").write_text(json.dumps({"Values": {}}))
    code = main(["summary", "--app-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.splitlines() == [
        "orderflow summary: error: app setting CosmosDb__accountEndpoint is not set: run in the app folder or pass "
        "--app-dir (locally: cp local.settings.sample.json local.settings.json), or set it in the environment"
    ]


def test_an_unreachable_store_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")  # the store's folder would have to be inside a file
    folder = app_dir(tmp_path, CosmosDb__accountEndpoint=f"embedded://{tmp_path / 'a-file' / 'store.db'}")
    code = main(["orders", "--state", "Error", "--app-dir", str(folder)])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("orderflow orders: error: "), err
    assert "a-file" in err and "Traceback" not in err


def test_the_dead_letter_commands_need_only_the_bus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README gives dlq list|show|replay the Service Bus roles only: no state-store setting is needed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CosmosDb__accountEndpoint", raising=False)
    folder = app_dir(tmp_path)
    settings = json.loads((folder / "local.settings.json").read_text())
    del settings["Values"]["CosmosDb__accountEndpoint"]
    (folder / "local.settings.json").write_text(json.dumps(settings))
    code = main(["dlq", "list", "orders-inbound", "--json", "--app-dir", str(folder)])
    out, err = capsys.readouterr()
    assert (code, json.loads(out), err) == (0, [], "")


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["orders"])
    assert exited.value.code == 2 and "--state" in capsys.readouterr().err


@pytest.mark.parametrize("message_id", ["[/]", "m-1\nforged row\x1b[31m", "[bold]x[/bold] :smile:"])
async def test_dlq_list_and_queues_print_sender_chosen_text_as_itself(
    system: Services, cli: Cli, message_id: str
) -> None:
    """rich markup in a MessageId or a reason must neither raise MarkupError nor style the output; a newline or an ANSI
    escape is printed escaped (orderflow.text.printable)."""
    async with system.bus.get_queue_sender("orders-inbound") as sender:
        await sender.send_messages(ServiceBusMessage("{}", session_id="o-m", message_id=message_id))
    async with system.bus.get_queue_receiver("orders-inbound", session_id="o-m") as receiver:
        [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
        await receiver.dead_letter_message(message, reason=f"InvalidField:{message_id}", error_description="[/]")
    escaped = message_id.replace("\n", "\\n").replace("\x1b", "\\x1b")
    for argv in (("dlq", "list", "orders-inbound"), ("queues",)):
        code, out, err = cli(*argv)
        assert code == 0, err
        assert escaped in out.replace("\n", "")  # a narrow table column may wrap it
        assert "\x1b" not in out and "forged row\n" not in out
    code, out, _ = cli("queues")
    assert f"dead-lettered on orders-inbound: {escaped}  InvalidField:{escaped}  [/]" in out.replace("\n", "")
