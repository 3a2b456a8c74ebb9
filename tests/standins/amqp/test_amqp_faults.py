"""The broker's injected faults (`BusFaults`) on the wire: the AMQP endpoint answers server busy and timeouts with
Service Bus's conditions and drops the connection, so the unmodified azure-servicebus 7.15 SDK maps and retries them
itself; the embedded client presents the same fault as the same exception (tests/standins/broker/test_bus_faults.py).

What the endpoint answers (docs/modules-product.md, orderflow/embedded/amqp/_faults.py): a transfer is rejected with
`com.microsoft:server-busy` / `com.microsoft:timeout` (the latter after its wait), a disposition the same (the SDK
then settles by lock token on `$management`, `_servicebus_receiver.py` `_settle_message`), a `$management` request
answered 503 / 408 with the condition (`_pyamqp/management_operation.py`), a receive link detached with the condition;
a dropped connection is a socket closed without a close frame, which pyamqp reads as amqp:socket-error. The SDK's
mapping: `_pyamqp_transport.py` `_ERROR_CODE_TO_ERROR_MAPPING` / `_handle_amqp_exception_with_condition`; its retries:
`_base_handler.py` `_do_retryable_operation`, and a session receiver's ServiceBusConnectionError raised at once
(`_handle_exception`).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusConnectionError, ServiceBusServerBusyError
from support.amqp_endpoint import in_process_endpoint

from orderflow.embedded.amqp._cli import serve
from orderflow.embedded.broker import BusFaults, EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient as EmbeddedClient

QUEUE, SESSIONS = "plain", "sessions"
RETRIES = 1  # the SDK's retry_total for these tests: two attempts (each case stays well under a second or two)
ERRORS = {"server-busy": ServiceBusServerBusyError, "timeout": OperationTimeoutError, "drop": ServiceBusConnectionError}


def _send(client, queue: str, session: str | None = None) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("x", session_id=session))


def _scenario(client, op: str, down: Path, kind: str) -> None:
    """One operation with the bus down (`kind` in the outage file once the link is open): raises what it meets."""
    session = op.startswith("session ")
    queue = SESSIONS if session else QUEUE

    def go_down() -> None:
        down.write_text(kind)
        time.sleep(0.15)  # the outage file is looked at every 0.1 s at most

    if op == "send":
        with client.get_queue_sender(queue) as sender:
            go_down()
            sender.send_messages(ServiceBusMessage("x"))
        return
    _send(client, queue, "s" if session else None)
    options = {"session_id": NEXT_AVAILABLE_SESSION, "max_wait_time": 5} if session else {}
    with client.get_queue_receiver(queue, **options) as receiver:
        (message,) = receiver.receive_messages(max_wait_time=5)
        go_down()
        if op.endswith("complete"):
            receiver.complete_message(message)
        elif session:
            receiver.session.renew_lock()
        else:
            receiver.renew_message_lock(message)


def _run(tmp_path: Path, op: str, kind: str, transport: str) -> tuple[type[BaseException], list[dict]]:
    """The scenario through the real SDK on the endpoint ("sdk") or the embedded client ("embedded"): what it
    raised, and the ledger of the faults injected."""
    down, ledger, state = tmp_path / f"{transport}.down", tmp_path / f"{transport}.jsonl", tmp_path / transport
    faults = BusFaults(outage_file=down, timeout_ms=300, ledger=ledger)
    state.mkdir()
    options = {"retry_total": RETRIES, "retry_backoff_factor": 0.05}
    with ExitStack() as stack:
        if transport == "sdk":
            served = stack.enter_context(in_process_endpoint(state, faults))
            broker = served.endpoint.broker
            client = ServiceBusClient.from_connection_string(served.connection_string, **options)
        else:
            broker = EmbeddedBroker(state / "servicebus.db", faults=faults)
            stack.callback(broker.close)
            client = EmbeddedClient(broker, **options)
        stack.callback(client.close)
        stack.callback(down.unlink, missing_ok=True)
        broker.declare_queue(QUEUE)
        broker.declare_queue(SESSIONS, requires_session=True)
        with pytest.raises(Exception) as raised:
            _scenario(client, op, down, kind)
    return raised.type, [json.loads(line) for line in ledger.read_text().splitlines()]


@pytest.mark.parametrize(
    ("op", "kind", "attempts"),
    [
        # Each fault of a send, retried by the SDK (two attempts; after a drop the second attempt reconnects, and its
        # attach is dropped too).
        ("send", "server-busy", 2),
        ("send", "timeout", 2),
        ("send", "drop", 2),
        # A settlement on the link is refused; the SDK's retry settles by lock token ($management update-disposition).
        ("complete", "server-busy", 2),
        ("complete", "timeout", 2),
        # A $management request, retried as the others.
        ("renew-lock", "server-busy", 2),
        # A session receiver whose connection drops is done at once: no retry (_handle_exception).
        ("session renew-lock", "drop", 1),
        ("session complete", "drop", 1),
    ],
)
def test_the_sdk_meets_each_fault_on_the_wire_as_the_embedded_client_presents_it(tmp_path, op, kind, attempts):
    raised, ledger = _run(tmp_path, op, kind, "sdk")
    assert raised is ERRORS[kind]
    assert len(ledger) == attempts  # the SDK retried (or, for a dropped session, did not)
    assert {e["fault"] for e in ledger} == {kind}
    embedded, own = _run(tmp_path, op, kind, "embedded")
    assert embedded is raised  # the embedded client presents the same fault as the same exception
    assert len(own) == attempts


def test_the_command_refuses_unknown_fault_options(tmp_path, capsys):
    assert serve("127.0.0.1", 0, tmp_path, None, "serverBusy=0.5") == 1
    assert "unknown embedded broker option 'serverBusy'" in capsys.readouterr().err
