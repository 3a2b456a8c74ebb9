"""Integration support: the order pipeline's domain core in-process, on the embedded SQLite store and
embedded broker, with an injected `FakeClock` and `orderflow.runtime.Services` built by hand (no devhost).

`Pipeline` reads what the pipeline sent (status messages per order on the reply queue, operator alerts) by
peeking, so a test can assert both what was sent and that nothing was; the metric helpers read an in-
memory OpenTelemetry reader.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus

from orderflow.adapters import aio_bus_from_connection_string
from orderflow.clock import FakeClock
from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import OperatorAlert, StatusMessage, SubmitOrder
from orderflow.runtime import Services, Tunables
from orderflow.starter import DurableStarts, run_starter
from orderflow.submission import Accepted, submit

ROOT = Path(__file__).resolve().parents[2]
REPLY_QUEUE = "app-status"
ALERTS_QUEUE = "operator-alerts"


def tunables(**overrides: Any) -> Tunables:
    """The documented defaults (orderflow.settings), with short test overrides."""
    base = Tunables.from_env(
        {
            "ClaimLeaseSeconds": "30",
            "StepTimeoutSeconds": "10",
            "RetryBackoffBaseSeconds": "2",
            "RetryBackoffMaxSeconds": "60",
        }
    )
    return replace(base, **overrides)


def order_body(order_id: str, *, reply_to: str = REPLY_QUEUE, quantity: Any = 2, **fields: Any) -> dict[str, Any]:
    """A valid SubmitOrder as the client sends it (JSON-ready), with fields overridable."""
    order = SubmitOrder.model_validate(
        {
            "orderId": "placeholder",
            "replyTo": REPLY_QUEUE,
            "customer": {"id": "c-1", "name": "Ada"},
            "items": [{"sku": "SKU-001", "quantity": 2, "unitPrice": "9.99"}],
            "currency": "EUR",
            "submittedAt": "2024-01-01T00:00:00+00:00",
        }
    ).to_dict()
    order["items"][0]["quantity"] = quantity
    order.update({"orderId": order_id, "replyTo": reply_to, **fields})
    return order


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


@dataclass
class Pipeline:
    """One in-process deployment: its services, clock and the paths shared with a peer deployment."""

    services: Services
    clock: FakeClock
    store_path: Path
    bus_connection: str
    peers: list[Services] = field(default_factory=list)

    async def statuses(self, order_id: str) -> list[StatusMessage]:
        """Every status message sent to the order's session on the reply queue (peeked, left in place)."""
        async with self.services.bus.get_queue_receiver(REPLY_QUEUE, session_id=order_id) as receiver:
            msgs = await receiver.peek_messages(max_message_count=100)
        return [StatusMessage.model_validate_json(b"".join(m.body)) for m in msgs]

    async def alerts(self) -> list[OperatorAlert]:
        async with self.services.bus.get_queue_receiver(ALERTS_QUEUE) as receiver:
            msgs = await receiver.peek_messages(max_message_count=1000)
        return [OperatorAlert.model_validate_json(b"".join(m.body)) for m in msgs]

    async def peer(self, **overrides: Any) -> Services:
        """A second deployment (another Functions instance) on the same store file and broker, same clock."""
        orders, state = open_sqlite_stores(self.store_path)
        peer = Services(
            orders=orders,
            state=state,
            bus=aio_bus_from_connection_string(self.bus_connection),
            tunables=replace(self.services.tunables, **overrides),
            clock=self.clock,
        )
        self.peers.append(peer)
        return peer

    async def aclose(self) -> None:
        for services in (self.services, *self.peers):
            await services.bus.close()
            await services.state.aclose()


async def open_pipeline(tmp_path: Path) -> Pipeline:
    """A fresh deployment on `tmp_path/store.db` and `tmp_path/bus.db` (the repo's queue config)."""
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={ROOT / 'servicebus.config.json'}"
    orders, state = open_sqlite_stores(tmp_path / "store.db")
    clock = FakeClock()
    services = Services(
        orders=orders, state=state, bus=aio_bus_from_connection_string(conn), tunables=tunables(), clock=clock
    )
    return Pipeline(services, clock, tmp_path / "store.db", conn)


@dataclass
class RecordingStartNew:
    """A fake `DurableOrchestrationClient.start_new`: records calls; optionally fails like a crashed host."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, name: str, instance_id: str, inp: Any) -> str:
        await asyncio.sleep(0)  # yield, so that concurrent starters interleave
        if self.fail:
            raise ConnectionError("host unreachable after the claim")
        self.calls.append((name, instance_id, inp))
        return instance_id

    @property
    def instances(self) -> list[str]:
        return [instance for _, instance, _ in self.calls]


@dataclass
class FakeDurable:
    """The Supervisor's Durable client calls over a RecordingStartNew: an instance exists once it was started.

    `get_status` of an unknown id answers what azure-functions-durable 1.x's DurableOrchestrationClient.get_status
    makes of the extension's bodiless 404: DurableOrchestrationStatus.from_json(""), a status without runtime_status.
    """

    starts: RecordingStartNew = field(default_factory=RecordingStartNew)
    running: set[str] = field(default_factory=set)  # instances started outside `starts` (another host)
    unreachable: bool = False

    async def get_status(self, instance_id: str) -> DurableOrchestrationStatus:
        if self.unreachable:
            raise ConnectionError("Durable HTTP API unreachable")
        if instance_id in self.running or instance_id in self.starts.instances:
            return DurableOrchestrationStatus.from_json({"instanceId": instance_id, "runtimeStatus": "Running"})
        return DurableOrchestrationStatus.from_json("")

    def client(self) -> DurableStarts:
        return DurableStarts(self.starts, self.get_status)


async def submit_orders(p: Pipeline, *order_ids: str) -> None:
    for order_id in order_ids:
        assert isinstance(await submit(p.services, encode(order_body(order_id)), order_id), Accepted)


async def state_of(p: Pipeline, order_id: str) -> Any:
    found = await p.services.state.get(order_id)
    assert found is not None
    return found[0]


async def claim_orders(p: Pipeline, *order_ids: str) -> RecordingStartNew:
    """Submit the orders and let one Starter claim them (attempt 1, CompleteBy = now + the claim lease)."""
    await submit_orders(p, *order_ids)
    start = RecordingStartNew()
    run = await run_starter(p.services, start)
    assert sorted(run.claimed) == sorted(f"{o}:1" for o in order_ids)
    return start


MetricPoints = Callable[[], dict[str, list[Any]]]  # tests/conftest.py `metric_points`: name → data points


def count_state_writes(p: Pipeline, *methods: str) -> list[str]:
    """Every call from now on of the state store's write `methods` (default: the record's replace, what
    update_with_retry writes, and put_checkpoint, the admission figures), by method name, in order."""
    writes: list[str] = []
    store = p.services.state

    def counted(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            writes.append(name)
            return await call(*args, **kwargs)

        return run

    for name in methods or ("replace", "put_checkpoint"):
        setattr(store, name, counted(name, getattr(store, name)))
    return writes


def counter_value(points: MetricPoints, name: str, **attributes: Any) -> float:
    """The cumulative value of counter `name` over the data points whose attributes match."""
    return sum(p.value for p in points().get(name, []) if all(p.attributes.get(k) == v for k, v in attributes.items()))


def histogram_count(points: MetricPoints, name: str) -> int:
    """How many values histogram `name` recorded so far."""
    return sum(p.count for p in points().get(name, []))


# ---- compensation and cancel (tests/product/integration/test_compensation.py, test_cancel.py) ---------------------


def state_activity(name: str) -> Callable[..., Any]:
    """A Scheduler activity (activities/) as the worker calls it, from its blueprint (the activities read
    their services with get_services(): install the pipeline's with `orderflow.runtime.use_services` first)."""
    from support.product_app import user_function

    return user_function(name)


async def run_action(
    p: Pipeline,
    order_id: str,
    instance: str,
    action: str,
    status: str | None = "succeeded",
    *,
    undone: bool | None = None,
    honours_cancel: bool = True,
    error: str | None = None,
) -> Any:
    """What the version-2 Scheduler does for one step or compensation, through the real activities: SET_STEP_DEADLINE
    (CompleteBy = now + StepTimeout), then, unless `status` is None (the request is in flight) or the deadline call
    did not answer True, RECORD_STEP_RESULT. Returns SET_STEP_DEADLINE's answer."""
    from orderflow import function_names as fn
    from orderflow.records import format_utc
    from orderflow.workflow import WORKFLOW_VERSION

    complete_by = p.clock.now() + p.services.tunables.step_timeout
    fenced = await state_activity(fn.SET_STEP_DEADLINE)(
        {
            "orderId": order_id,
            "instanceId": instance,
            "step": action,
            "completeBy": format_utc(complete_by),
            "workflowVersion": WORKFLOW_VERSION,
            "honoursCancel": honours_cancel,
        }
    )
    if fenced is True and status is not None:
        assert (
            await state_activity(fn.RECORD_STEP_RESULT)(
                {
                    "orderId": order_id,
                    "instanceId": instance,
                    "step": action,
                    "status": status,
                    "error": error,
                    "undone": undone,
                }
            )
            is True
        )
    return fenced
