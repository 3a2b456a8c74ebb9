"""The live Scheduler's activity inputs and results, and its output and custom status, as typed models.

The orchestrator and the activities exchange plain JSON (`to_dict`/`from_dict`), never these objects: the Durable
SDK would wrap an object with `to_json` in a `{"__class__", "__module__", "__data__"}` envelope, and an in-flight
instance's history holds the plain dicts. `schemaVersion` 1 is that shape, so a version-1 payload leaves it out;
only the fields a caller set are written (`exclude_unset`), so a model serializes to exactly the dict it was parsed
from (tests/product/unit/test_activity_models.py). Fields are added with defaults; a new shape raises `schemaVersion`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from orderflow.advance import StepResult
from orderflow.clock import ensure_utc
from orderflow.messages import Action, ActionField, AgentOutcome, AgentReply, CompensationName, Traceparent
from orderflow.records import ProcessState, StepStatus
from orderflow.workflow import Outcome, WorkflowInput

# A datetime as the Scheduler writes it: `datetime.isoformat()` of an aware UTC datetime.
IsoDatetime = Annotated[datetime, AfterValidator(ensure_utc), PlainSerializer(datetime.isoformat, return_type=str)]


class ActivityModel(BaseModel):
    """Plain JSON at the boundary, with the fields that were set and no others."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    schema_version: Literal[1] = Field(default=1, alias="schemaVersion")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    @classmethod
    def from_dict(cls, data: object) -> Self:
        return cls.model_validate(data)


class ActionResult(ActivityModel):
    """What the Agent answered for the last action: a success or a permanent failure (ADVANCE_ORDER records it).
    `cause` only on a failure; `undone` only for a compensation."""

    step: ActionField
    status: Literal[StepStatus.SUCCEEDED, StepStatus.FAILED]
    error: str | None
    cause: str | None = None
    undone: bool | None = None

    @classmethod
    def of(cls, action: Action, reply: AgentReply, cause: str) -> ActionResult:
        succeeded = reply.outcome is AgentOutcome.SUCCEEDED
        fields: dict[str, Any] = {} if succeeded else {"cause": cause}
        if isinstance(action, CompensationName):
            fields["undone"] = bool(reply.result.get("undone")) if succeeded else None
        status = StepStatus.SUCCEEDED if succeeded else StepStatus.FAILED
        return cls(step=action, status=status, error=reply.error, **fields)

    def step_result(self) -> StepResult:
        return StepResult(self.step, self.status is StepStatus.SUCCEEDED, self.error, self.cause, self.undone)


class AdvanceOrderInput(ActivityModel):
    """ADVANCE_ORDER: one decision point. `result` is None at the start of an attempt and after a cancel won."""

    order_id: str = Field(alias="orderId")
    instance_id: str = Field(alias="instanceId")
    attempt: int = Field(ge=1)
    workflow_version: str = Field(alias="workflowVersion")
    agent_retries: int = Field(alias="agentRetries", ge=0)
    traceparent: Traceparent = None
    complete_by: IsoDatetime = Field(alias="completeBy")
    result: ActionResult | None
    cancel: bool = False

    @classmethod
    def decision(
        cls,
        inp: WorkflowInput,
        instance_id: str,
        version: str,
        complete_by: datetime,
        result: ActionResult | None,
        cancel: bool,
    ) -> AdvanceOrderInput:
        trace = {"traceparent": inp.traceparent} if inp.traceparent else {}  # each activity's span joins the trace
        return cls(
            order_id=inp.order_id,
            instance_id=instance_id,
            attempt=inp.attempt,
            workflow_version=version,
            agent_retries=inp.agent_retries,
            **trace,
            complete_by=complete_by,
            result=result,
            cancel=cancel,
        )


class AdvanceOrderResult(ActivityModel):
    """ADVANCE_ORDER's answer when not fenced out (that answer is null): `send` (the request is on its way) or
    `done` (the record is terminal), exactly one."""

    send: ActionField | None = None
    done: ProcessState | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.send is None) == (self.done is None):
            raise ValueError("exactly one of send and done")
        return self

    def action(self) -> Action:
        """The action sent (ValueError when the order is done)."""
        if self.send is None:
            raise ValueError(f"no action: the order is done ({self.done})")
        return self.send


class DeferOrderInput(ActivityModel):
    """DEFER_ORDER: "not now", the remote service's breaker is open. `retryAt` from the orchestration's clock."""

    order_id: str = Field(alias="orderId")
    instance_id: str = Field(alias="instanceId")
    step: ActionField
    retry_after_seconds: float = Field(default=0.0, alias="retryAfterSeconds")
    retry_at: IsoDatetime | None = Field(default=None, alias="retryAt")
    reason: str | None = None


class WorkflowResult(ActivityModel):
    """The orchestration's output: the outcome, the action it ended at, and a transient failure's error."""

    outcome: Outcome
    step: ActionField | None = None
    error: str | None = None


class SchedulerStatus(ActivityModel):
    """The orchestration's custom status: the step (None once finished) or compensation in progress."""

    step: ActionField | None = None
    compensation: ActionField | None = None
    attempt: int
