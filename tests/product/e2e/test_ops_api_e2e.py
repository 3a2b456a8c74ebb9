"""The operator HTTP API on the real function app under devhost (issue 14, part 2; issue 25): every endpoint, its
refusals, who may call it, and every response body validated against the schema the served OpenAPI 3.1 document gives
for that operation and status.

One devhost per module, with the product's function_app.py on an embedded store and broker, and no Agent: the Starter
and the Supervisor are scheduled once a year, so the seeded records stay where the tests put them. The store is seeded
directly (records in every state, of two apps), plus one real order that the submission trigger admits and starts, so
that one attempt has a real orchestration with its history. The API's function key is the one devhost keeps in its
state dir; its Easy Auth stand-in is on (WEBSITE_AUTH_ENABLED), and the tests sign in with its local tokens. A second
devhost, with Easy Auth off, shows that the app then trusts no principal header.
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
from support.ops_api_seed import (
    EPOCH,
    NOT_AN_OPERATOR,
    OPERATOR,
    SETTINGS,
    function_key,
    order_ids,
    seeded_devhost,
)
from support.ops_auth import ROLE, signed_in

from devhost.easy_auth import parse_local_token
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
        auth: dict[str, str] | None = OPERATOR,
    ) -> tuple[int, Any]:
        """One request, signed in as `auth` (default: an operator); the response is checked against the document's
        schema for (template, method, status)."""
        assert self.system.devhost is not None and self.system.devhost.url
        url = f"{self.system.devhost.url}/api/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(auth or {}), **(headers or {})}
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
        if content is None or (status == 401 and payload == b""):  # the host's or Easy Auth's 401 has no body
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


def by_app(api: Api) -> dict[str, dict[str, int]]:
    """Pending and Processing records per app, counted by key in the embedded store's file itself."""
    with sqlite3.connect(api.system.config.work_dir / "store.db") as db:
        rows = db.execute("SELECT id, json_extract(doc, '$.processState') FROM order_state").fetchall()
    counts = {app: {"Pending": 0, "Processing": 0} for app in ("app", "partner")}
    for key, state in rows:
        if state in ("Pending", "Processing"):
            counts[key.partition(".")[0] if "." in key else "app"][state] += 1
    return counts


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
    assert (body["orderId"], body["app"], body["clientOrderId"]) == (order_id, "app", order_id)
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


def test_an_order_of_another_app_is_addressed_by_its_key(api: Api) -> None:
    client_id = api.ids["partner_pending"]
    status, body = api.call("GET", f"orders/partner.{client_id}", "orders/{id}")
    assert status == 200 and (body["orderId"], body["app"], body["clientOrderId"]) == (
        f"partner.{client_id}",
        "partner",
        client_id,
    )
    assert body["order"]["orderId"] == client_id and body["state"]["app"] == "partner"
    # The bare orderId is the legacy app's key: partner's order is not found by it.
    assert api.call("GET", f"orders/{client_id}", "orders/{id}")[0] == 404


def test_order_refusals(api: Api) -> None:
    status, body = api.call("GET", "orders/no-such-order", "orders/{id}")
    assert (status, body["error"]) == (404, "NotFound") and "no-such-order" in body["message"]
    status, body = api.call("GET", "orders/Bad.id", "orders/{id}")
    assert (status, body["error"]) == (400, "BadRequest") and "not a valid order key" in body["message"]


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


def test_orders_show_each_orders_app_and_filter_by_app(api: Api) -> None:
    status, page = api.call("GET", "orders", "orders", query={"state": "Pending", "app": "partner"})
    assert status == 200 and page["app"] == "partner"
    assert [(r["orderId"], r["app"], r["clientOrderId"]) for r in page["items"]] == [
        (f"partner.{api.ids['partner_pending']}", "partner", api.ids["partner_pending"]),
        (f"partner.{api.ids['pending_cancel']}", "partner", api.ids["pending_cancel"]),
    ]
    status, legacy = api.call("GET", "orders", "orders", query={"state": "Pending", "app": "app"})
    assert status == 200 and {r["app"] for r in legacy["items"]} == {"app"}
    assert all("." not in r["orderId"] for r in legacy["items"]) and api.ids["pending_oldest"] in {
        r["orderId"] for r in legacy["items"]
    }
    status, every = api.call("GET", "orders", "orders", query={"state": "Pending"})
    assert status == 200 and every["app"] is None and {r["app"] for r in every["items"]} == {"app", "partner"}


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
        ({"state": "Pending", "app": "nobody"}, "app (--app) 'nobody' is not a submitting app"),
    ],
)
def test_orders_refuses_bad_parameters(api: Api, query: dict[str, str], says: str) -> None:
    status, body = api.call("GET", "orders", "orders", query=query)
    assert (status, body["error"]) == (400, "BadRequest") and says in body["message"]


# --- POST /orders/{id}/resubmit --------------------------------------------------------------------------------------
def ada() -> str:
    """The audit's name for the operator the tests sign in as: its name and (devhost's derived) object id."""
    signed = parse_local_token(OPERATOR["Authorization"])
    assert signed is not None
    return f"{signed.name} ({signed.object_id})"


def test_resubmit_moves_error_to_pending_with_a_fresh_budget_and_the_audit_entry(api: Api) -> None:
    order_id = api.ids["error"]
    status, body = api.call(
        "POST", f"orders/{order_id}/resubmit", "orders/{id}/resubmit", body={"reason": "remote fixed"}
    )
    assert status == 200 and body["processState"] == "Pending" and body["app"] == "app"
    audit = body["resubmission"]
    # The audit names the signed-in principal (Easy Auth), with its object id.
    assert (audit["by"], audit["reason"], audit["fromState"], audit["failureCount"]) == (
        ada(),
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
    # Principal headers a client sends are Easy Auth's to replace: the audit names who signed in, not "mallory".
    status, body = api.call(
        "POST",
        f"orders/{order_id}/resubmit",
        "orders/{id}/resubmit",
        body={"reason": "refund by hand"},
        headers={**signed_in("mallory", "oid-mallory", ROLE), "x-ms-client-principal-name": "mallory"},
    )
    assert status == 200 and body["processState"] == "CompensationInProgress"
    assert body["resubmission"]["by"] == ada() and body["resubmission"]["failureCount"] == 3
    assert api.state(order_id).compensation_failures == 0


@pytest.mark.parametrize(
    ("order", "payload", "expected", "says"),
    [
        ("processed", {"reason": "again"}, (409, "Conflict"), "only an order in Error or CompensationFailed"),
        ("unknown", {"reason": "again"}, (404, "NotFound"), "no order"),
        ("bad", {"reason": "again"}, (400, "BadRequest"), "not a valid order key"),
        ("error_kept", None, (400, "BadRequest"), "must be a JSON object"),
        ("error_kept", b"{not json", (400, "BadRequest"), "not JSON"),
        ("error_kept", b'{"reason": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", (400, "BadRequest"), "nested too deeply"),
        ("error_kept", {"reason": None}, (400, "BadRequest"), "needs a reason"),
        ("error_kept", {"reason": "x", "reasom": "typo"}, (400, "BadRequest"), "unknown field(s) in the body: reasom"),
        ("error_kept", {"reason": "  "}, (400, "BadRequest"), "needs who (by) and why (reason)"),
        ("error_kept", {"reason": 7}, (400, "BadRequest"), "must be a string"),
        # Who resubmits is the signed-in principal, never the body: a body `by` is refused, not recorded.
        ("error_kept", {"reason": "x", "by": "alice"}, (400, "BadRequest"), "field 'by' is not accepted"),
    ],
)
def test_resubmit_refusals_change_nothing(
    api: Api, order: str, payload: Any, expected: tuple[int, str], says: str
) -> None:
    order_id = {"processed": api.ids["processed"][0], "unknown": "no-such-order", "bad": "Bad.id"}.get(
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
    assert body["messageId"] is None and body["cancelRequestedAt"] is not None and body["app"] == "app"
    # The route runs the CancelOrder handler's use case (the function app may not send to orders-inbound): a Pending
    # order is Cancelled, and the order's reply queue is told in its session.
    status_message = api.client.wait_status(order_id, OrderStatus.CANCELLED)
    assert status_message.order_id == order_id
    rec = api.state(order_id)
    assert rec.process_state is ProcessState.CANCELLED
    assert rec.cancel_reason == f"cancelled by {ada()}: customer changed their mind"  # the audit names who
    assert dead_lettered(api.client) == ["poison-1"]
    status, again = api.call("POST", f"orders/{order_id}/cancel", "orders/{id}/cancel")
    assert (status, again["error"]) == (409, "Conflict") and "Cancelled" in again["message"]


def test_cancel_of_another_apps_order_is_that_apps_cancel(api: Api) -> None:
    """partner's order with the same orderId as the legacy order cancelled above: cancelled as partner's, its status
    on partner-status under partner's orderId; the legacy order of that orderId is not touched again."""
    client_id = api.ids["pending_cancel"]
    key = f"partner.{client_id}"
    status, body = api.call("POST", f"orders/{key}/cancel", "orders/{id}/cancel")
    assert status == 202 and body["processState"] == "Cancelled"
    assert (body["orderId"], body["app"], body["clientOrderId"]) == (key, "partner", client_id)
    assert api.state(key).cancel_reason == f"cancelled by {ada()}"

    def told() -> Any:
        with api.client.bus.get_queue_receiver("partner-status", session_id=client_id) as receiver:
            return [json.loads(b"".join(m.body)) for m in receiver.peek_messages(max_message_count=10)] or None

    statuses = wait_until(told, 20, f"a status of {key} on partner-status")
    assert [(s["orderId"], s["state"]) for s in statuses] == [(client_id, "cancelled")]


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
        ("pending_oldest", {"by": "alice"}, (400, "BadRequest")),
    ],
)
def test_cancel_refusals_change_nothing(api: Api, order: str, payload: Any, expected: tuple[int, str]) -> None:
    order_id = {"unknown": "no-such-order", "bad": "Bad.id"}.get(order, api.ids.get(order))
    before = api.client.state(order_id)
    status, body = api.call("POST", f"orders/{order_id}/cancel", "orders/{id}/cancel", body=payload)
    assert (status, body["error"]) == expected, body
    assert api.client.state(order_id) == before


# --- GET /ops/summary ------------------------------------------------------------------------------------------------
def test_summary_agrees_with_a_direct_count_of_the_store(api: Api) -> None:
    status, body = api.call("GET", "ops/summary", "ops/summary")
    assert status == 200
    assert body["states"] == direct_counts(api)
    assert body["apps"] == by_app(api) and body["apps"]["partner"]["Pending"] == 1
    assert body["expiredSupervised"] == 1  # processing_expired; the running order's CompleteBy is 10 minutes ahead
    oldest = body["oldestPending"]
    assert (oldest["orderId"], oldest["app"], oldest["clientOrderId"]) == (
        f"partner.{api.ids['partner_pending']}",
        "partner",
        api.ids["partner_pending"],
    )
    assert oldest["since"] == format_utc(EPOCH - timedelta(hours=6))
    assert body["deadLetters"]["orders-inbound"] == {"count": 1, "capped": False}
    assert body["deadLetters"]["agent-replies"] == {"count": 0, "capped": False}
    # No ServiceBusNamespaceResourceId here (no ARM): the summary peeks, and only where the function app holds Listen
    # (its trigger queues, infra/app/rbac.bicep); the other queues say where their depth is.
    for queue in (REPLY_QUEUE, "agent-requests", "operator-alerts"):
        assert "no Listen right" in body["deadLetters"][queue]["error"], body["deadLetters"]
    assert [b["service"] for b in body["breakers"]] == ["fulfilment"]
    assert body["supervisor"]["lastRun"]["scanned"] == 0
    assert body["supervisor"]["position"] == format_utc(EPOCH - timedelta(minutes=5))
    # The alarms, as the alarm timer evaluates them: dead-letters once per queue the summary counts.
    alarms = {(a["name"], a["queue"]): a for a in body["alarms"]}
    assert {name for name, _ in alarms} == {"oldest-pending", "oldest-processing", "backlog-growth", "dead-letters"}
    assert {queue for name, queue in alarms if name == "dead-letters"} == set(body["deadLetters"])
    inbound = alarms[("dead-letters", "orders-inbound")]
    assert (inbound["value"], inbound["threshold"], inbound["firing"]) == (1, 20, False)  # a sender's queue
    unread = alarms[("dead-letters", "agent-requests")]
    assert unread["value"] is None and "no Listen right" in unread["detail"] and not unread["firing"]
    assert body["oldestProcessing"]["ageSeconds"] > 0
    # Hours-old Pending and Processing orders fire nothing here: the Starter and the Supervisor run once a year
    # (SETTINGS), so the thresholds derived from their schedules are over a year.
    assert alarms[("oldest-pending", None)]["threshold"] > 365 * 86400
    assert alarms[("oldest-pending", None)]["orderId"] == f"partner.{api.ids['partner_pending']}"
    assert not [a for a in body["alarms"] if a["firing"]]


# --- GET /openapi.json, and keys -------------------------------------------------------------------------------------
def test_the_served_document_is_the_valid_openapi_31_document(api: Api) -> None:
    status, body = api.call("GET", "openapi.json", "openapi.json", query={"code": api.key}, key=None)
    assert status == 200 and body == document(("app", "partner"))  # the `app` parameter names the deployment's apps
    validate_openapi(body)


ENDPOINTS = [
    ("GET", "orders/x-1", "orders/{id}"),
    ("GET", "orders", "orders"),
    ("POST", "orders/x-1/resubmit", "orders/{id}/resubmit"),
    ("POST", "orders/x-1/cancel", "orders/{id}/cancel"),
    ("GET", "ops/summary", "ops/summary"),
    ("GET", "openapi.json", "openapi.json"),
]


@pytest.mark.parametrize(("method", "path", "template"), ENDPOINTS)
def test_every_endpoint_needs_a_function_key(api: Api, method: str, path: str, template: str) -> None:
    assert api.call(method, path, template, key=None) == (401, None)
    assert api.call(method, path, template, key="wrong-key", query={"state": "Pending"}) == (401, None)


@pytest.mark.parametrize(("method", "path", "template"), ENDPOINTS)
def test_every_endpoint_needs_a_signed_in_principal(api: Api, method: str, path: str, template: str) -> None:
    """Easy Auth (devhost's stand-in) answers 401 with no body before the host, key or no key; a forged principal
    header without a token is dropped, not believed."""
    assert api.call(method, path, template, auth=None) == (401, None)
    assert api.call(method, path, template, auth=None, key=None) == (401, None)
    forged = {**signed_in("mallory", "oid-mallory", ROLE), "Authorization": "Bearer eyJhbGciOi.not-a-token.x"}
    assert api.call(method, path, template, auth=forged, query={"state": "Pending"}) == (401, None)


@pytest.mark.parametrize(("method", "path", "template"), ENDPOINTS)
def test_every_endpoint_needs_the_operator_role(api: Api, method: str, path: str, template: str) -> None:
    before = api.client.state(api.ids["error_kept"])
    # Signed in, but not an operator: a 403 naming the role; a forged X-MS-CLIENT-PRINCIPAL with the role is
    # replaced by Easy Auth with the caller's own.
    for headers in ({}, signed_in("bob@contoso.com", "oid-bob", ROLE)):
        status, body = api.call(
            method,
            path.replace("x-1", api.ids["error_kept"]),
            template,
            auth=NOT_AN_OPERATOR,
            headers=headers,
            query={"state": "Pending"},
            body={"reason": "x"} if method == "POST" else None,
        )
        assert (status, body["error"]) == (403, "Forbidden") and f"app role {ROLE}" in body["message"], body
    assert api.client.state(api.ids["error_kept"]) == before


@pytest.fixture(scope="module")
def without_easy_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """The same app on a devhost with Easy Auth off (no WEBSITE_AUTH_ENABLED): as on Azure without App Service
    Authentication, any client may send the principal headers, and nothing strips or checks them."""
    ids = order_ids()
    settings = {k: v for k, v in SETTINGS.items() if k != "WEBSITE_AUTH_ENABLED"}
    system = seeded_devhost(tmp_path_factory.mktemp("ops-api-no-auth"), ids, settings)
    client = Client(system)
    try:
        yield Api(system, client, function_key(system), ids)
    finally:
        client.close()
        system.stop()


@pytest.mark.parametrize(("method", "path", "template"), ENDPOINTS)
def test_without_easy_auth_a_forged_principal_is_refused(
    without_easy_auth: Api, method: str, path: str, template: str
) -> None:
    api = without_easy_auth
    before = api.client.state(api.ids["error_kept"])
    forged = {**signed_in("mallory", "oid-mallory", ROLE), "x-ms-client-principal-name": "mallory"}
    for auth in (forged, OPERATOR):  # a forged principal; a devhost token, which nothing turns into a principal
        status, body = api.call(
            method,
            path.replace("x-1", api.ids["error_kept"]),
            template,
            auth=auth,
            query={"state": "Pending"},
            body={"reason": "x"} if method == "POST" else None,
        )
        assert (status, body["error"]) == (401, "Unauthorized"), body
        assert "App Service Authentication is off (WEBSITE_AUTH_ENABLED is not True)" in body["message"]
    assert api.client.state(api.ids["error_kept"]) == before


def test_every_documented_response_but_the_500_was_seen_and_validated(api: Api) -> None:
    """Runs last (file order): the tests above produced every documented (operation, status) but the bare 500. (The
    401's JSON body, the app's own refusal, is validated on the other devhost: `without_easy_auth`.)"""
    documented = {
        (path.lstrip("/"), method, int(status))
        for path, item in api.doc["paths"].items()
        for method, op in item.items()
        for status in op["responses"]
        if status != "500"
    }
    assert documented - api.validated == set()
