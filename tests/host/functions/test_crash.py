"""Crash recovery: `kill -9` of a real devhost process in the middle of 20 running orchestrations and a Service Bus
trigger burst; after a restart every instance completes and every message is processed at least once.

Sources: Durable Functions reliability
(learn.microsoft.com/azure/azure-functions/durable/durable-functions-orchestrations,
seed 004: event-sourced history, at-least-once activity execution, replay after a host crash); Service Bus peek-lock
(a message whose lock expires after a consumer died is delivered again).
"""

from __future__ import annotations

import time

import aiohttp
from azure.servicebus import ServiceBusMessage
from support.hosted import HostedSample, wait_until

INSTANCES = [f"crash-{i:02d}" for i in range(20)]
MESSAGES = [f"burst-{i:03d}" for i in range(60)]


async def _start_all(host: HostedSample) -> None:
    async with aiohttp.ClientSession() as s:
        for instance in INSTANCES:
            async with s.post(
                f"{host.url}/api/orchestrators/slow_chain/{instance}?code={host.function_key()}", json=0.4
            ) as r:
                assert r.status == 202


async def _statuses(host: HostedSample) -> dict[str, str]:
    async with aiohttp.ClientSession() as s:
        out = {}
        for instance in INSTANCES:
            async with s.get(f"{host.url}/runtime/webhooks/durabletask/instances/{instance}") as r:
                out[instance] = (await r.json())["runtimeStatus"] if r.status in (200, 202) else str(r.status)
        return out


async def test_kill_9_mid_flight_loses_no_instance_and_no_message(make_host) -> None:  # type: ignore[no-untyped-def]
    host = make_host().start()
    await _start_all(host)
    with host.bus.get_queue_sender("work") as sender:
        sender.send_messages([ServiceBusMessage(f"slow {m}", message_id=m) for m in MESSAGES])
    # Kill once the work is under way but far from done.
    wait_until(lambda: len(host.records("activity")) >= 5 and len(host.records("work")) >= 5, what="work under way")
    host.process.kill()
    done_before = {r["instance"] for r in host.records("activity") if r["i"] == 2}
    worked_before = {r["id"] for r in host.records("work")}
    assert len(done_before) < len(INSTANCES) and len(worked_before) < len(MESSAGES), "killed too late to prove much"

    host.start()  # same state dir and broker file
    deadline = time.monotonic() + 90
    while True:
        statuses = await _statuses(host)
        if all(s == "Completed" for s in statuses.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert statuses == {i: "Completed" for i in INSTANCES}
    worked = wait_until(
        lambda: {r["id"] for r in host.records("work")} >= set(MESSAGES) and {r["id"] for r in host.records("work")},
        timeout=60,
        what="every message processed",
    )
    assert worked == set(MESSAGES)
    # At-least-once: every activity of every instance ran, some possibly twice (interrupted by the kill).
    for instance in INSTANCES:
        steps = {r["i"] for r in host.records("activity") if r["instance"] == instance}
        assert steps == {0, 1, 2}
