"""One trace per order, across every process that took part (issue 14, Telemetry; docs/telemetry.md).

The local system runs as OS processes (devhost with function_app.py, the Agent, the simulator), each with a span
capture installed at start-up by tests/support/otel_capture/sitecustomize.py: the OpenTelemetry SDK with a
SimpleSpanProcessor that appends every ended span as a JSON line to `<dir>/<pid>.jsonl`. The product configures no
exporter (no APPLICATIONINSIGHTS_CONNECTION_STRING, no OTEL_*_EXPORTER), so its spans land there.

One order is submitted and completed; then its spans, read from every process's file, must form a single trace with
the expected hops: submission → Starter → an activity per step → the Agent's handling (another process) → the remote
call → the reply trigger → the terminal status, each hop's parent inside the same trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.e2e_support import FAST_SETTINGS, Client, make_order, new_order_id, running_client
from support.hosted import wait_until

from lab.system import SystemConfig
from orderflow.messages import STEPS, OrderStatus
from orderflow.tracing import ORDER_ID, STEP

CAPTURE = Path(__file__).resolve().parents[2] / "support" / "otel_capture"
STEP_NAMES = {s.value for s in STEPS}


@dataclass(frozen=True)
class Captured:
    client: Client
    spans_dir: Path

    def spans(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.spans_dir.glob("*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return out


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    work = tmp_path_factory.mktemp("trace")
    spans_dir = work / "spans"
    spans_dir.mkdir()
    pythonpath = os.pathsep.join(p for p in (str(CAPTURE), os.environ.get("PYTHONPATH")) if p)
    # The timer poll never fires (01-01 00:00): the order starts through the submission's fast path, so the test
    # does not wait for a poll. Long step timeouts: a slow machine must not time a step out into a second attempt.
    config = SystemConfig(
        work_dir=work,
        seed=11,
        latency_ms_mean=2.0,
        settings={
            **FAST_SETTINGS,
            "StarterSchedule": "0 0 0 1 1 *",
            "StepTimeoutSeconds": "20",
            "ClaimLeaseSeconds": "20",
            "PYTHONPATH": pythonpath,
            "ORDERFLOW_OTEL_CAPTURE_DIR": str(spans_dir),
        },
    )
    with running_client(config) as client:
        yield Captured(client, spans_dir)


def _hops(spans: list[dict[str, Any]], order_id: str) -> dict[str, list[dict[str, Any]]]:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        if span["attributes"].get(ORDER_ID) == order_id:
            by_name.setdefault(span["name"], []).append(span)
    return by_name


def _complete(hops: dict[str, list[dict[str, Any]]]) -> bool:
    """Every hop of a three-step order has ended (the terminal status span ends after the status was sent)."""
    return (
        len(hops.get("orderflow.agent.handle", [])) >= len(STEPS)
        and len(hops.get("orderflow.agent_reply", [])) >= len(STEPS)
        and "orderflow.terminal_status" in hops
    )


@pytest.mark.slow
def test_one_orders_spans_from_every_process_form_a_single_trace_with_the_expected_hops(captured: Captured) -> None:
    client = captured.client
    order_id = new_order_id("trace")
    client.submit(make_order(order_id))
    client.wait_status(order_id, OrderStatus.COMPLETED, timeout=30)
    wait_until(lambda: _complete(_hops(captured.spans(), order_id)), 15, f"every span of {order_id} to end")

    spans = captured.spans()
    hops = _hops(spans, order_id)
    # All spans about the order share one trace, and that trace holds nothing but this order's hops.
    trace_ids = {s["trace_id"] for group in hops.values() for s in group}
    assert len(trace_ids) == 1, {name: {s["trace_id"] for s in group} for name, group in hops.items()}
    (trace_id,) = trace_ids
    trace = {s["span_id"]: s for s in spans if s["trace_id"] == trace_id}

    # The hops: submission → Starter → activities → Agent → remote call → reply trigger → terminal status.
    (submission,) = hops["orderflow.submission"]
    (start,) = hops["orderflow.starter.start"]
    activities = hops["orderflow.activity.advance_order"]
    handles = hops["orderflow.agent.handle"]
    calls = hops["orderflow.agent.remote_call"]
    replies = hops["orderflow.agent_reply"]
    (terminal,) = hops["orderflow.terminal_status"]
    assert {s["attributes"][STEP] for s in activities} >= STEP_NAMES  # at least one activity per step
    assert {s["attributes"][STEP] for s in handles} == STEP_NAMES
    assert {s["attributes"][STEP] for s in calls} == STEP_NAMES
    assert {s["attributes"][STEP] for s in replies} == STEP_NAMES

    # Parent links stay inside the trace; the submission is its only root.
    roots = [s for s in trace.values() if s["parent_span_id"] is None]
    assert roots == [submission], [s["name"] for s in roots]
    assert all(s["parent_span_id"] in trace for s in trace.values() if s is not submission)
    parent = {s["span_id"]: trace[s["parent_span_id"]] for s in trace.values() if s is not submission}
    assert parent[start["span_id"]] is submission
    assert all(parent[a["span_id"]] is start for a in activities)  # through the Scheduler's input
    devhost = submission["pid"]
    assert {s["pid"] for s in (start, *activities, *replies, terminal)} == {devhost}
    # The Agent is another process; each handling span's parent is the activity that sent its request, carried in
    # the request message.
    assert {h["pid"] for h in handles} != {devhost} and len({h["pid"] for h in handles}) == 1
    for handle in handles:
        sender = parent[handle["span_id"]]
        assert (
            sender["name"] == "orderflow.activity.advance_order"
            and sender["attributes"][STEP] == handle["attributes"][STEP]
        )
        assert handle["parent_remote"] is True
    for call in calls:
        assert parent[call["span_id"]]["name"] == "orderflow.agent.handle"
        assert call["kind"] == "CLIENT" and call["attributes"]["http.response.status_code"] == 200
    # Each reply trigger's parent is the Agent's handling of the same step (carried in the reply message).
    for reply in replies:
        handled = parent[reply["span_id"]]
        assert handled["name"] == "orderflow.agent.handle" and handled["attributes"][STEP] == reply["attributes"][STEP]
    # The terminal status is sent within the activity that ended the order.
    assert parent[terminal["span_id"]]["name"] == "orderflow.activity.advance_order"
    assert terminal["attributes"]["orderflow.status"] == OrderStatus.COMPLETED.value
