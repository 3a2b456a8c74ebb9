"""The remote call: one HTTP POST of one step to the remote service, behind a one-method protocol.

`RemoteCaller.call(...)` is the single seam between the retry loop and the network. The circuit breaker is not
a wrapper here: the retry loop asks it before each call and reports each result to it (`agent.retry.CallGate`),
because only the loop knows whether a refusal comes before any call of the request (`CircuitOpen`, "not now") or
after some (an ordinary transient failure). Nothing else in the Agent talks HTTP.

Each call is a client span `orderflow.agent.remote_call` (a child of the request's handling span) and sends its
context in the W3C `traceparent` header, so a remote service that traces joins the order's trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from agent.errors import Classification, classify
from orderflow import tracing


@dataclass(frozen=True)
class CallResult:
    """What one call produced, already classified. `retry_after` is the server's hint in seconds, if any."""

    classification: Classification
    status: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    retry_after: float | None = None

    @property
    def error_code(self) -> str | None:
        code = self.body.get("errorCode") if self.body else None
        return str(code) if code else None


class RemoteCaller(Protocol):
    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        """POST `body` for `step` within `timeout` s; a remote failure is returned classified, not raised."""
        ...


def parse_retry_after(headers: Mapping[str, str]) -> float | None:  # aiohttp: a case-insensitive CIMultiDictProxy
    """Seconds to wait from `Retry-After` (delta-seconds) or `retry-after-ms` / `x-ms-retry-after-ms`.

    Conformance: same header precedence as azure-core `pipeline/policies/_utils.py:get_retry_after`
    (Retry-After first, then the two millisecond headers). HTTP-date values are ignored (treated as no hint).
    """
    value = headers.get("Retry-After")
    if value:
        return _non_negative(value, 1.0)
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        value = headers.get(name)
        if value:
            return _non_negative(value, 1000.0)
    return None


def _non_negative(value: str, per_second: float) -> float | None:
    try:
        return max(0.0, float(value) / per_second)
    except ValueError:
        return None


class HttpRemoteCaller:
    """`RemoteCaller` over aiohttp: POST {base_url}/steps/{step}; the JSON body is returned as is."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")

    async def call(self, step: str, body: dict[str, Any], timeout: float) -> CallResult:
        url = f"{self._base_url}/steps/{step}"
        # OpenTelemetry HTTP client semantic conventions: method, URL, status code.
        with tracing.span(
            "orderflow.agent.remote_call",
            kind=tracing.SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                "url.full": url,
                **tracing.order_attributes(body.get("orderId"), step=step),
            },
        ) as span:
            result = await self._post(url, body, timeout)
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            span.set_attribute("orderflow.classification", result.classification.value)
            return result

    async def _post(self, url: str, body: dict[str, Any], timeout: float) -> CallResult:
        try:
            async with self._session.post(
                url, json=body, headers=tracing.inject(), timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                payload = await _json_object(resp)
                return CallResult(
                    classify(resp.status),
                    resp.status,
                    payload,
                    error=None if resp.status < 300 else _describe(resp.status, payload),
                    retry_after=parse_retry_after(resp.headers),
                )
        except Exception as exc:  # noqa: BLE001 - every failure is classified, none escapes
            return CallResult(classify(exc), error=f"{type(exc).__name__}: {exc}".rstrip(": "))


async def _json_object(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The response's JSON object, or {} for an empty, non-JSON or non-object body (a proxy's HTML 503)."""
    text = await resp.text()
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(status: int, payload: dict[str, Any]) -> str:
    detail = payload.get("error") or payload.get("errorCode") or ""
    return f"HTTP {status} {detail}".strip()
