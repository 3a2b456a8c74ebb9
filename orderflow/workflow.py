"""Scheduler contracts shared by the starter, the orchestrator and its activities (plain models, no I/O)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orderflow.messages import Traceparent

# The key of LOAD_ORDER's result that lists the steps an earlier attempt completed (they are not sent again).
SUCCEEDED_STEPS = "succeededSteps"
# The key of LOAD_ORDER's result (workflow version 2) that says what this attempt does: {"compensations": [names]}
# when the order is in CompensationInProgress (the compensations still to run, in order), else {}.
PLAN = "plan"
# The external event a client's CancelOrder raises on the running attempt (triggers/submission.py).
CANCEL_EVENT = "CancelOrder"

# Workflow versions (README, "Versioning"). "1": the Scheduler before compensation and cancel; its instances (no
# ExecutionStarted.Version, no workflowVersion in the input) replay and finish on the version-1 path.
# "2": compensation and cancel. host.json `extensions.durableTask.defaultVersion` is WORKFLOW_VERSION (a test checks
# it); the input carries it too, for hosts whose extension predates orchestration versions (context.version "").
# "3": one activity per decision point (orderflow/advance.py): 4 activities and 8 episodes per order instead of 11 and
# 15; its instances of version 2 replay and finish on the version-2 path.
# "4": after an ignored reply the race waits again with a fresh timer, so that the extension's replay of the actions
# can end the instance when that timer wins (docs/devhost.md, "Replay"); version-3 instances finish on version 3.
WORKFLOW_V1 = "1.0"
WORKFLOW_V2 = "2.0"
WORKFLOW_V3 = "3.0"
WORKFLOW_VERSION = "4.0"


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timedOut"
    SUPERSEDED = "superseded"
    DEFERRED = "deferred"  # the remote service's circuit breaker was open: back to Pending, FailureCount unchanged
    CANCELLED = "cancelled"  # a cancel stopped the attempt (then compensated, or nothing to undo)
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensationFailed"


class WorkflowInput(BaseModel):
    """The Scheduler's input. Settings travel in the input: an orchestrator must not read the environment."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    schema_version: Literal[1] = Field(default=1, alias="schemaVersion")
    order_id: str = Field(alias="orderId")
    attempt: int = Field(ge=1)
    step_timeout_seconds: int = Field(alias="stepTimeoutSeconds", gt=0)
    agent_retries: int = Field(default=4, alias="agentRetries", ge=0)
    # Absent in version-1 inputs.
    workflow_version: str = Field(default=WORKFLOW_V1, alias="workflowVersion", min_length=1, max_length=32)
    # The order's trace (orderflow/tracing.py): the Starter's span that started this attempt. The Scheduler opens no
    # span (it is replayed); it hands this to each activity, whose span joins the order's trace. Left out while None,
    # so an input without trace context is what it was before the field existed.
    traceparent: Traceparent = None

    def to_dict(self) -> dict[str, object]:
        omitted = {"traceparent"} if self.traceparent is None else None
        return self.model_dump(mode="json", by_alias=True, exclude=omitted)
