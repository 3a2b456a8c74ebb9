"""The broker's injected faults (`BusFaults`) as the embedded clients' callers meet them: each fault raised as the
exception azure-servicebus builds for Service Bus's answer (its own mapping, `sdk_error`), after a timeout's wait,
and retried as `_do_retryable_operation` retries it (`Attempts`); a session receiver whose connection drops loses
its session at once, unretried (`_base_handler.py` `_handle_exception`). `guard` and `guard_async` run before an
operation's broker call. Sources and figures: docs/modules-product.md, section orderflow/embedded/_faulted.py."""

from __future__ import annotations

import logging

from azure.servicebus._pyamqp.error import AMQPConnectionError, AMQPLinkError, ErrorCondition
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusError

from ._core import ReceiverCore
from ._retry import Attempts, Timer
from .broker import EmbeddedBroker
from .broker._bus_faults import DROP, InjectedFault

_LOG = logging.getLogger("azure.servicebus")
# What pyamqp reads from a socket the service closed (_pyamqp/_transport.py `_read`: "Server unexpectedly closed
# connection"; _pyamqp/_connection.py `listen`: "Can not read frame due to exception: ...", amqp:socket-error).
SOCKET_CLOSED = "Can not read frame due to exception: Server unexpectedly closed connection"


def sdk_error(fault: InjectedFault) -> ServiceBusError:
    """The SDK's exception for the fault, built by the SDK: a link error with Service Bus's condition (server busy:
    ServiceBusServerBusyError, timeout: OperationTimeoutError), or a socket error (ServiceBusConnectionError); each
    `_retryable`, as `_handle_amqp_exception_with_condition` marks it."""
    if fault.kind == DROP:
        amqp: Exception = AMQPConnectionError(ErrorCondition.SocketError, description=SOCKET_CLOSED)
    else:
        amqp = AMQPLinkError(condition=str(fault.condition).encode(), description=fault.description)
    return PyamqpTransport.create_servicebus_exception(_LOG, amqp)


def _attempt_wait(fault: InjectedFault, attempts: Attempts) -> float:
    """How long the faulted attempt takes: a timeout's wait, cut by the attempt's own timeout."""
    limit = attempts.attempt_timeout()
    return fault.delay_s if limit is None else min(fault.delay_s, max(limit, 0.0))


def _after(broker: EmbeddedBroker, fault: InjectedFault, attempts: Attempts, core: ReceiverCore | None) -> float:
    """The pause before the next attempt, or the error raised to the caller (recorded either way)."""
    error = sdk_error(fault)
    retried = False
    try:
        if core is not None and core.is_session and core.opened and isinstance(error, ServiceBusConnectionError):
            core.lock_lost = True  # _handle_exception: the session receiver is done, its lock left to expire
            raise error
        pause = attempts.failed(error)
        retried = True
        return pause
    finally:
        broker.record_fault(fault, retried)


def guard(
    broker: EmbeddedBroker, queue: str, op: str, attempts: Attempts, timer: Timer, core: ReceiverCore | None = None
) -> None:
    """Before a sync operation: answer its injected faults, retried as the SDK does, until one lets it through."""
    while (fault := broker.fault_for(op, queue)) is not None:
        if wait := _attempt_wait(fault, attempts):
            timer.sleep(wait)
        timer.sleep(_after(broker, fault, attempts, core))


async def guard_async(
    broker: EmbeddedBroker, queue: str, op: str, attempts: Attempts, timer: Timer, core: ReceiverCore | None = None
) -> None:
    """As `guard`, for an aio operation: the waits are the event loop's."""
    while (fault := broker.fault_for(op, queue)) is not None:
        if wait := _attempt_wait(fault, attempts):
            await timer.sleep_async(wait)
        await timer.sleep_async(_after(broker, fault, attempts, core))
