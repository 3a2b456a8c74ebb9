"""The operator HTTP API fuzzed by schemathesis from the document it serves (GET /api/openapi.json), with every check
schemathesis has but one: requests the document allows are accepted, requests it forbids get a 400, no 5xx, every
status, content type and body as documented. Examples, coverage and fuzzing phases, positive and negative data,
derandomized and bounded so that the run is the same each time and takes seconds.

The check left out, `unsupported_method`, wants a 405 for a method the document does not declare. The Functions host
answers 404 there, before any key check, and no app can change that: a trigger's methods are a constraint of its route
(azure-functions-host src/WebJobs.Script.WebHost/WebScriptHostHttpRoutesManager.cs, HttpMethodRouteConstraint;
Azure/azure-functions-host#10098). devhost does the same, which test_an_undeclared_method_is_a_404_as_on_azure pins.
"""

from __future__ import annotations

import functools
import json
import string
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    unsupported_method,
)
from support.ops_api_seed import OPERATOR, function_key, order_ids, seeded_devhost

from orderflow.openapi import CONTINUATION_FORMAT, document
from orderflow.ports import KeysetCursor
from orderflow.records import format_utc

load_all_checks()


def _body_optional_on_401(check: Any) -> Any:
    """`check`, except on a 401 with no body. The document gives the 401 the app's JSON error body, and says that the
    Functions host (no valid key) and App Service Authentication (not signed in) answer it with none before the app
    runs; OpenAPI cannot declare a body that may be absent, so the content checks let that one shape through."""

    @functools.wraps(check)
    def checked(ctx: Any, response: Any, case: Any) -> bool | None:
        if response.status_code == 401 and not response.content:
            return None
        result: bool | None = check(ctx, response, case)
        return result

    return checked


_CONTENT_CHECKS = {content_type_conformance, response_schema_conformance}
CHECKED = [
    _body_optional_on_401(c) if c in _CONTENT_CHECKS else c for c in CHECKS.get_all() if c is not unsupported_method
]
# A continuation is a token a page handed out: generate real ones (any keyset position), not arbitrary strings.
schemathesis.openapi.format(
    CONTINUATION_FORMAT,
    st.builds(
        lambda at, key: KeysetCursor(format_utc(at), key).encode(),
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
        st.text(string.ascii_letters + string.digits + "-_", max_size=64),
    ),
)


class Served:
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.sent: Counter[tuple[str, str]] = Counter()

    def headers(self, key: bool = True) -> dict[str, str]:
        """A signed-in operator (devhost's Easy Auth stand-in is on), with the function key unless `key` is False."""
        return {**OPERATOR, **({"x-functions-key": self.key} if key else {})}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The product app under devhost on a seeded store (as tests/product/e2e/test_ops_api_e2e.py seeds it)."""
    system = seeded_devhost(tmp_path_factory.mktemp("ops-api-fuzz"), order_ids())
    try:
        assert system.devhost is not None and system.devhost.url
        key = function_key(system)
        yield Served(system.devhost.url, key)
    finally:
        system.stop()


# The document as the product builds it for the seeded app's settings (SubmittingApps app,partner);
# test_the_served_document_is_the_products proves it is the one served. (schemathesis.pytest.from_fixture would load
# the served one lazily, but its subtests need pytest < 9.)
APPS = ("app", "partner")
schema = schemathesis.openapi.from_dict(document(APPS))
# Credentials are the test's, on every request (Served.headers): schemathesis generates no security parameters, so
# that a case it builds without the bearer token is not taken for a request the API should refuse (the token is
# added back); `ignored_auth` still probes each operation without them.
schema.config.generation.update(deterministic=True, database="none", with_security_parameters=False)


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_the_api_accepts_what_its_document_allows_and_refuses_the_rest(case: Any, served: Served) -> None:
    case.call_and_validate(base_url=f"{served.url}/api", headers=served.headers(), checks=CHECKED)
    served.sent[(case.operation.path, case.operation.method.lower())] += 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "orders"),
        ("PUT", "orders/o-1"),
        ("GET", "orders/o-1/cancel"),
        ("PATCH", "ops/summary"),
        ("POST", "openapi.json"),
        ("TRACE", "orders"),
    ],
)
@pytest.mark.parametrize("key", [True, False])
def test_an_undeclared_method_is_a_404_as_on_azure(served: Served, method: str, path: str, key: bool) -> None:
    # Conformance: azure-functions-host routes on (template, method) and answers 404 with no body when nothing
    # matches, before its key check (WebScriptHostHttpRoutesManager.cs; Azure/azure-functions-host#10098). App Service
    # Authentication comes before the host: the caller is signed in here (without, it is a 401 for any path).
    request = urllib.request.Request(f"{served.url}/api/{path}", method=method, headers=served.headers(key))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 404 and refused.value.read() == b"" and "Allow" not in refused.value.headers


def test_a_repeated_query_parameter_arrives_joined_with_commas_as_on_azure(served: Served) -> None:
    # Conformance: the host passes each query name once, its values joined by StringValues.ToString() (",") and empty
    # ones dropped (azure-functions-host src/WebJobs.Script.Grpc/MessageExtensions/GrpcMessageConversionExtensions.cs).
    request = urllib.request.Request(
        f"{served.url}/api/orders?state=Pending&state=Error&olderThan=", headers=served.headers()
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    body = json.loads(refused.value.read())
    assert refused.value.code == 400 and body["error"] == "BadRequest"
    assert body["message"].startswith("state 'Pending,Error' is not one of")


def test_the_served_document_is_the_products(served: Served) -> None:
    request = urllib.request.Request(f"{served.url}/api/openapi.json", headers=served.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read()) == document(APPS)


def test_the_fuzz_run_sent_requests_to_every_operation(served: Served) -> None:
    """Runs after the fuzz test (file order): it sent a fair number of generated requests to every operation."""
    operations = {(path, method) for path, item in document()["paths"].items() for method in item}
    assert set(served.sent) == operations, served.sent
    # An operation without parameters has little to vary (extra query parameters) once credentials are not generated.
    without_parameters = {("/ops/summary", "get"), ("/openapi.json", "get")}
    assert all(n >= (10 if op in without_parameters else 20) for op, n in served.sent.items()), served.sent
