"""Trace context across every hop of an order: one trace per order (docs/telemetry.md).

The W3C trace context (`traceparent`, and `tracestate` when there is one) travels where each hop can carry it: a
Service Bus message's application properties (the names azure-servicebus `_common/tracing.py` uses), the Agent
request's and reply's `traceparent` field, the state record (submission to Starter), the Scheduler's input and each
activity's input, and the HTTP `traceparent` header to the remote service. The Scheduler opens no span.
Only the OpenTelemetry API is used: with no SDK provider every span is a no-op and an incoming parent is passed on
unchanged. A malformed `traceparent` is ignored and the hop starts a new trace (W3C Trace Context, "traceparent
Header"); trace context never makes a message invalid. Each hop and why: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from opentelemetry.trace import SpanKind as SpanKind  # re-exported: callers name span kinds through this module
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

TRACER_NAME = "orderflow"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# Span attributes every hop of an order sets, so its spans can be found (App Insights: customDimensions).
ORDER_ID = "orderflow.order_id"
INSTANCE_ID = "orderflow.instance_id"
STEP = "orderflow.step"

# W3C explicitly, whatever OTEL_PROPAGATORS says: the property names are part of the message contract.
_W3C = TraceContextTextMapPropagator()
# A ProxyTracer: it follows the global TracerProvider whenever one is set (tests may replace it).
_tracer: trace.Tracer = trace.get_tracer(TRACER_NAME)


def _text(value: object) -> str | None:
    """A property key or value as text: Service Bus hands AMQP properties back as bytes or str."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _carrier(source: str | Mapping[Any, Any] | None) -> dict[str, str]:
    """The W3C fields of a stored traceparent (str) or of a message's properties / HTTP headers (a mapping)."""
    if source is None:
        return {}
    if isinstance(source, str):
        return {TRACEPARENT: source}
    out: dict[str, str] = {}
    for key, value in source.items():
        name = _text(key)
        if name is not None and name.lower() in (TRACEPARENT, TRACESTATE):
            text = _text(value)
            if text:
                out[name.lower()] = text
    return out


def extract(source: str | Mapping[Any, Any] | None) -> Context | None:
    """The remote parent named by a traceparent or by a message's application properties; None when there is none or
    it is malformed (the caller then starts a new trace)."""
    carrier = _carrier(source)
    if TRACEPARENT not in carrier:
        return None
    context = _W3C.extract(carrier, context=Context())
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject(properties: dict[Any, Any] | None = None) -> dict[Any, Any]:
    """`properties` (a new dict if None) with the current span's `traceparent` (and `tracestate`) added; unchanged
    when there is no current trace."""
    carrier: dict[Any, Any] = {} if properties is None else properties
    if trace.get_current_span().get_span_context().is_valid:
        _W3C.inject(carrier)
    return carrier


def current_traceparent() -> str | None:
    """The current span's traceparent, to store or to send; None outside any trace."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"


def in_trace() -> bool:
    """Whether a span (recorded or passed through) is current."""
    return trace.get_current_span().get_span_context().is_valid


@contextmanager
def span(
    name: str,
    *,
    parent: str | Mapping[Any, Any] | None = None,
    fallback: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
) -> Iterator[Span]:
    """A span of one hop, made current. Its parent: `parent` (a stored traceparent, or a message's application
    properties), else `fallback` (e.g. the traceparent field of the same message), else the current span; with none
    of them it is the root of a new trace (a message that came without trace context)."""
    context = extract(parent) or extract(fallback)
    with _tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes) as current:
        yield current


def order_attributes(order_id: str | None, instance_id: str | None = None, step: str | None = None) -> dict[str, str]:
    """The span attributes that say which order (attempt, step) a span is about; None values are left out."""
    values = {ORDER_ID: order_id, INSTANCE_ID: instance_id, STEP: step}
    return {k: v for k, v in values.items() if v is not None}
