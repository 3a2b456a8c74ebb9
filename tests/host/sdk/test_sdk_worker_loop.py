"""WorkerLoop: functions that settle through ServiceBusMessageActions must run off the host loop, or the
settlement they wait for can never run there (the gRPC client in serviceBusMessageActions.py is blocking)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError
from support.servicebus_sdk import HostLoop, in_flight

from devhost.sdk_servicebus import (
    DeliveryRegistry,
    SettlementServer,
    WorkerLoop,
    configure_message_actions,
    to_sdk_message,
)


@pytest.fixture
def worker() -> Iterator[WorkerLoop]:
    with WorkerLoop(max_workers=2) as w:
        yield w


async def settling_async_function(msg: Any) -> str:
    ServiceBusMessageActions.get_instance().complete(msg)
    return threading.current_thread().name


def settling_sync_function(msg: Any) -> str:
    ServiceBusMessageActions.get_instance().complete(msg)
    return threading.current_thread().name


@pytest.mark.parametrize("function", [settling_async_function, settling_sync_function])
def test_function_run_by_the_worker_loop_settles(
    settlement: SettlementServer,
    registry: DeliveryRegistry,
    host_loop: HostLoop,
    worker: WorkerLoop,
    function: Any,
) -> None:
    delivery = in_flight(registry)
    ran_on = host_loop.run(worker.call(function, msg=to_sdk_message(delivery.message)))
    assert ran_on.startswith("functions-worker") and ran_on != host_loop.thread.name
    assert delivery.settled and [c[0] for c in delivery.receiver.calls] == ["complete"]


def test_function_errors_propagate(host_loop: HostLoop, worker: WorkerLoop) -> None:
    async def failing() -> None:
        raise LookupError("order o-1 unknown")

    with pytest.raises(LookupError, match="o-1"):
        host_loop.run(worker.call(failing))


def test_settling_on_the_host_loop_fails_bounded_and_never_settles_late(
    registry: DeliveryRegistry, host_loop: HostLoop, isolated_argv: list[str]
) -> None:
    delivery = in_flight(registry)
    with SettlementServer(registry.lookup, host_loop.loop, settle_timeout_s=0.3) as server:
        configure_message_actions(server.port)
        with pytest.raises(SettlementError) as info:  # the function blocks the loop the settlement needs
            host_loop.run(settling_async_function(to_sdk_message(delivery.message)))
        assert info.value.original.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(3):  # give the unblocked loop a few turns: the abandoned settlement must not run
            host_loop.run(asyncio.sleep(0))
    assert not delivery.settled and delivery.receiver.calls == []
