"""A process that runs one orchestration of tests/host/sample_app on a DurableEngine and kills itself with SIGKILL at a
chosen boundary of the store (test_crash_points.py runs it).

    python -m tests.host.durable.crash_child DB POINT NTH ORCHESTRATOR INSTANCE_ID INPUT_JSON

POINT is `<Store method>:before` or `<Store method>:after`: the process is killed on the NTH call of that method,
before it runs or after it returned (for a method called inside a write transaction, that is before COMMIT). Exit
status 3 means the orchestration ended without reaching the point.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from devhost.durable import DurableEngine
from devhost.durable.store import Store
from devhost.invoke import Invoker
from tests.host.durable.harness import FUNCTIONS

NOT_REACHED = 3


def arm(point: str, nth: int) -> None:
    method, _, when = point.partition(":")
    original = getattr(Store, method)
    calls = 0

    def kill_at_point(self: Store, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if when == "before" and calls == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(self, *args, **kwargs)
        if when == "after" and calls == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(Store, method, kill_at_point)


async def main(db: str, point: str, nth: int, orchestrator: str, instance_id: str, data: Any) -> int:
    engine = DurableEngine(db_path=Path(db), functions=FUNCTIONS, invoke=Invoker())
    await engine.start()
    arm(point, nth)
    await engine.start_new(orchestrator, instance_id, data)
    await engine.wait_for_status(instance_id, ("Completed", "Failed", "Terminated"), 30)
    return NOT_REACHED


if __name__ == "__main__":
    db, point, nth, orchestrator, instance_id, data = sys.argv[1:7]
    sys.exit(asyncio.run(main(db, point, int(nth), orchestrator, instance_id, json.loads(data))))
