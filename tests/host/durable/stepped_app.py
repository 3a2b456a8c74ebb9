"""A copy of the live Scheduler's shape for the add-a-step test: a decision activity that walks the record's own steps.

`stepped_workflow` asks `advance_steps` for the next step (as the Scheduler asks ADVANCE_ORDER), waits for that
step's reply, and asks again, until the record is done. The record is created with the steps the code has when the
order arrives (`STEPS`, as `OrderStateRecord.new` takes `orderflow.messages.STEPS`) and keeps them: the test adds a
fourth step to `STEPS` between two hosts. Each record is a JSON file in the folder named by STEPPED_RECORDS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import azure.functions as func

from activities import ActivityInput
from orderflow.messages import STEPS as PRODUCT_STEPS

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)
STEPS: tuple[str, ...] = tuple(s.value for s in PRODUCT_STEPS)  # the test sets it to the code being "deployed"
RECORDS_SETTING = "STEPPED_RECORDS"


def _record(order_id: str) -> Path:
    return Path(os.environ[RECORDS_SETTING]) / f"{order_id}.json"


@app.activity_trigger(input_name="request")
def advance_steps(request: ActivityInput) -> dict[str, Any]:
    """Record the last step's success, then answer the next of the record's own steps, or that it is done."""
    path = _record(request["orderId"])
    steps = json.loads(path.read_text()) if path.exists() else {s: "pending" for s in STEPS}
    if request.get("succeeded"):
        steps[request["succeeded"]] = "succeeded"
    path.write_text(json.dumps(steps))
    pending = [s for s, status in steps.items() if status != "succeeded"]
    return {"send": pending[0]} if pending else {"done": list(steps)}


@app.orchestration_trigger(context_name="context")
def stepped_workflow(context: df.DurableOrchestrationContext):  # type: ignore[no-untyped-def]
    order_id, succeeded, sent = context.get_input()["orderId"], None, []
    while True:
        decided = yield context.call_activity("advance_steps", {"orderId": order_id, "succeeded": succeeded})
        if "done" in decided:
            return {"steps": decided["done"], "sent": sent}
        sent.append(decided["send"])
        context.set_custom_status(decided["send"])
        yield context.wait_for_external_event(f"Reply:{decided['send']}")
        succeeded = decided["send"]


FUNCTIONS = app.get_functions()
