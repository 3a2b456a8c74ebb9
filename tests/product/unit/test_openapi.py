"""The operator API's OpenAPI 3.1 document (orderflow/openapi.py) and the pure parts of its mapping
(orderflow/ops_http.py) that the end-to-end test cannot reach: the bare 500, the Easy Auth caller, the Durable status
adapter. Every real response is validated against the document in tests/product/e2e/test_ops_api_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate as validate_openapi

from orderflow import ops_http, runtime
from orderflow.messages import ORDER_ID_PATTERN
from orderflow.openapi import ORDER_ID_REGEX, STATE_REGEX, document
from orderflow.operations import (
    OLDER_THAN_PATTERN,
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


def test_every_operation_needs_a_function_key_in_the_header_or_the_code_parameter() -> None:
    doc = document()
    schemes = doc["components"]["securitySchemes"]
    assert {(s["type"], s["in"], s["name"]) for s in schemes.values()} == {
        ("apiKey", "header", "x-functions-key"),
        ("apiKey", "query", "code"),
    }
    assert doc["security"] == [{name: []} for name in schemes]
    for item in doc["paths"].values():
        for operation in item.values():
            assert "security" not in operation  # no operation opts out of the document-wide requirement
            assert "401" in operation["responses"]


def test_the_summary_counts_every_process_state_and_requires_each() -> None:
    counts = document()["components"]["schemas"]["StateCounts"]
    assert set(counts["properties"]) == set(counts["required"]) == {s.value for s in ProcessState}


def test_the_order_id_pattern_means_the_same_in_json_schema() -> None:
    schema = {"type": "string", "pattern": ORDER_ID_REGEX}
    # No "a\n": jsonschema evaluates patterns with Python's re, whose `$` also matches before a final newline; in
    # ECMA-262, the dialect the document declares, it does not.
    for candidate in ["a", "A-1_b", "x" * 64, "x" * 65, "-a", "a.b", "a b", "", "ümlaut"]:
        assert Draft202012Validator(schema).is_valid(candidate) == bool(ORDER_ID_PATTERN.match(candidate)), candidate


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
    async def boom(ops: Operations) -> dict[str, Any]:
        raise RuntimeError("secret connection string AccountKey=abc")

    reply = await ops_http.serve(boom)
    assert reply.status == 500 and schema_errors("Error", reply.body) == []
    assert "AccountKey" not in reply.text() and "Traceback" not in reply.text() and "RuntimeError" not in reply.text()
    assert "AccountKey=abc" in caplog.text  # the log keeps it


@pytest.mark.parametrize(("error", "status"), [(UnknownOrder("no order 'x'"), 404), (WrongState("is Processed"), 409)])
async def test_a_refusal_is_answered_with_its_status_and_one_line(
    no_services: None, error: Exception, status: int
) -> None:
    async def refuse(ops: Operations) -> dict[str, Any]:
        raise error

    reply = await ops_http.serve(refuse)
    assert reply.status == status and reply.body == {"error": type(error).code, "message": str(error)}  # type: ignore
    assert schema_errors("Error", reply.body) == []


@pytest.mark.parametrize(
    ("body", "headers", "env", "who"),
    [
        # With Easy Auth on, the signed-in principal is recorded, whatever the body says.
        ({"by": "alice"}, {"X-MS-CLIENT-PRINCIPAL-NAME": "bob"}, {"WEBSITE_AUTH_ENABLED": "True"}, "bob"),
        ({"by": "alice"}, {}, {"WEBSITE_AUTH_ENABLED": "True"}, "alice"),
        ({"by": "alice"}, {"x-ms-client-principal-name": "mallory"}, {}, "alice"),
        ({}, {"X-MS-CLIENT-PRINCIPAL-NAME": "bob@contoso.com"}, {"WEBSITE_AUTH_ENABLED": "True"}, "bob@contoso.com"),
        ({}, {"x-ms-client-principal-name": "mallory"}, {}, "api"),  # without Easy Auth anyone can send the header
        ({}, {"x-ms-client-principal-name": "mallory"}, {"WEBSITE_AUTH_ENABLED": "False"}, "api"),
        ({"by": "  "}, {}, {"WEBSITE_AUTH_ENABLED": "True"}, "api"),
    ],
)
async def test_who_resubmits(body: dict[str, str], headers: dict[str, str], env: dict[str, str], who: str) -> None:
    seen: list[tuple[str, str, str]] = []

    class Ops:
        async def resubmit(self, order_id: str, by: str, reason: str) -> dict[str, Any]:
            seen.append((order_id, by, reason))
            return {}

    handler = ops_http.resubmit("o-1", json.dumps({"reason": "why", **body}).encode(), headers, env)
    await handler(Ops())  # type: ignore[arg-type]
    assert seen == [("o-1", who, "why")]


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
        (b'{"reason": "x", "by": 1e999}', "must be a string"),
    ],
)
async def test_a_bad_body_is_a_bad_request(raw: bytes, says: str) -> None:
    ops = Recorder()
    with pytest.raises(BadRequest, match=says):
        await ops_http.cancel("o-1", raw, {}, {})(ops)  # type: ignore[arg-type]
    assert ops.calls == []


async def test_null_reason_and_by_are_as_if_left_out() -> None:
    ops = Recorder()
    await ops_http.cancel("o-1", b'{"reason": null, "by": null}', {}, {})(ops)  # type: ignore[arg-type]
    await ops_http.resubmit("o-1", b'{"reason": "why", "by": null}', {}, {})(ops)  # type: ignore[arg-type]
    assert ops.calls[0][:3] == ("o-1", "api", None) and ops.calls[1] == ("o-1", "api", "why")
    with pytest.raises(BadRequest, match="needs a reason"):
        await ops_http.resubmit("o-1", b'{"reason": null}', {}, {})(ops)  # type: ignore[arg-type]


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
        await ops_http.orders(query)(ops)  # type: ignore[arg-type]
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
