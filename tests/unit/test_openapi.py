"""The operator API's OpenAPI 3.1 document (orderflow/openapi.py) and the pure parts of its mapping
(orderflow/ops_http.py) that the end-to-end test cannot reach: the bare 500, the Easy Auth caller, the Durable status
adapter. Every real response is validated against the document in tests/e2e/test_ops_api_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate as validate_openapi

from orderflow import ops_http, runtime
from orderflow.messages import ORDER_ID_PATTERN
from orderflow.openapi import ORDER_ID_REGEX, document
from orderflow.operations import Operations, UnknownOrder, WrongState
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
        ("apiKey", "header", "x-functions-key"), ("apiKey", "query", "code")}
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


async def test_an_unexpected_failure_is_a_bare_500_that_leaks_nothing(no_services: None,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    async def boom(ops: Operations) -> dict[str, Any]:
        raise RuntimeError("secret connection string AccountKey=abc")

    reply = await ops_http.serve(boom)
    assert reply.status == 500 and schema_errors("Error", reply.body) == []
    assert "AccountKey" not in reply.text() and "Traceback" not in reply.text() and "RuntimeError" not in reply.text()
    assert "AccountKey=abc" in caplog.text  # the log keeps it


@pytest.mark.parametrize(("error", "status"), [(UnknownOrder("no order 'x'"), 404), (WrongState("is Processed"), 409)])
async def test_a_refusal_is_answered_with_its_status_and_one_line(no_services: None, error: Exception,
                                                                  status: int) -> None:
    async def refuse(ops: Operations) -> dict[str, Any]:
        raise error

    reply = await ops_http.serve(refuse)
    assert reply.status == status and reply.body == {"error": type(error).code, "message": str(error)}  # type: ignore
    assert schema_errors("Error", reply.body) == []


@pytest.mark.parametrize(("body", "headers", "env", "who"), [
    # With Easy Auth on, the signed-in principal is recorded, whatever the body says.
    ({"by": "alice"}, {"X-MS-CLIENT-PRINCIPAL-NAME": "bob"}, {"WEBSITE_AUTH_ENABLED": "True"}, "bob"),
    ({"by": "alice"}, {}, {"WEBSITE_AUTH_ENABLED": "True"}, "alice"),
    ({"by": "alice"}, {"x-ms-client-principal-name": "mallory"}, {}, "alice"),
    ({}, {"X-MS-CLIENT-PRINCIPAL-NAME": "bob@contoso.com"}, {"WEBSITE_AUTH_ENABLED": "True"}, "bob@contoso.com"),
    ({}, {"x-ms-client-principal-name": "mallory"}, {}, "api"),  # without Easy Auth anyone can send the header
    ({}, {"x-ms-client-principal-name": "mallory"}, {"WEBSITE_AUTH_ENABLED": "False"}, "api"),
    ({"by": "  "}, {}, {"WEBSITE_AUTH_ENABLED": "True"}, "api"),
])
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
    http_api_body = {"name": "order_workflow", "instanceId": "o-1:1", "runtimeStatus": "Running", "input": None,
                     "customStatus": None, "output": None, "createdTime": "2026-01-01T00:00:00Z",
                     "lastUpdatedTime": "2026-01-01T00:00:01Z",
                     "historyEvents": [{"EventType": "ExecutionStarted", "Timestamp": "2026-01-01T00:00:00Z"}]}
    answers = {"o-1:1": DurableOrchestrationStatus.from_json(http_api_body),
               "o-1:2": DurableOrchestrationStatus.from_json("")}
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
