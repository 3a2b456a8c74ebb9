"""The embedded broker's fault switch `BusFaults` (orderflow/embedded/broker/_bus_faults.py), turned on through the
endpoint (`Endpoint=embedded://PATH?serverBusyRate=..&outageFile=..`) for the bus-outage drill, and how the embedded
clients present each fault: as azure-servicebus 7.15 (site-packages/azure/servicebus) does after its own retries.

What it must do, each checked here without waiting (a fake timer moves the clock):
- off by default: a plain connection string has no injector;
- server busy, a timeout and a dropped connection raise the SDK's ServiceBusServerBusyError, OperationTimeoutError and
  ServiceBusConnectionError, built by the SDK's mapping (_pyamqp_transport.py `_handle_amqp_exception_with_condition`,
  `_ERROR_CODE_TO_ERROR_MAPPING`), each after 1 + retry_total attempts with the SDK's backoff between them
  (_base_handler.py `_do_retryable_operation`, `_backoff`, `_get_backoff_time`: 0.8 x 2^n s, n = 1, 2, 3), a
  timeout's attempt after its wait; nothing is done by a faulted attempt;
- a session receiver whose connection drops is not retried and its session is lost (`_handle_exception`);
- the outage file: every operation fails with the fault it names while it exists; the rates draw from a seeded stream;
- one ledger line per injected answer, saying whether the client retried it.
The same faults on the AMQP endpoint, against the real SDK: tests/standins/amqp/test_amqp_faults.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from orderflow.adapters import bus_from_connection_string
from orderflow.embedded import client_aio
from orderflow.embedded._connection_string import parse_embedded
from orderflow.embedded._retry import Timer
from orderflow.embedded.broker import BusFaults, EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient, ServiceBusMessage

# _base_handler.py `_get_backoff_time` with the client defaults (_common/_configuration.py: retry_total 3,
# retry_backoff_factor 0.8, exponential): the pauses before attempts 2, 3 and 4.
SDK_BACKOFFS = [1.6, 3.2, 6.4]
# The messages the SDK builds: `ServiceBusError.__init__` appends the condition to the description.
DROPPED = (
    "Can not read frame due to exception: Server unexpectedly closed connection Error condition: amqp:socket-error."
)
SHORT = 0.05


class FakeTimer(Timer):
    """The client's time on the test's clock: a backoff or a timeout's wait moves it (nothing sleeps); `sleeps`
    records them."""

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.clock, self.start = clock, clock.now
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return (self.clock.now - self.start).total_seconds()

    def wait(self, waiter, seconds: float) -> None:
        self.clock.advance(seconds)

    async def wait_async(self, waiter, seconds: float) -> None:
        self.clock.advance(seconds)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.clock.advance(seconds)

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def down(tmp_path: Path) -> Path:
    return tmp_path / "bus.down"


@pytest.fixture
def faulty(db_path: Path, clock, down: Path):
    """A broker whose operations fail while `down` exists (timeouts after 1 s), its ledger, and a client on it."""
    faults = BusFaults(outage_file=down, timeout_ms=1000, ledger=db_path.with_name("ledger.jsonl"))
    broker = EmbeddedBroker(db_path, clock=clock, faults=faults)
    broker.bus_faults._monotonic = lambda: clock.now.timestamp()  # the outage file is looked at on the test's clock
    timer = FakeTimer(clock)
    with ServiceBusClient(broker, _timer=timer) as client:
        yield client, timer
    broker.close()


def ledger(client) -> list[dict]:
    path = client.broker.bus_faults.faults.ledger
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def outage(down: Path, clock, kind: str | None) -> None:
    """Name a fault in the outage file (None: remove it), and let the 0.1 s between looks pass."""
    if kind is None:
        down.unlink(missing_ok=True)
    else:
        down.write_text(kind)
    clock.advance(0.2)


def test_off_by_default_and_every_option_checked(tmp_path):
    plain = parse_embedded(f"Endpoint=embedded://{tmp_path / 'bus.db'}")
    assert plain.faults is None
    with bus_from_connection_string(f"Endpoint=embedded://{tmp_path / 'bus.db'}") as client:
        assert client.broker.bus_faults is None
    parsed = parse_embedded(f"Endpoint=embedded://{tmp_path / 'bus.db'}?serverBusyRate=0.25&seed=3;ConfigFile=x")
    assert parsed.db_path == str(tmp_path / "bus.db") and parsed.config_file and parsed.faults is not None
    assert parsed.faults.server_busy_rate == 0.25 and parsed.faults.seed == 3
    assert parsed.faults.ledger == tmp_path / "bus.db.faults.jsonl"
    for bad in ("serverBusy=0.1", "dropRate=2", "serverBusyRate=0.6&timeoutRate=0.6", "outageFile="):
        with pytest.raises(ValueError):
            parse_embedded(f"Endpoint=embedded://{tmp_path / 'bus.db'}?{bad}")


@pytest.mark.parametrize(
    ("kind", "error", "sleeps"),
    [
        # Server busy: four attempts, the SDK's backoffs between them.
        ("server-busy", ServiceBusServerBusyError, SDK_BACKOFFS),
        # A timeout: each attempt waits its 1 s before the answer, then the backoff.
        ("timeout", OperationTimeoutError, [1.0, 1.6, 1.0, 3.2, 1.0, 6.4, 1.0]),
        # A dropped connection: ServiceBusConnectionError (retryable, shutdown_handler), retried as the others.
        ("drop", ServiceBusConnectionError, SDK_BACKOFFS),
    ],
)
def test_a_send_meets_each_fault_as_the_sdk_presents_it_after_retries(faulty, queue, down, clock, kind, error, sleeps):
    client, timer = faulty
    q = queue()
    with client.get_queue_sender(q) as sender:
        outage(down, clock, kind)
        with pytest.raises(error) as raised:
            sender.send_messages(ServiceBusMessage("x"))
    assert timer.sleeps == sleeps
    assert raised.value._retryable  # as _handle_amqp_exception_with_condition marks it
    if kind == "drop":
        assert str(raised.value) == DROPPED
    assert client.broker.counts(q).active == 0  # a faulted attempt does nothing
    lines = ledger(client)
    assert [(e["op"], e["queue"], e["fault"], e["retried"]) for e in lines] == [("send", q, kind, True)] * 3 + [
        ("send", q, kind, False)
    ]


def test_the_sdks_retries_get_through_once_the_outage_ends(faulty, queue, down, clock):
    # _do_retryable_operation: an attempt after the backoff that succeeds returns; the caller never sees the faults.
    client, timer = faulty
    q = queue()
    with client.get_queue_sender(q) as sender:
        outage(down, clock, "server-busy")
        timer_sleep = timer.sleep

        def back_up(seconds: float) -> None:  # the bus comes back during the second backoff
            timer_sleep(seconds)
            if len(timer.sleeps) == 2:
                outage(down, clock, None)

        timer.sleep = back_up
        sender.send_messages(ServiceBusMessage("x"))
    assert client.broker.counts(q).active == 1
    assert [e["retried"] for e in ledger(client)] == [True, True]


def test_settling_and_renewing_meet_the_faults_after_the_sdks_local_checks(faulty, queue, down, clock):
    # _servicebus_receiver.py `_settle_message_with_retry` and `_mgmt_request_response_with_retry`: the retries are
    # around the call to the service; a message settled already is refused first (MessageAlreadySettled).
    client, _timer = faulty
    q = queue()
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        (message,) = receiver.receive_messages(max_wait_time=SHORT)
        outage(down, clock, "server-busy")
        with pytest.raises(ServiceBusServerBusyError):
            receiver.complete_message(message)
        with pytest.raises(ServiceBusServerBusyError):
            receiver.renew_message_lock(message)
        with pytest.raises(ServiceBusServerBusyError):
            receiver.receive_messages(max_wait_time=SHORT)
        assert client.broker.counts(q).locked == 1  # the message is still locked to this receiver
        outage(down, clock, None)
        receiver.complete_message(message)
    ops = [e["op"] for e in ledger(client) if e["retried"] is False]
    assert ops == ["complete", "renew-lock", "receive"]


def test_a_session_receiver_whose_connection_drops_loses_its_session_unretried(faulty, queue, down, clock):
    # _base_handler.py `_handle_exception`: a ServiceBusConnectionError while a session receiver runs sets
    # `_session._lock_lost` and raises at once; every later operation raises SessionLockLostError (`_check_live`).
    # The service never heard a close: the session stays locked until its lock expires, then its message counts a
    # delivery.
    client, timer = faulty
    q = queue(requires_session=True, lock_duration="PT30S")
    with client.get_queue_sender(q) as sender:
        sender.send_messages(ServiceBusMessage("x", session_id="s"))
    receiver = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION)
    (message,) = receiver.receive_messages(max_wait_time=SHORT)
    outage(down, clock, "drop")
    with pytest.raises(ServiceBusConnectionError):
        receiver.complete_message(message)
    assert timer.sleeps == []  # not retried
    outage(down, clock, None)
    with pytest.raises(SessionLockLostError):
        receiver.receive_messages(max_wait_time=SHORT)
    receiver.close()
    with pytest.raises(SessionCannotBeLockedError):  # still locked: the close did not release it
        client.broker.accept_session(q, "s")
    clock.advance(30)
    with client.get_queue_receiver(q, session_id="s") as again:
        (redelivered,) = again.receive_messages(max_wait_time=SHORT)
    assert redelivered.delivery_count == 1


def test_opening_a_link_meets_only_a_dropped_connection(faulty, queue, down, clock):
    # A busy or slow Service Bus still attaches links (the refusals come on the operations), a dropped connection
    # fails the attach: the sender's `_open_with_retry` retries it as any operation.
    client, timer = faulty
    q = queue()
    outage(down, clock, "server-busy")
    sender = client.get_queue_sender(q)
    sender.__enter__()
    sender.close()
    outage(down, clock, "drop")
    with pytest.raises(ServiceBusConnectionError):
        client.get_queue_sender(q).__enter__()
    assert [(e["op"], e["fault"]) for e in ledger(client)] == [("open", "drop")] * 4


def test_the_aio_client_meets_the_same_faults(db_path, clock, down, queue):
    faults = BusFaults(outage_file=down, ledger=db_path.with_name("ledger.jsonl"))
    broker = EmbeddedBroker(db_path, clock=clock, faults=faults)
    broker.bus_faults._monotonic = lambda: clock.now.timestamp()
    timer = FakeTimer(clock)
    q = queue()

    async def scenario() -> type[Exception]:
        async with client_aio.ServiceBusClient(broker, _timer=timer) as client:
            async with client.get_queue_sender(q) as sender:
                outage(down, clock, "server-busy")
                try:
                    await sender.send_messages(ServiceBusMessage("x"))
                except Exception as exc:  # noqa: BLE001 - the class is the assertion
                    return type(exc)
        return type(None)

    assert asyncio.run(scenario()) is ServiceBusServerBusyError
    assert timer.sleeps == SDK_BACKOFFS
    broker.close()


def test_rates_draw_from_a_seeded_stream_and_the_sdks_retries_absorb_most(tmp_path):
    def draws(seed: int, run: str) -> list[str | None]:
        (tmp_path / run).mkdir()
        faults = BusFaults(server_busy_rate=0.3, drop_rate=0.1, seed=seed)
        broker = EmbeddedBroker(tmp_path / run / "bus.db", faults=faults)
        faults = [broker.fault_for("send", "q") for _ in range(2000)]
        broker.close()
        return [None if f is None else f.kind for f in faults]

    first, again = draws(7, "a"), draws(7, "b")
    assert first == again  # the first broker object on a file draws the same stream every run
    assert draws(8, "c") != first
    assert 500 < first.count("server-busy") < 700 and 150 < first.count("drop") < 250
    assert first.count("timeout") == 0
