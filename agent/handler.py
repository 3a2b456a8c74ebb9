"""Handling of one Agent request message, from receipt to settlement (at-least-once).

parse → poison: OperatorAlert, then dead-letter with the reason; deadline passed: failed reply, DeadlineExceeded, no
call; else call the remote service with retries inside the deadline (agent.retry) through the shared circuit breaker
(open before any call: failed reply, CircuitOpen, result.retryAfterSeconds) → send the AgentReply (SessionId =
orderId, MessageId = `<instanceId>:<step>:reply`) → complete the request, only after the reply is sent. A crash before
`complete` redelivers the request; the remote's idempotency key and duplicate detection absorb the repeats. A bus
outage is waited out in place, the reply and the complete retried until the deadline (`orderflow.patience`).
Spans `orderflow.agent.handle` (child of the sending activity) and `orderflow.agent.dead_letter`; `circuit_alerter`
raises `CircuitOpened` / `CircuitClosed`. The flow, the failed reply and the alerts: docs/modules-product.md."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from azure.servicebus import ServiceBusMessage

from agent.errors import ErrorCode
from agent.remote import RemoteCaller
from agent.request_parsing import message_body, parse_agent_request
from agent.retry import CallGate, RetryPolicy, StepOutcome, call_with_retries
from orderflow import telemetry, tracing
from orderflow.breaker import OnTransition, Transition
from orderflow.clock import WaitingClock as Clock
from orderflow.messages import (
    AgentOutcome,
    AgentReply,
    AgentRequest,
    AlertKind,
    InvalidMessage,
    OperatorAlert,
)
from orderflow.outbound import about_message
from orderflow.patience import patiently
from orderflow.records import format_utc
from orderflow.text import bounded

log = logging.getLogger("agent")


class Disposition(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead-lettered"


class Sender(Protocol):
    async def send_messages(self, message: ServiceBusMessage) -> None: ...


class Settler(Protocol):
    """The part of an azure-servicebus (aio) receiver that settles messages."""

    async def complete_message(self, message: Any) -> None: ...

    async def dead_letter_message(
        self, message: Any, reason: str | None = None, error_description: str | None = None
    ) -> None: ...


@dataclass(frozen=True)
class Outbox:
    """Where the Agent sends: the replies queue and the operator-alerts queue (already opened senders)."""

    replies: Sender
    alerts: Sender
    replies_queue: str
    requests_queue: str


class RequestHandler:
    def __init__(
        self,
        caller: RemoteCaller,
        outbox: Outbox,
        policy: RetryPolicy,
        clock: Clock,
        breaker: CallGate | None = None,
    ) -> None:
        self._caller = caller
        self._outbox = outbox
        self._policy = policy
        self._clock = clock
        self._breaker = breaker

    async def handle(self, receiver: Settler, message: Any) -> Disposition:
        """Process and settle one received request message; bus errors propagate (the caller abandons)."""
        properties = getattr(message, "application_properties", None)
        try:
            request = parse_agent_request(message_body(message), message.session_id, self._outbox.replies_queue)
        except InvalidMessage as poison:
            with tracing.span(
                "orderflow.agent.dead_letter",
                parent=properties,
                kind=tracing.SpanKind.CONSUMER,
                attributes=tracing.order_attributes(message.session_id),
            ):
                await self._dead_letter(receiver, message, poison)
            return Disposition.DEAD_LETTERED
        with tracing.span(
            "orderflow.agent.handle",
            parent=properties,
            fallback=request.traceparent,
            kind=tracing.SpanKind.CONSUMER,
            attributes=tracing.order_attributes(request.order_id, request.instance_id, request.step.value),
        ) as span:
            outcome = await self._execute(request)
            span.set_attribute("orderflow.outcome", "succeeded" if outcome.succeeded else "failed")
            span.set_attribute("orderflow.calls", outcome.attempts)
            reply = reply_message(self.reply_for(request, outcome))
            await self._patiently(lambda: self._outbox.replies.send_messages(reply), request, "reply")
            await self._patiently(lambda: receiver.complete_message(message), request, "complete")
        log.info(
            "request %s %s after %d call(s)%s",
            request.message_id(),
            "succeeded" if outcome.succeeded else "failed",
            outcome.attempts,
            f": {outcome.error_code} {outcome.error}" if outcome.error_code else "",
        )
        return Disposition.SUCCEEDED if outcome.succeeded else Disposition.FAILED

    async def _patiently(self, send: Callable[[], Awaitable[None]], request: AgentRequest, what: str) -> None:
        """A transient bus failure of the reply or of the settlement is waited out here, until the request's deadline
        (`orderflow.patience`): given back, the request would cost a delivery (agent-requests' MaxDeliveryCount
        dead-letters it after five) and call the remote again, and a reply after the deadline is of no use."""
        name = f"{what} of request {request.message_id()}"
        await patiently(send, self._clock, request.deadline, what=name, sleep=self._clock.sleep, logger=log)

    async def _execute(self, request: AgentRequest) -> StepOutcome:
        if request.deadline <= self._clock.now():
            return StepOutcome(
                False,
                0,
                {},
                error_code=ErrorCode.DEADLINE_EXCEEDED,
                error="deadline had passed when the request was received; remote not called",
            )
        body = {
            "orderId": request.order_id,
            "idempotencyKey": request.idempotency_key,
            "payload": request.payload,
        }
        return await call_with_retries(
            self._caller,
            request.step.value,
            body,
            request.deadline,
            self._policy_for(request),
            self._clock,
            self._breaker,
        )

    def _policy_for(self, request: AgentRequest) -> RetryPolicy:
        """The Scheduler's allowance for this request caps the Agent's own retry limit (one retry budget)."""
        if request.max_retries is None or request.max_retries >= self._policy.max_retries:
            return self._policy
        return dataclasses.replace(self._policy, max_retries=request.max_retries)

    def reply_for(self, request: AgentRequest, outcome: StepOutcome) -> AgentReply:
        return AgentReply(
            instance_id=request.instance_id,
            order_id=request.order_id,
            attempt=request.attempt,
            step=request.step,
            outcome=AgentOutcome.SUCCEEDED if outcome.succeeded else AgentOutcome.FAILED,
            permanent=outcome.permanent,
            error_code=outcome.error_code,
            error=outcome.error,
            result=outcome.result,
            completed_at=self._clock.now(),
            traceparent=tracing.current_traceparent(),  # the handling span (None outside a trace)
        )

    async def _dead_letter(self, receiver: Settler, message: Any, poison: InvalidMessage) -> None:
        alert = self.poison_alert(message, poison)
        telemetry.alert_event(alert.kind.value, alert.order_id, alert.reason)
        await self._outbox.alerts.send_messages(alert_message(alert))
        await receiver.dead_letter_message(
            message,
            # InvalidMessage bounds both already (orderflow/text.py: .NET's 4,096 UTF-16 code units); again here.
            reason=bounded(poison.reason),
            error_description=bounded(poison.description),
        )
        log.warning("request %s dead-lettered: %s", message.message_id, poison)

    def poison_alert(self, message: Any, poison: InvalidMessage) -> OperatorAlert:
        return OperatorAlert(
            kind=AlertKind.POISON_MESSAGE,
            order_id=message.session_id,
            reason=poison.reason,
            details={
                **about_message(
                    self._outbox.requests_queue,
                    message.message_id,
                    message.session_id,
                    getattr(message, "sequence_number", None),
                ),
                "description": poison.description,
                "source": "agent",
            },
            raised_at=self._clock.now(),
        )


def circuit_alert(transition: Transition, raised_at: datetime) -> OperatorAlert | None:
    """The operator alert of a breaker transition: CircuitOpened (closed → open), CircuitClosed (→ closed), else
    None (→ half-open, or half-open → open again: a probe failed, the outage goes on)."""
    if transition.opened:
        kind = AlertKind.CIRCUIT_OPENED
    elif transition.closed:
        kind = AlertKind.CIRCUIT_CLOSED
    else:
        return None
    return OperatorAlert(
        kind=kind,
        reason=transition.reason,
        details={
            "service": transition.service,
            "before": transition.before.value,
            "after": transition.after.value,
            "changedAt": format_utc(transition.changed_at),
            "source": "agent",
        },
        raised_at=raised_at,
    )


def circuit_alerter(alerts: Sender, clock: Clock) -> OnTransition:
    """The breaker's `on_transition`: send the transition's alert (if any) on `alerts`; a send failure is logged,
    never raised (the call the breaker was deciding on goes ahead either way)."""

    async def on_transition(transition: Transition) -> None:
        alert = circuit_alert(transition, clock.now())
        if alert is None:
            return
        telemetry.alert_event(alert.kind.value, alert.order_id, alert.reason)
        try:
            await alerts.send_messages(alert_message(alert))
        except Exception:  # an alert must not fail the request; the state is in the gauge too
            log.exception("could not send the %s alert of %s", alert.kind.value, transition.service)
            return
        log.warning(
            "alert %s: circuit of %s %s (%s)",
            alert.kind.value,
            transition.service,
            transition.after.value,
            transition.reason,
        )

    return on_transition


def reply_message(reply: AgentReply) -> ServiceBusMessage:
    """The reply's trace context rides in its `traceparent` field and in the application properties."""
    return ServiceBusMessage(
        reply.to_json(),
        session_id=reply.order_id,
        message_id=reply.message_id(),
        content_type="application/json",
        subject=reply.type,
        application_properties={tracing.TRACEPARENT: reply.traceparent} if reply.traceparent else None,
    )


def alert_message(alert: OperatorAlert) -> ServiceBusMessage:
    return ServiceBusMessage(
        alert.to_json(),
        message_id=alert.message_id(),
        content_type="application/json",
        subject=alert.type,
        application_properties=tracing.inject() or None,  # the span it was raised in, if any
    )
