"""The operator API's OpenAPI 3.1 document (orderflow/openapi.py) and the pure parts of its mapping
(orderflow/ops_http.py) that the end-to-end test cannot reach: the bare 500, the Easy Auth principal and the operator
role, the Durable status adapter. Every real response is validated against the document in
tests/product/e2e/test_ops_api_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate as validate_openapi
from support.ops_auth import EASY_AUTH_ON, OPERATOR, ROLE, ROLE_TYPE, principal_header, signed_in

from orderflow import ops_http, runtime
from orderflow.openapi import APP_NAME_REGEX, ORDER_KEY_REGEX, STATE_REGEX, document
from orderflow.operations import (
    OLDER_THAN_PATTERN,
    ORDER_KEY_PATTERN,
    BadRequest,
    Operations,
    UnknownOrder,
    WrongState,
    parse_duration,
    parse_state,
)
from orderflow.records import ProcessState


def schema_errors(component: str, value: Any) -> list[str]:
    doc = document()
    schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
    return [e.message for e in Draft202012Validator(schema, format_checker=FormatChecker()).iter_errors(value)]


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1.")
    validate_openapi(json.loads(json.dumps(doc)))  # as served: plain JSON


def test_every_operation_needs_a_function_key_and_a_signed_in_operator() -> None:
    doc = document()
    schemes = doc["components"]["securitySchemes"]
    assert {name: (s["type"], s.get("in"), s.get("name")) for name, s in schemes.items()} == {
        "functionKey": ("apiKey", "header", "x-functions-key"),
        "functionKeyQuery": ("apiKey", "query", "code"),
        "entraId": ("http", None, None),
    }
    assert schemes["entraId"]["scheme"] == "bearer" and ROLE in schemes["entraId"]["description"]
    # Each requirement object is an AND: a key (either way) and the Entra ID principal.
    assert doc["security"] == [{"functionKey": [], "entraId": []}, {"functionKeyQuery": [], "entraId": []}]
    for item in doc["paths"].values():
        for operation in item.values():
            assert "security" not in operation  # no operation opts out of the document-wide requirement
            assert {"401", "403"} <= set(operation["responses"])


def test_the_summary_counts_every_process_state_and_requires_each() -> None:
    counts = document()["components"]["schemas"]["StateCounts"]
    assert set(counts["properties"]) == set(counts["required"]) == {s.value for s in ProcessState}


@pytest.mark.parametrize(
    ("candidate", "is_key"),
    [
        ("a", True),
        ("A-1_b", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("-a", False),
        ("a b", False),
        ("", False),
        ("ümlaut", False),
        ("partner.X1", True),  # <app>.<orderId>
        ("partner-2.x" + "y" * 63, True),
        ("p" * 24 + ".X1", True),
        ("p" * 25 + ".X1", False),  # an app name is at most 24 characters
        ("Partner.X1", False),  # an app name is lower-case
        ("1app.X1", False),  # and starts with a letter
        ("partner.", False),
        (".X1", False),
        ("a.b.c", False),  # one app, one orderId: never a second '.'
        ("partner.-X1", False),
    ],
)
def test_the_order_key_pattern_means_the_same_in_json_schema(candidate: str, is_key: bool) -> None:
    # No "a\n": jsonschema evaluates patterns with Python's re, whose `$` also matches before a final newline; in
    # ECMA-262, the dialect the document declares, it does not.
    assert bool(ORDER_KEY_PATTERN.match(candidate)) is is_key
    assert Draft202012Validator({"type": "string", "pattern": ORDER_KEY_REGEX}).is_valid(candidate) is is_key
    assert document()["paths"]["/orders/{id}"]["get"]["parameters"][0]["schema"]["pattern"] == ORDER_KEY_REGEX


def test_the_app_parameter_names_the_deployments_apps_when_known() -> None:
    def app_schema(doc: dict[str, Any]) -> dict[str, Any]:
        [param] = [p for p in doc["paths"]["/orders"]["get"]["parameters"] if p["name"] == "app"]
        return dict(param["schema"])

    assert app_schema(document()) == {"type": "string", "pattern": APP_NAME_REGEX}
    assert app_schema(document(("app", "partner"))) == {"type": "string", "enum": ["app", "partner"]}
    validate_openapi(json.loads(json.dumps(document(("app", "partner")))))


def test_response_models_are_closed_so_a_field_added_without_its_schema_fails() -> None:
    error = {"error": "NotFound", "message": "no order"}
    assert schema_errors("Error", error) == []
    assert schema_errors("Error", {**error, "trace": "..."}) != []
    assert schema_errors("Error", {"error": "NotFound"}) != []


# --- orderflow/ops_http.py -------------------------------------------------------------------------------------------
@pytest.fixture
async def no_services() -> Iterator[None]:
    runtime.use_services(object())  # type: ignore[arg-type]  # the handlers below never touch it
    yield
    runtime.reset_services()


async def test_an_unexpected_failure_is_a_bare_500_that_leaks_nothing(
    no_services: None, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(ops: Operations, caller: ops_http.Principal) -> dict[str, Any]:
        raise RuntimeError("secret connection string AccountKey=abc")

    reply = await ops_http.serve(boom, OPERATOR, EASY_AUTH_ON)
    assert reply.status == 500 and schema_errors("Error", reply.body) == []
    assert "AccountKey" not in reply.text() and "Traceback" not in reply.text() and "RuntimeError" not in reply.text()
    assert "AccountKey=abc" in caplog.text  # the log keeps it


@pytest.mark.parametrize(("error", "status"), [(UnknownOrder("no order 'x'"), 404), (WrongState("is Processed"), 409)])
async def test_a_refusal_is_answered_with_its_status_and_one_line(
    no_services: None, error: Exception, status: int
) -> None:
    async def refuse(ops: Operations, caller: ops_http.Principal) -> dict[str, Any]:
        raise error

    reply = await ops_http.serve(refuse, OPERATOR, EASY_AUTH_ON)
    assert reply.status == status and reply.body == {"error": type(error).code, "message": str(error)}  # type: ignore
    assert schema_errors("Error", reply.body) == []


# --- who may call: Easy Auth's principal and the operator role ---------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "env", "status", "says"),
    [
        # Without Easy Auth anyone holding a key could send the principal headers: nobody is signed in.
        (OPERATOR, {}, 401, "App Service Authentication is off"),
        (OPERATOR, {"WEBSITE_AUTH_ENABLED": "False"}, 401, "App Service Authentication is off"),
        ({}, EASY_AUTH_ON, 401, "no signed-in principal"),
        # The name header alone (what the API trusted before) is no principal.
        ({"X-MS-CLIENT-PRINCIPAL-NAME": "mallory"}, EASY_AUTH_ON, 401, "no signed-in principal"),
        ({"X-MS-CLIENT-PRINCIPAL": "not base64!"}, EASY_AUTH_ON, 401, "no signed-in principal"),
        ({"X-MS-CLIENT-PRINCIPAL": "bm90IGpzb24="}, EASY_AUTH_ON, 401, "no signed-in principal"),  # "not json"
        ({"X-MS-CLIENT-PRINCIPAL": "eyJjbGFpbXMiOiA3fQ=="}, EASY_AUTH_ON, 401, "no signed-in principal"),  # claims: 7
        (signed_in("bob", "oid-bob"), EASY_AUTH_ON, 403, "bob does not hold the app role Orders.Operator"),
        (signed_in("bob", "oid-bob", "Orders.Reader"), EASY_AUTH_ON, 403, "Orders.Operator"),
        (OPERATOR, {**EASY_AUTH_ON, "OperatorAppRole": "Orders.Admin"}, 403, "app role Orders.Admin"),
    ],
)
def test_a_caller_who_is_not_a_signed_in_operator_is_refused_with_a_json_body(
    headers: dict[str, str], env: dict[str, str], status: int, says: str
) -> None:
    reply = ops_http.refusal(headers, env)
    assert reply is not None and reply.status == status and says in reply.body["message"], reply
    assert reply.body["error"] == {401: "Unauthorized", 403: "Forbidden"}[status]
    assert schema_errors("Error", reply.body) == []


@pytest.mark.parametrize(
    ("headers", "env", "by"),
    [
        (OPERATOR, EASY_AUTH_ON, "ada@contoso.com (oid-ada)"),
        (OPERATOR, {"WEBSITE_AUTH_ENABLED": "true", "OperatorAppRole": " "}, "ada@contoso.com (oid-ada)"),
        (
            signed_in("eve", "oid-eve", "Orders.Admin"),
            {**EASY_AUTH_ON, "OperatorAppRole": "Orders.Admin"},
            "eve (oid-eve)",
        ),
        # Roles under role_typ count as well as Entra ID's "roles"; the name and object id come from the claims when
        # their own headers are missing; header names in any case.
        (
            {"x-ms-client-principal": principal_header("carol", "oid-carol", ROLE, role_claim=ROLE_TYPE)},
            EASY_AUTH_ON,
            "carol (oid-carol)",
        ),
    ],
)
def test_a_signed_in_operator_is_served_and_named_with_its_object_id(
    headers: dict[str, str], env: dict[str, str], by: str
) -> None:
    assert ops_http.refusal(headers, env) is None
    assert ops_http.authorize(headers, env).by == by


async def test_serve_refuses_before_it_opens_anything(no_services: None) -> None:
    reached: list[str] = []

    async def handler(ops: Operations, caller: ops_http.Principal) -> dict[str, Any]:
        reached.append(caller.by)
        return {"ok": True}

    assert (await ops_http.serve(handler, {}, EASY_AUTH_ON)).status == 401
    assert (await ops_http.serve(handler, signed_in("bob", "oid-bob"), EASY_AUTH_ON)).status == 403
    assert reached == []
    assert await ops_http.serve(handler, OPERATOR, EASY_AUTH_ON) == ops_http.Reply(200, {"ok": True})
    assert reached == ["ada@contoso.com (oid-ada)"]


async def test_the_audit_names_the_principal_and_a_body_by_is_refused() -> None:
    seen: list[tuple[str, str, str]] = []

    class Ops:
        async def resubmit(self, order_id: str, by: str, reason: str) -> dict[str, Any]:
            seen.append((order_id, by, reason))
            return {}

    caller = ops_http.authorize(OPERATOR, EASY_AUTH_ON)
    await ops_http.resubmit("o-1", b'{"reason": "why"}')(Ops(), caller)  # type: ignore[arg-type]
    assert seen == [("o-1", "ada@contoso.com (oid-ada)", "why")]
    for body in (b'{"reason": "why", "by": "alice"}', b'{"reason": "why", "by": null}'):
        with pytest.raises(BadRequest, match="field 'by' is not accepted: the audit names the signed-in principal"):
            await ops_http.resubmit("o-1", body)(Ops(), caller)  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="field 'by' is not accepted"):
            await ops_http.cancel("o-1", body)(Ops(), caller)  # type: ignore[arg-type]
    assert len(seen) == 1


def test_a_long_name_still_leaves_room_for_the_object_id() -> None:
    caller = ops_http.authorize(signed_in("n" * 300, "0" * 36, ROLE), EASY_AUTH_ON)
    assert caller.by == "n" * 200 + f" ({'0' * 36})" and len(caller.by) <= 256


async def test_the_durable_status_adapter_keeps_the_history_and_maps_a_missing_instance_to_none() -> None:
    # What DurableOrchestrationClient.get_status returns: from_json of the HTTP API's body, "" for a 404.
    http_api_body = {
        "name": "order_workflow",
        "instanceId": "o-1:1",
        "runtimeStatus": "Running",
        "input": None,
        "customStatus": None,
        "output": None,
        "createdTime": "2026-01-01T00:00:00Z",
        "lastUpdatedTime": "2026-01-01T00:00:01Z",
        "historyEvents": [{"EventType": "ExecutionStarted", "Timestamp": "2026-01-01T00:00:00Z"}],
    }
    answers = {
        "o-1:1": DurableOrchestrationStatus.from_json(http_api_body),
        "o-1:2": DurableOrchestrationStatus.from_json(""),
    }
    calls: list[tuple[str, dict[str, Any]]] = []

    async def get_status(instance: str, **options: Any) -> DurableOrchestrationStatus:
        calls.append((instance, options))
        return answers[instance]

    statuses = ops_http.ClientStatuses(get_status)
    found = await statuses.status("o-1:1")
    assert found is not None and found["historyEvents"] == http_api_body["historyEvents"] and "history" not in found
    assert found["runtimeStatus"] == "Running" and schema_errors("OrchestrationStatus", found) == []
    assert await statuses.status("o-1:2") is None
    assert calls[0] == ("o-1:1", {"show_history": True, "show_history_output": False})


# --- bad input: every refusal a 400 with one line, never an exception ----------------------------------------------
CALLER = ops_http.Principal("ada", "oid-ada", frozenset({ROLE}))


class Recorder:
    """Operations that record what reached them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.now = datetime.now(UTC)

    async def orders(self, *args: Any) -> dict[str, Any]:
        self.calls.append(args)
        return {}

    async def cancel(self, *args: Any) -> dict[str, Any]:
        self.calls.append(args)
        return {}

    async def resubmit(self, *args: Any) -> dict[str, Any]:
        self.calls.append(args)
        return {}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # RecursionError inside json.loads
        (b'{"reason": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"reason": "\xff\xfe caf\xe9"}', "not JSON"),  # not UTF-8
        (b'{"reason": ' + b"9" * 5000 + b"}", "not JSON"),  # longer than int's conversion limit
        (b'{"reason": NaN}', "must be a string"),
        (b'{"reason": "a\\ud800b"}', "not Unicode text"),  # an unpaired surrogate: no store could write it
        (b'{"reason": "x", "extra": 1e999}', "unknown field"),
    ],
)
async def test_a_bad_body_is_a_bad_request(raw: bytes, says: str) -> None:
    ops = Recorder()
    with pytest.raises(BadRequest, match=says):
        await ops_http.cancel("o-1", raw)(ops, CALLER)  # type: ignore[arg-type]
    assert ops.calls == []


async def test_a_null_reason_is_as_if_left_out() -> None:
    ops = Recorder()
    await ops_http.cancel("o-1", b'{"reason": null}')(ops, CALLER)  # type: ignore[arg-type]
    await ops_http.resubmit("o-1", b'{"reason": "why"}')(ops, CALLER)  # type: ignore[arg-type]
    assert ops.calls[0][:3] == ("o-1", "ada (oid-ada)", None) and ops.calls[1] == ("o-1", "ada (oid-ada)", "why")
    with pytest.raises(BadRequest, match="needs a reason"):
        await ops_http.resubmit("o-1", b'{"reason": null}')(ops, CALLER)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"state": "Pending", "olderThan": "99999999999999999999d"}, "at most"),  # OverflowError in timedelta
        ({"state": "Pending", "olderThan": "999999d"}, "at most"),  # a timedelta, but before year 1
        ({"state": "Pending", "olderThan": "\u0663d"}, "not a duration"),  # an Arabic-Indic digit: int() takes it
        ({"state": "Pending", "olderThan": "2d\n"}, "not a duration"),
        ({"state": "Pending", "pageSize": "9" * 5000}, "whole number"),
        ({"state": "Pending", "pageSize": "\u0665"}, "whole number"),
        ({"state": "Pending", "pageSize": " 5"}, "whole number"),
    ],
)
async def test_a_bad_query_is_a_bad_request(query: dict[str, str], says: str) -> None:
    ops = Recorder()
    with pytest.raises(BadRequest, match=says):
        await ops_http.orders(query)(ops, CALLER)  # type: ignore[arg-type]
    assert ops.calls == []


@pytest.mark.parametrize("text", ["999999999s", "99999999m", "999999h", "99999d"])
def test_the_longest_documented_older_than_is_still_a_date(text: str) -> None:
    schema = {"type": "string", "pattern": OLDER_THAN_PATTERN}
    assert Draft202012Validator(schema).is_valid(text)
    assert datetime.now(UTC) - parse_duration(text) > datetime.min.replace(tzinfo=UTC)
    assert not Draft202012Validator(schema).is_valid("1" + text)  # one digit more is refused by the document too


@pytest.mark.parametrize(
    "candidate",
    [
        *(s.value for s in ProcessState),
        "pending",
        "COMPENSATED",
        "",
        "Stuck",
        "Pending,Error",
        "Pendin",
        "Pendingg",
        "Pending\n",
    ],
)
def test_the_state_pattern_is_the_states_in_any_case(candidate: str) -> None:
    try:
        parse_state(candidate)
        accepted = True
    except BadRequest:
        accepted = False
    assert Draft202012Validator({"type": "string", "pattern": STATE_REGEX}).is_valid(candidate) == accepted or (
        candidate == "Pending\n"
    )  # Python's `$` matches before a final newline; ECMA-262's (the document's) does not
