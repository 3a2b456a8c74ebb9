"""The operator HTTP API on the real function app under devhost (issue 14, part 2): every endpoint, its refusals, and
every response body validated against the schema the served OpenAPI 3.1 document gives for that operation and status.

One devhost per module, with the product's function_app.py on an embedded store and broker, and no Agent: the Starter
and the Supervisor are scheduled once a year, so the seeded records stay where the tests put them. The store is seeded
directly (records in every state), plus one real order that the submission trigger admits and starts, so that one
attempt has a real orchestration with its history. The API's function key is the one devhost keeps in its state dir.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate as validate_openapi
from support.e2e_support import ORDERS_QUEUE, REPLY_QUEUE, Client, make_order
from support.hosted import wait_until
from support.ops_api_seed import EPOCH, function_key, order_ids, seeded_devhost

from lab.system import LocalSystem
from orderflow.messages import OrderStatus
from orderflow.openapi import document
from orderflow.records import OrderStateRecord, ProcessState, format_utc


class Api:
    """The seeded system, an HTTP client of its API with the function key, and the responses validated so far."""

    def __init__(self, system: LocalSystem, client: Client, key: str, ids: dict[str, Any]) -> None:
        self.system, self.client, self.key, self.ids = system, client, key, ids
        self.doc = document()
        self.validated: set[tuple[str, str, int]] = set()

    def call(
        self,
        method: str,
        path: str,
        template: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        raw: bytes | None = None,
        key: str | None = "default",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request; the response is checked against the document's schema for (template, method, status)."""
        assert self.system.devhost is not None and self.system.devhost.url
        url = f"{self.system.devhost.url}/api/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            sent["x-functions-key"] = self.key if key == "default" else key
        request = urllib.request.Request(url, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        return status, self.check(template, method, status, payload)

    def check(self, template: str, method: str, status: int, payload: bytes) -> Any:
        responses = self.doc["paths"][f"/{template}"][method.lower()]["responses"]
        assert str(status) in responses, f"{method} /{template} answered {status}, which is not documented: {payload!r}"
        content = responses[str(status)].get("content")
        self.validated.add((template, method.lower(), status))
        if content is None:
            assert payload == b"", payload
            return None
        body = json.loads(payload)
        schema = {**content["application/json"]["schema"], "components": self.doc["components"]}
        errors = sorted(Draft202012Validator(schema, format_checker=FormatChecker()).iter_errors(body), key=str)
        assert not errors, f"{method} /{template} {status}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
        )
        return body

    def state(self, order_id: str) -> OrderStateRecord:
        found = self.client.state(order_id)
        assert found is not None
        return found


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    ids = order_ids("running")
    system = seeded_devhost(tmp_path_factory.mktemp("ops-api"), ids)
    client = Client(system)
    try:
        key = function_key(system)
        # A real order: admitted and started by the submission trigger's fast path; its first step waits for an Agent
        # that is not running, so it stays Processing with a Running orchestration.
        client.submit(make_order(ids["running"]))
        # A poison message: dead-lettered by the submission trigger (the summary counts it).
        with client.bus.get_queue_sender(ORDERS_QUEUE) as sender:
            sender.send_messages(ServiceBusMessage(b"not json", message_id="poison-1", session_id="poison-1"))
        wait_until(lambda: "poison-1" in dead_lettered(client), 20, "the poison message dead-lettered")
        yield Api(system, client, key, ids)
    finally:
        client.close()
        system.stop()


def dead_lettered(client: Client) -> list[str]:
    """MessageIds on orders-inbound's dead-letter queue, peeked (the summary must still count them)."""
    with client.bus.get_queue_receiver(ORDERS_QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        return [str(m.message_id) for m in receiver.peek_messages(max_message_count=100)]


def direct_counts(api: Api) -> dict[str, int]:
    """Records per ProcessState, counted in the embedded store's file itself (not through the store adapter)."""
    with sqlite3.connect(api.system.config.work_dir / "store.db") as db:
        rows = db.execute("SELECT json_extract(doc, '$.processState'), count(*) FROM order_state GROUP BY 1")
        found = dict(rows.fetchall())
    return {s.value: found.get(s.value, 0) for s in ProcessState}


# --- GET /orders/{id} ------------------------------------------------------------------------------------------------
def test_order_shows_the_record_the_stored_order_and_a_real_orchestration_with_history(api: Api) -> None:
    order_id = api.ids["running"]

    def running() -> Any:
        status, body = api.call("GET", f"orders/{order_id}", "orders/{id}")
        return body if status == 200 and body["attempts"] and body["attempts"][0]["orchestration"] else None

    body = wait_until(running, 30, f"{order_id} started")
    assert body["state"]["processState"] == "Processing" and body["state"]["lockedBy"] == f"{order_id}:1"
    assert body["order"]["orderId"] == order_id and body["etag"]
    orchestration = body["attempts"][0]["orchestration"]
    assert orchestration["instanceId"] == f"{order_id}:1" and orchestration["runtimeStatus"] == "Running"
    assert orchestration["name"] == "order_workflow"
    assert [e["EventType"] for e in orchestration["historyEvents"]][:1] == ["ExecutionStarted"]
    assert "orchestrationError" not in body["attempts"][0]


def test_order_without_orchestrations_says_why_for_each_attempt(api: Api) -> None:
    order_id = api.ids["processing_expired"]
    status, body = api.call("GET", f"orders/{order_id}", "orders/{id}")
    assert status == 200
    assert [(a["attempt"], a["instanceId"], a["orchestration"]) for a in body["attempts"]] == [
        (1, f"{order_id}:1", None),
        (2, f"{order_id}:2", None),
    ]
    assert all("no such instance" in a["orchestrationError"] for a in body["attempts"])


def test_order_refusals(api: Api) -> None:
    status, body = api.call("GET", "orders/no-such-order", "orders/{id}")
    assert (status, body["error"]) == (404, "NotFound") and "no-such-order" in body["message"]
    status, body = api.call("GET", "orders/bad.id", "orders/{id}")
    assert (status, body["error"]) == (400, "BadRequest") and "not a valid order id" in body["message"]


# --- GET /orders -----------------------------------------------------------------------------------------------------
def test_orders_pages_through_every_record_in_a_state_once_oldest_first(api: Api) -> None:
    seen: list[str] = []
    continuation: str | None = None
    pages = 0
    while True:
        query = {"state": "processed", "pageSize": "2", **({"continuation": continuation} if continuation else {})}
        status, page = api.call("GET", "orders", "orders", query=query)
        assert status == 200 and page["state"] == "Processed" and len(page["items"]) <= 2
        seen += [row["orderId"] for row in page["items"]]
        pages += 1
        continuation = page["continuation"]
        if continuation is None:
            break
    assert pages == 3 and len(seen) == len(set(seen)) == direct_counts(api)["Processed"] == 5
    assert seen == list(reversed(api.ids["processed"]))  # seeded 0..4 days old: the oldest change comes first


def test_orders_older_than_keeps_only_records_unchanged_for_that_long(api: Api) -> None:
    status, page = api.call("GET", "orders", "orders", query={"state": "Processed", "olderThan": "2d"})
    assert status == 200 and page["continuation"] is None
    assert [row["orderId"] for row in page["items"]] == list(reversed(api.ids["processed"][2:]))
    assert all(row["ageSeconds"] > 2 * 86400 for row in page["items"])


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({}, "state is required"),
        ({"state": "Stuck"}, "not one of"),
        ({"state": "Pending", "pageSize": "0"}, "pageSize (--page-size) must be 1.."),
        ({"state": "Pending", "pageSize": "many"}, "whole number"),
        ({"state": "Pending", "olderThan": "5y"}, "not a duration"),
        ({"state": "Pending", "olderThan": "99999999999999d"}, "at most 999999999s, 99999999m, 999999h or 99999d"),
        ({"state": ""}, "state is required"),  # the host drops an empty value: as if left out
        ({"state": "Pending", "continuation": "not-a-token"}, "malformed continuation"),
    ],
)
def test_orders_refuses_bad_parameters(api: Api, query: dict[str, str], says: str) -> None:
    status, body = api.call("GET", "orders", "orders", query=query)
    assert (status, body["error"]) == (400, "BadRequest") and says in body["message"]


# --- POST /orders/{id}/resubmit --------------------------------------------------------------------------------------
def test_resubmit_moves_error_to_pending_with_a_fresh_budget_and_the_audit_entry(api: Api) -> None:
    order_id = api.ids["error"]
    status, body = api.call(
        "POST", f"orders/{order_id}/resubmit", "orders/{id}/resubmit", body={"reason": "remote fixed", "by": "alice"}
    )
    assert status == 200 and body["processState"] == "Pending"
    audit = body["resubmission"]
    assert (audit["by"], audit["reason"], audit["fromState"], audit["failureCount"]) == (
        "alice",
        "remote fixed",
        "Error",
        3,
    )
    rec = api.state(order_id)
    assert rec.process_state is ProcessState.PENDING and rec.failure_count == 0 and rec.locked_by is None
    assert [r.model_dump(mode="json", by_alias=True) for r in rec.resubmissions] == [audit]
    assert rec.previous_errors[-1] == "step reserve-inventory: no reply before CompleteBy" and rec.last_error is None


def test_resubmit_of_compensation_failed_resumes_the_compensation(api: Api) -> None:
    order_id = api.ids["compensation_failed"]
    # Without Easy Auth (WEBSITE_AUTH_ENABLED unset) the principal header is anyone's to send: it is not trusted.
    status, body = api.call(
        "POST",
        f"orders/{order_id}/resubmit",
        "orders/{id}/resubmit",
        body={"reason": "refund by hand"},
        headers={"x-ms-client-principal-name": "mallory"},
    )
    assert status == 200 and body["processState"] == "CompensationInProgress"
    assert body["resubmission"]["by"] == "api" and body["resubmission"]["failureCount"] == 3
    assert api.state(order_id).compensation_failures == 0


@pytest.mark.parametrize(
    ("order", "payload", "expected", "says"),
    [
        ("processed", {"reason": "again"}, (409, "Conflict"), "only an order in Error or CompensationFailed"),
        ("unknown", {"reason": "again"}, (404, "NotFound"), "no order"),
        ("bad", {"reason": "again"}, (400, "BadRequest"), "not a valid order id"),
        ("error_kept", None, (400, "BadRequest"), "must be a JSON object"),
        ("error_kept", b"{not json", (400, "BadRequest"), "not JSON"),
        ("error_kept", b'{"reason": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", (400, "BadRequest"), "nested too deeply"),
        ("error_kept", {"reason": None}, (400, "BadRequest"), "needs a reason"),
        ("error_kept", {"reason": "x", "reasom": "typo"}, (400, "BadRequest"), "unknown field(s) in the body: reasom"),
        ("error_kept", {"reason": "  "}, (400, "BadRequest"), "needs who (by) and why (reason)"),
        ("error_kept", {"reason": 7}, (400, "BadRequest"), "must be a string"),
    ],
)
def test_resubmit_refusals_change_nothing(
    api: Api, order: str, payload: Any, expected: tuple[int, str], says: str
) -> None:
    order_id = {"processed": api.ids["processed"][0], "unknown": "no-such-order", "bad": "bad.id"}.get(
        order, api.ids.get(order)
    )
    before = api.client.state(order_id)
    raw = payload if isinstance(payload, bytes) else None
    status, body = api.call(
        "POST", f"orders/{order_id}/resubmit", "orders/{id}/resubmit", body=None if raw else payload, raw=raw
    )
    assert (status, body["error"]) == expected and says in body["message"], body
    assert api.client.state(order_id) == before


# --- POST /orders/{id}/cancel ----------------------------------------------------------------------------------------
def test_cancel_applies_the_cancel_order_use_case_at_once_and_sends_no_message(api: Api) -> None:
    order_id = api.ids["pending_cancel"]
    status, body = api.call(
        "POST", f"orders/{order_id}/cancel", "orders/{id}/cancel", body={"reason": "customer changed their mind"}
    )
    assert status == 202 and body["processState"] == "Cancelled" and body["alreadyRequested"] is False
    assert body["messageId"] is None and body["cancelRequestedAt"] is not None
    # The route runs the CancelOrder handler's use case (the function app may not send to orders-inbound): a Pending
    # order is Cancelled, and the order's reply queue is told in its session.
    status_message = api.client.wait_status(order_id, OrderStatus.CANCELLED)
    assert status_message.order_id == order_id
    rec = api.state(order_id)
    assert rec.process_state is ProcessState.CANCELLED and rec.cancel_reason == "customer changed their mind"
    assert dead_lettered(api.client) == ["poison-1"]
    status, again = api.call("POST", f"orders/{order_id}/cancel", "orders/{id}/cancel")
    assert (status, again["error"]) == (409, "Conflict") and "Cancelled" in again["message"]


def test_cancel_of_an_order_already_cancelling_sends_nothing(api: Api) -> None:
    order_id = api.ids["processing_expired"]
    status, body = api.call("POST", f"orders/{order_id}/cancel", "orders/{id}/cancel", raw=b"")
    assert status == 202 and body["alreadyRequested"] is True and body["messageId"] is None
    assert body["cancelRequestedAt"] == format_utc(api.state(order_id).cancel_requested_at)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("order", "payload", "expected"),
    [
        ("error_kept", {"reason": "stop"}, (409, "Conflict")),
        ("unknown", None, (404, "NotFound")),
        ("bad", None, (400, "BadRequest")),
        ("pending_oldest", {"why": "typo"}, (400, "BadRequest")),
        ("pending_oldest", ["not", "an", "object"], (400, "BadRequest")),
    ],
)
def test_cancel_refusals_change_nothing(api: Api, order: str, payload: Any, expected: tuple[int, str]) -> None:
    order_id = {"unknown": "no-such-order", "bad": "bad.id"}.get(order, api.ids.get(order))
    before = api.client.state(order_id)
    status, body = api.call("POST", f"orders/{order_id}/cancel", "orders/{id}/cancel", body=payload)
    assert (status, body["error"]) == expected, body
    assert api.client.state(order_id) == before


# --- GET /ops/summary ------------------------------------------------------------------------------------------------
def test_summary_agrees_with_a_direct_count_of_the_store(api: Api) -> None:
    status, body = api.call("GET", "ops/summary", "ops/summary")
    assert status == 200
    assert body["states"] == direct_counts(api)
    assert body["expiredSupervised"] == 1  # processing_expired; the running order's CompleteBy is 10 minutes ahead
    oldest = body["oldestPending"]
    assert oldest["orderId"] == api.ids["pending_oldest"] and oldest["since"] == format_utc(EPOCH - timedelta(hours=5))
    assert body["deadLetters"]["orders-inbound"] == {"count": 1, "capped": False}
    assert body["deadLetters"]["agent-replies"] == {"count": 0, "capped": False}
    # No ServiceBusNamespaceResourceId here (no ARM): the summary peeks, and only where the function app holds Listen
    # (its trigger queues, infra/app/rbac.bicep); the other queues say where their depth is.
    for queue in (REPLY_QUEUE, "agent-requests", "operator-alerts"):
        assert "no Listen right" in body["deadLetters"][queue]["error"], body["deadLetters"]
    assert [b["service"] for b in body["breakers"]] == ["fulfilment"]
    assert body["supervisor"]["lastRun"]["scanned"] == 0
    assert body["supervisor"]["position"] == format_utc(EPOCH - timedelta(minutes=5))


# --- GET /openapi.json, and keys -------------------------------------------------------------------------------------
def test_the_served_document_is_the_valid_openapi_31_document(api: Api) -> None:
    status, body = api.call("GET", "openapi.json", "openapi.json", query={"code": api.key}, key=None)
    assert status == 200 and body == api.doc
    validate_openapi(body)


@pytest.mark.parametrize(
    ("method", "path", "template"),
    [
        ("GET", "orders/x-1", "orders/{id}"),
        ("GET", "orders", "orders"),
        ("POST", "orders/x-1/resubmit", "orders/{id}/resubmit"),
        ("POST", "orders/x-1/cancel", "orders/{id}/cancel"),
        ("GET", "ops/summary", "ops/summary"),
        ("GET", "openapi.json", "openapi.json"),
    ],
)
def test_every_endpoint_needs_a_function_key(api: Api, method: str, path: str, template: str) -> None:
    assert api.call(method, path, template, key=None)[0] == 401
    assert api.call(method, path, template, key="wrong-key", query={"state": "Pending"})[0] == 401


def test_every_documented_response_but_the_500_was_seen_and_validated(api: Api) -> None:
    """Runs last (file order): the tests above produced every documented (operation, status) but the bare 500."""
    documented = {
        (path.lstrip("/"), method, int(status))
        for path, item in api.doc["paths"].items()
        for method, op in item.items()
        for status in op["responses"]
        if status != "500"
    }
    assert documented - api.validated == set()
