"""The Starter's fast path: an order's Scheduler starts right after its submission, not at the next timer poll.

README "Starter: fast path right after submission + timer poll (safety net)": triggers/submission.py claims the
new record and calls `start_new` itself (orderflow.starter.start_one); the timer poll (triggers/starter.py) only
picks up what the fast path missed. Here the timer poll cannot run during the test (its schedule fires once a year),
so an order starts only through the fast path, and it must start promptly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support.e2e_support import FAST_SETTINGS, Client, make_order, new_order_id, running_client
from support.hosted import wait_until

from lab.system import SystemConfig
from orderflow.messages import OrderStatus
from orderflow.records import ProcessState

# 00:00:00 UTC on 1 January: the Starter's timer poll never fires while this test runs (use_monitor=False on the
# Starter, so no past-due run at start either).
POLL_NEVER = "0 0 0 1 1 *"
# Bound on submission → the Scheduler's instance exists. Measured 0.10-0.15 s (4 orders in 2 runs, 2-core machine
# shared with other test runs); the bound leaves a hundredfold margin for a loaded machine. Without the fast path the
# instance never appears (nothing else claims a Pending record), so the margin costs nothing in sensitivity.
START_BOUND_SECONDS = 15.0
ORDERS = 2


@pytest.fixture(scope="module")
def no_poll_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    config = SystemConfig(
        work_dir=tmp_path_factory.mktemp("fastpath"),
        seed=3,
        latency_ms_mean=2.0,
        settings={
            **FAST_SETTINGS,
            "StarterSchedule": POLL_NEVER,
            "StepTimeoutSeconds": "20",
            "ClaimLeaseSeconds": "20",
        },
    )
    with running_client(config) as client:
        yield client


@pytest.mark.slow
def test_orders_start_promptly_after_submission_without_the_timer_poll(no_poll_client: Client) -> None:
    client = no_poll_client
    order_ids = [new_order_id("fast") for _ in range(ORDERS)]
    latencies = {}
    for order_id in order_ids:
        submitted = time.monotonic()
        client.submit(make_order(order_id))
        wait_until(
            lambda o=order_id: client.instance(f"{o}:1"),
            timeout=START_BOUND_SECONDS,
            what=f"the Scheduler of {order_id} to start (fast path; the timer poll is off)",
        )
        latencies[order_id] = time.monotonic() - submitted
    assert all(latency < START_BOUND_SECONDS for latency in latencies.values()), latencies

    for order_id in order_ids:
        client.wait_status(order_id, OrderStatus.COMPLETED, timeout=60)
        record = client.state(order_id)
        assert record is not None and record.process_state is ProcessState.PROCESSED
        assert record.attempt == 1  # claimed once, by the fast path
    # The timer poll started nothing (triggers/starter.py logs every batch in which it claimed or started one).
    assert "starter: started" not in client.devhost_log()
