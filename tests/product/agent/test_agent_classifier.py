"""The one classifier (transient vs permanent) and the Retry-After parsing, as tables."""

from __future__ import annotations

import aiohttp
import pytest
from multidict import CIMultiDict

from agent.errors import Classification, classify
from agent.remote import parse_retry_after

S, T, P = Classification.SUCCESS, Classification.TRANSIENT, Classification.PERMANENT


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, S),
        (201, S),
        (204, S),
        # 408/429/5xx transient: project style brief; azure-core pipeline/policies/_retry.py retries
        # 408, 429, 500, 502, 503, 504 and treats every other 4xx as not retryable.
        (408, T),
        (429, T),
        (500, T),
        (502, T),
        (503, T),
        (504, T),
        (501, T),
        (599, T),
        (400, P),
        (401, P),
        (403, P),
        (404, P),
        (409, P),
        (410, P),
        (422, P),
        (451, P),
        (301, P),
        (100, P),
    ],
)
def test_classify_status(status: int, expected: Classification) -> None:
    assert classify(status) is expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (aiohttp.ClientConnectionError("refused"), T),
        (aiohttp.ServerDisconnectedError(), T),
        (aiohttp.ClientPayloadError("truncated"), T),
        (TimeoutError(), T),
        (TimeoutError(), T),
        (ConnectionResetError(), T),
        (OSError("network unreachable"), T),
        (ValueError("bug"), P),
        (KeyError("bug"), P),
    ],
)
def test_classify_exception(exc: BaseException, expected: Classification) -> None:
    assert classify(exc) is expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"x-ms-retry-after-ms": "40"}, 0.04),
        # Conformance: azure-core pipeline/policies/_utils.py get_retry_after: Retry-After, then ms headers.
        ({"Retry-After": "2", "retry-after-ms": "10"}, 2.0),
        ({"retry-after-ms": "10", "x-ms-retry-after-ms": "99"}, 0.01),
        ({"Retry-After": "-5"}, 0.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(CIMultiDict(headers)) == expected
