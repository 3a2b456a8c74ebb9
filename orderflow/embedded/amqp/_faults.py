"""The broker's injected faults (`BusFaults`) answered on the wire as Service Bus answers them, so the SDKs see and
retry them themselves: server busy and timeouts as their conditions (a rejected transfer or disposition, a refused
attach, a detached receiver link, a `$management` status), a timeout after its wait, a dropped connection as a
socket that ends without a close frame. Sources: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Callable

from proton import Connection
from proton.reactor import Container

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.broker._bus_faults import DROP, TIMEOUT, InjectedFault

from ._errors import SERVER_BUSY, AmqpError
from ._errors import TIMEOUT as TIMEOUT_CONDITION
from ._waiting import Later

# The `$management` status codes of the two conditions (Service Bus: 503 ServiceUnavailable for server busy, 408
# RequestTimeout for a timeout; _pyamqp/management_operation.py reads `statusCode` and `errorCondition`).
_STATUS = {SERVER_BUSY: 503, TIMEOUT_CONDITION: 408}


def wire_error(fault: InjectedFault) -> AmqpError:
    """The condition a server-busy or timeout fault is answered with."""
    condition = fault.condition or SERVER_BUSY
    return AmqpError(condition, fault.description, _STATUS[condition])


def drop_connection(connection: Connection | None) -> None:
    """End the connection's socket at once: no close frame, as a network failure or a service node going away."""
    transport = None if connection is None else connection.transport
    if transport is not None:
        transport.close_tail()
        transport.close_head()


class WireFaults:
    """Asks the broker for each operation's fault and answers it: `answer(op, queue, connection, reply)` is False
    when the operation goes ahead; True when a fault took its place (`reply(error)` is called, after a timeout's
    wait, or the connection dropped)."""

    def __init__(self, broker: EmbeddedBroker, container: Container) -> None:
        self.broker, self.container = broker, container

    def answer(self, op: str, queue: str, connection: Connection | None, reply: Callable[[AmqpError], None]) -> bool:
        fault = self.broker.fault_for(op, queue)
        if fault is None:
            return False
        self.broker.record_fault(fault, retried=None)  # whether the SDK retries is the client's: unknown here
        if fault.kind == DROP:
            drop_connection(connection)
        elif fault.kind == TIMEOUT and fault.delay_s > 0:
            error = wire_error(fault)
            self.container.schedule(fault.delay_s, Later(lambda: reply(error)))
        else:
            reply(wire_error(fault))
        return True
