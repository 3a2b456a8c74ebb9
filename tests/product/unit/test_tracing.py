"""Trace context across the hops of an order (orderflow/tracing.py, docs/telemetry.md): W3C `traceparent` in message
application properties and in the Agent request and reply, through the state record into the Starter, through the
Scheduler's input into each activity, and to the remote service as an HTTP header.

Spans are collected with the SDK's InMemorySpanExporter on a TracerProvider of the test's own (installed as
`orderflow.tracing._tracer`, so no process-wide provider is set); propagation itself goes through the OpenTelemetry
API's context, as in production.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from azure.servicebus import ServiceBusMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.integration_support import Pipeline, RecordingStartNew, encode, order_body, state_of
from support.product_app import user_function

from agent.handler import Outbox, RequestHandler
from agent.remote import HttpRemoteCaller
from agent.retry import RetryPolicy
from orderflow import function_names as fn
from orderflow import tracing
from orderflow.messages import AgentReply, AgentRequest, StepName, idempotency_key, parse_message
from orderflow.records import format_utc
from orderflow.starter import run_starter
from orderflow.submission import Accepted, submit
from orderflow.workflow import WORKFLOW_VERSION, WorkflowInput

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer(tracing.TRACER_NAME))
    yield exporter
    provider.shutdown()


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def trace_id(span: ReadableSpan) -> int:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.trace_id


# --- propagation -------------------------------------------------------------------------------------------------


def test_inject_then_extract_round_trips_the_current_span(spans: InMemorySpanExporter) -> None:
    with tracing.span("sender") as sender:
        properties = tracing.inject({"other": "kept"})
        current = tracing.current_traceparent()
    ctx = sender.get_span_context()
    assert properties == {"other": "kept", "traceparent": current}
    assert current == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    for carried in (properties, {b"traceparent": current.encode()}, current):  # as Service Bus returns properties
        extracted = trace.get_current_span(tracing.extract(carried)).get_span_context()
        assert (extracted.trace_id, extracted.span_id, extracted.is_remote) == (ctx.trace_id, ctx.span_id, True)
    with tracing.span("receiver", parent=properties) as receiver:
        pass
    assert (
        receiver.get_span_context().trace_id == ctx.trace_id and parent_id(named(spans, "receiver")[0]) == ctx.span_id
    )


@pytest.mark.parametrize(
    "properties",
    [
        None,
        {},
        {"other": "x"},
        {"traceparent": "00-zz-yy-01"},
        {"traceparent": f"00-{0:032x}-{SPAN_ID:016x}-01"},
        {"traceparent": f"ff-{TRACE_ID:032x}-{SPAN_ID:016x}-01"},
    ],
)
def test_a_message_without_a_usable_traceparent_starts_a_new_root(
    spans: InMemorySpanExporter, properties: dict[str, str] | None
) -> None:
    assert tracing.extract(properties) is None
    with tracing.span("earlier"):
        pass
    with tracing.span("hop", parent=properties):
        pass
    [earlier], [hop] = named(spans, "earlier"), named(spans, "hop")
    assert hop.parent is None and trace_id(hop) != trace_id(earlier)


def test_a_stored_traceparent_or_the_fallback_is_the_parent(spans: InMemorySpanExporter) -> None:
    with tracing.span("from record", parent=TRACEPARENT):
        pass
    with tracing.span("from body", parent={"unrelated": "1"}, fallback=TRACEPARENT):
        pass
    with tracing.span("outer") as outer, tracing.span("inner", parent=None):
        pass
    for name in ("from record", "from body"):
        [hop] = named(spans, name)
        assert (
            (trace_id(hop), parent_id(hop)) == (TRACE_ID, SPAN_ID) and hop.parent is not None and hop.parent.is_remote
        )
    [inner] = named(spans, "inner")  # no parent given: a child of the current span
    assert parent_id(inner) == outer.get_span_context().span_id


def test_without_an_sdk_nothing_is_added_and_a_parent_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", trace.NoOpTracer())
    with tracing.span("untraced"):
        assert tracing.current_traceparent() is None and tracing.inject() == {} and not tracing.in_trace()
    with tracing.span("passed on", parent={"traceparent": TRACEPARENT}):
        assert tracing.current_traceparent() == TRACEPARENT  # W3C: forward the context even when not tracing
        assert tracing.inject() == {"traceparent": TRACEPARENT}


# --- message and input fields ------------------------------------------------------------------------------------

AT = datetime(2030, 1, 1, tzinfo=UTC)


def agent_request(**fields: Any) -> AgentRequest:
    return AgentRequest(
        instance_id="o-1:1",
        order_id="o-1",
        attempt=1,
        step=StepName.CHARGE_PAYMENT,
        idempotency_key=idempotency_key("o-1", "charge-payment"),
        deadline=AT + timedelta(hours=1),
        reply_to="agent-replies",
        **fields,
    )


def test_the_agent_request_and_reply_carry_traceparent_optionally_without_a_new_schema_version() -> None:
    plain = agent_request()
    assert "traceparent" not in plain.to_dict() and "traceparent" not in plain.to_json()  # as before the field
    assert parse_message(AgentRequest, "AgentRequest", plain.to_json()).traceparent is None
    traced = agent_request(traceparent=TRACEPARENT)
    assert traced.schema_version == 1 and traced.to_dict()["traceparent"] == TRACEPARENT
    assert parse_message(AgentRequest, "AgentRequest", traced.to_json()).traceparent == TRACEPARENT
    # Unusable trace context is dropped, never a reason to dead-letter the request (W3C: ignore, restart the trace).
    for bad in ("junk", 42, f"00-{0:032x}-{SPAN_ID:016x}-01", TRACEPARENT.upper()):
        body = json.dumps({**plain.to_dict(), "traceparent": bad})
        assert parse_message(AgentRequest, "AgentRequest", body).traceparent is None
    reply = AgentReply(
        instance_id="o-1:1",
        order_id="o-1",
        attempt=1,
        step=StepName.CHARGE_PAYMENT,
        outcome="succeeded",
        completed_at=AT,
    )
    assert "traceparent" not in reply.to_dict()
    carried = reply.model_copy(update={"traceparent": TRACEPARENT})
    assert AgentReply.from_event(carried.to_json()).traceparent == TRACEPARENT  # as the Scheduler reads it


def test_the_scheduler_input_carries_traceparent_and_leaves_it_out_when_none() -> None:
    base = WorkflowInput(order_id="o-1", attempt=1, step_timeout_seconds=10, workflow_version=WORKFLOW_VERSION)
    assert "traceparent" not in base.to_dict()  # an input without trace context is what it was before the field
    traced = base.model_copy(update={"traceparent": TRACEPARENT})
    assert WorkflowInput.model_validate(traced.to_dict()).traceparent == TRACEPARENT


# --- the hops ----------------------------------------------------------------------------------------------------


async def test_submission_starter_and_activity_join_one_trace(p: Pipeline, spans: InMemorySpanExporter) -> None:
    """Submission → state record → Starter claim and start → the Scheduler's input → the activity → the Agent
    request (its field and its application property)."""
    with tracing.span("orderflow.submission") as submission:
        assert isinstance(await submit(p.services, encode(order_body("o-1")), "o-1"), Accepted)
    record = await state_of(p, "o-1")
    assert record.traceparent == traceparent_of(named(spans, "orderflow.submission")[0])
    start_new = RecordingStartNew()
    await run_starter(p.services, start_new)  # outside any span: the record carries the trace
    [claim], [start] = named(spans, "orderflow.starter.claim"), named(spans, "orderflow.starter.start")
    root = submission.get_span_context()
    assert {trace_id(claim), trace_id(start)} == {root.trace_id}
    assert parent_id(claim) == parent_id(start) == root.span_id
    [(_, _, inp)] = start_new.calls
    assert inp["traceparent"] == traceparent_of(start)

    # The Scheduler hands its input's traceparent to the activity (orchestrators/order_workflow.py, version 3).
    await user_function(fn.ADVANCE_ORDER)(
        {
            "orderId": "o-1",
            "instanceId": "o-1:1",
            "attempt": 1,
            "workflowVersion": WORKFLOW_VERSION,
            "agentRetries": 4,
            "completeBy": format_utc(p.clock.now() + timedelta(seconds=10)),
            "result": None,
            "cancel": False,
            "traceparent": inp["traceparent"],
        }
    )
    [activity] = named(spans, f"orderflow.activity.{fn.ADVANCE_ORDER}")
    assert trace_id(activity) == root.trace_id and parent_id(activity) == start.get_span_context().span_id
    assert activity.attributes is not None and activity.attributes[tracing.STEP] == "reserve-inventory"
    async with p.services.bus.get_queue_receiver(
        p.services.tunables.agent_requests_queue, session_id="o-1"
    ) as receiver:
        [message] = await receiver.peek_messages(max_message_count=5)
    sent = AgentRequest.model_validate_json(b"".join(message.body))
    properties = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (message.application_properties or {}).items()
    }
    assert sent.traceparent == properties["traceparent"] == traceparent_of(activity)


@dataclass
class Sent:
    messages: list[ServiceBusMessage] = field(default_factory=list)

    async def send_messages(self, message: ServiceBusMessage) -> None:
        self.messages.append(message)


@dataclass
class Received:
    body: bytes
    application_properties: dict[Any, Any] | None
    session_id: str = "o-1"
    message_id: str = "o-1:1:charge-payment"
    completed: bool = False


class Settler:
    async def complete_message(self, message: Received) -> None:
        message.completed = True

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None:
        raise AssertionError("not poison")


class Clock:
    def now(self) -> datetime:
        return AT

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("no retries here")


@pytest.fixture
async def remote() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A remote service on 127.0.0.1 that records each request's headers and answers 200."""
    seen: list[dict[str, str]] = []

    async def step(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/steps/{step}", step)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("carrier", ["properties", "body"])
async def test_the_agent_handles_in_the_requests_trace_calls_with_the_header_and_replies_with_its_span(
    spans: InMemorySpanExporter, remote: tuple[str, list[dict[str, str]]], carrier: str
) -> None:
    url, seen = remote
    request = agent_request(traceparent=TRACEPARENT if carrier == "body" else None)
    message = Received(
        request.to_json().encode(), {b"traceparent": TRACEPARENT.encode()} if carrier == "properties" else None
    )
    replies = Sent()
    async with aiohttp.ClientSession() as http:
        handler = RequestHandler(
            HttpRemoteCaller(http, url),
            Outbox(replies, Sent(), "agent-replies", "agent-requests"),
            RetryPolicy(),
            Clock(),
        )
        await handler.handle(Settler(), message)
    [handle], [call] = named(spans, "orderflow.agent.handle"), named(spans, "orderflow.agent.remote_call")
    assert (trace_id(handle), parent_id(handle)) == (TRACE_ID, SPAN_ID)  # the sender's span, in another process
    assert trace_id(call) == TRACE_ID and parent_id(call) == handle.get_span_context().span_id
    assert (
        call.kind is trace.SpanKind.CLIENT
        and call.attributes is not None
        and call.attributes["http.response.status_code"] == 200
    )
    [headers] = seen
    assert headers["traceparent"] == traceparent_of(call)  # the remote service can join the trace
    [reply_message] = replies.messages
    reply = AgentReply.model_validate_json(b"".join(reply_message.body))
    assert reply_message.application_properties is not None
    assert reply.traceparent == reply_message.application_properties["traceparent"] == traceparent_of(handle)
    assert message.completed
