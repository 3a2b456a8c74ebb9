"""The Durable app the devhost benchmarks run: one orchestrator that calls a chain of N activities in
sequence,
and an activity that records when it starts (wall clock), so dispatch latency can be read against history.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import azure.durable_functions as df
import azure.functions as func

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)

STARTS: dict[tuple[str, int], float] = {}
_lock = threading.Lock()


@app.activity_trigger(input_name="step")
def bench_step(step: list[Any]) -> int:
    """Records its start time under (instance id, index) and returns the index."""
    instance_id, index = step
    with _lock:
        STARTS[(instance_id, index)] = time.time()
    return int(index)


@app.orchestration_trigger(context_name="context")
def bench_chain(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    """N sequential activities; the history grows by two events per activity, and every episode replays
    it all."""
    count = int(context.get_input())
    total = 0
    for index in range(count):
        total += yield context.call_activity("bench_step", [context.instance_id, index])
    return total
