"""Conformance of the embedded client to azure-servicebus 7.15 (site-packages/azure/servicebus), sessions and time:
the local-clock session check, the SDK's retries when no session is available, and what closing a receiver does to
the delivery count. Each test names the SDK file and function (or the learn.microsoft.com page) it follows. Time is a
`FakeTimer` on the test's clock: waits and backoffs move it, nothing sleeps."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus._pyamqp.error import TokenAuthFailure
from azure.servicebus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from orderflow.embedded import client_aio
from orderflow.embedded._retry import Timer
from orderflow.embedded.client import ServiceBusClient, ServiceBusMessage

SHORT = 0.05
# azure/servicebus/exceptions.py SessionLockLostError: the default message `_check_live` raises with.
SESSION_LOCK_LOST = "The lock on the session has expired. Callers should request the session again."
# _base_handler.py `_do_retryable_operation`: added to the last timeout of a NEXT_AVAILABLE_SESSION receiver.
HINT = (
    " If trying to receive from NEXT_AVAILABLE_SESSION, use max_wait_time on the ServiceBusReceiver to control the "
    "timeout."
)


class FakeTimer(Timer):
    """The client's time on the test's clock: a wait on the receiver's socket or a backoff moves the clock by its
    length (and returns at once); `sleeps` records the backoffs, `on_sleep` runs at each."""

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.clock, self.start = clock, clock.now
        self.sleeps: list[float] = []
        self.on_sleep = lambda: None

    def monotonic(self) -> float:
        return (self.clock.now - self.start).total_seconds()

    def elapsed(self) -> float:
        return round(self.monotonic(), 6)

    def wait(self, waiter, seconds: float) -> None:
        self.clock.advance(seconds)

    async def wait_async(self, waiter, seconds: float) -> None:
        self.clock.advance(seconds)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.on_sleep()
        self.clock.advance(seconds)

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def timer(clock) -> FakeTimer:
    return FakeTimer(clock)


@pytest.fixture
def timed(broker, timer):
    with ServiceBusClient(broker, _timer=timer) as c:
        yield c


def _send(client, q: str, session: str, *bodies: str) -> None:
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(b, session_id=session) for b in bodies])


# -- 1. the session lock, checked on the local clock before any operation ---------------------------------------


def test_an_expired_session_lock_is_refused_locally_before_any_operation(client, queue, clock):
    # azure/servicebus/_base_handler.py `_check_live`: `if self._session and (self._session._lock_lost or
    # self._session._lock_expired): raise SessionLockLostError(error=self._session.auto_renew_error)`, called first
    # by receive_messages, _settle_message_with_retry, peek_messages, receive_deferred_messages and the session's
    # get_state / set_state / renew_lock (_servicebus_session.py); `_lock_expired` compares with utc_now().
    q = queue(requires_session=True, lock_duration="PT30S")
    operations = {
        "receive_messages": lambda r, m: r.receive_messages(max_wait_time=SHORT),
        "peek_messages": lambda r, m: r.peek_messages(),  # the broker does not check the session lock for a peek
        "receive_deferred_messages": lambda r, m: r.receive_deferred_messages([m.sequence_number]),
        "complete_message": lambda r, m: r.complete_message(m),
        "abandon_message": lambda r, m: r.abandon_message(m),
        "defer_message": lambda r, m: r.defer_message(m),
        "dead_letter_message": lambda r, m: r.dead_letter_message(m, reason="r"),
        "session.renew_lock": lambda r, m: r.session.renew_lock(),
        "session.get_state": lambda r, m: r.session.get_state(),
        "session.set_state": lambda r, m: r.session.set_state("s"),
    }
    held = {}
    for name in operations:  # one session each: an answer of the service about one lock does not affect another
        _send(client, q, name, "m")
        receiver = client.get_queue_receiver(q, session_id=name)
        held[name] = receiver, receiver.receive_messages(max_wait_time=SHORT)[0]
    clock.advance(30)  # the locks' expiry: expired (locked_until_utc <= utc_now())
    for name, operation in operations.items():
        with pytest.raises(SessionLockLostError) as lost:
            operation(*held[name])
        assert str(lost.value) == SESSION_LOCK_LOST, name
    assert client.broker.counts(q).locked == len(operations)  # no settlement reached the broker


def test_the_local_clock_ahead_of_the_service_loses_a_lock_the_service_still_holds(broker, queue, clock):
    # The check reads the client machine's clock, not the service's: a client clock ahead by the lock duration sees
    # every lock it is granted as expired (`_lock_expired` against utc_now()). The broker still holds the session.
    q = queue(requires_session=True, lock_duration="PT30S")
    ahead = ServiceBusClient(broker, local_clock=lambda: clock.now + timedelta(seconds=30))
    _send(ahead, q, "A", "a1")
    receiver = ahead.get_queue_receiver(q, session_id="A")
    receiver.__enter__()
    with pytest.raises(SessionLockLostError):
        receiver.receive_messages(max_wait_time=SHORT)
    assert broker.counts(q).active == 1 and broker.counts(q).locked == 0  # nothing was received
    behind = ServiceBusClient(broker, local_clock=lambda: clock.now - timedelta(seconds=30))
    with pytest.raises(SessionCannotBeLockedError):  # the service still holds the session for `ahead`'s receiver
        behind.get_queue_receiver(q, session_id="A", retry_total=0).__enter__()


def test_a_message_lock_expired_on_the_local_clock_is_refused_before_the_service_is_asked(broker, queue, clock):
    # _servicebus_receiver.py `_settle_message_with_retry`: `if not self._session and message._lock_expired: raise
    # MessageLockLostError(message="The lock on the message lock has expired.", error=message.auto_renew_error)`.
    q = queue(lock_duration="PT30S")
    ahead = ServiceBusClient(broker, local_clock=lambda: clock.now + timedelta(seconds=30))
    ahead.get_queue_sender(q).send_messages(ServiceBusMessage("x"))
    receiver = ahead.get_queue_receiver(q)
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    with pytest.raises(MessageLockLostError) as lost:
        receiver.complete_message(msg)
    assert str(lost.value) == "The lock on the message lock has expired."
    assert broker.counts(q).locked == 1  # the service was not asked: the message is still locked there


def test_a_lock_the_service_reports_lost_stays_lost(broker, queue, clock):
    # _base_handler.py `_handle_exception`: SessionLockLostError on a running session receiver sets
    # `_session._lock_lost`, so every later operation raises it without asking the service.
    q = queue(requires_session=True, lock_duration="PT30S")
    behind = ServiceBusClient(broker, local_clock=lambda: clock.now - timedelta(seconds=60))
    _send(behind, q, "A", "a1")
    receiver = behind.get_queue_receiver(q, session_id="A")
    [msg] = receiver.receive_messages(max_wait_time=SHORT)
    clock.advance(31)  # expired at the service; not yet on the client's clock, which is behind
    with pytest.raises(SessionLockLostError):
        receiver.complete_message(msg)  # the service's answer
    with pytest.raises(SessionLockLostError):
        receiver.peek_messages()  # the client's: a peek would not ask the service about the lock


async def test_the_aio_receiver_checks_the_session_lock_on_the_local_clock(broker, queue, clock):
    # azure/servicebus/aio/_base_handler_async.py `_check_live`, as the sync one.
    q = queue(requires_session=True, lock_duration="PT30S")
    async with client_aio.ServiceBusClient(broker) as aclient:
        async with aclient.get_queue_sender(q) as sender:
            await sender.send_messages(ServiceBusMessage("a1", session_id="A"))
        async with aclient.get_queue_receiver(q, session_id="A") as receiver:
            [msg] = await receiver.receive_messages(max_wait_time=SHORT)
            clock.advance(30)
            with pytest.raises(SessionLockLostError):
                await receiver.peek_messages()  # the client's answer: the broker does not check a peek's session
            with pytest.raises(SessionLockLostError):
                await receiver.receive_messages(max_wait_time=SHORT)
            with pytest.raises(SessionLockLostError):
                await receiver.session.get_state()
            with pytest.raises(SessionLockLostError):
                await receiver.complete_message(msg)


# -- 2. NEXT_AVAILABLE_SESSION with no session: the SDK's retries, on the injected clock -----------------------


def test_opening_with_no_session_takes_four_service_waits_and_three_backoffs(timed, queue, timer):
    # `__enter__` is `_open_with_retry` (_base_handler.py): `_do_retryable_operation` with no budget, retry_total 3
    # (_common/_configuration.py), backoff 0.8 * 2**n (`_get_backoff_time`): 1.6, 3.2, 6.4 s. Each attempt is the
    # service's wait for a session, the receiver's max_wait_time (`create_receive_client`: the link's timeout).
    q = queue(requires_session=True)
    with pytest.raises(OperationTimeoutError) as timeout:
        timed.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5).__enter__()
    assert timer.sleeps == [1.6, 3.2, 6.4]
    assert timer.elapsed() == pytest.approx(4 * 5 + 1.6 + 3.2 + 6.4)  # 31.2 s
    assert str(timeout.value) == (
        "No session available to receive from within max_wait_time. Error condition: com.microsoft:timeout." + HINT
    )


def test_without_max_wait_time_the_service_waits_65_seconds_per_attempt(timed, queue, timer):
    # _transport/_pyamqp_transport.py `create_receive_client`: "the default time to wait to connect to a session is
    # 65 seconds" when the receiver has no max_wait_time.
    q = queue(requires_session=True)
    with pytest.raises(OperationTimeoutError):
        timed.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION).__enter__()
    assert timer.elapsed() == pytest.approx(4 * 65 + 11.2)  # 271.2 s


def test_the_first_receive_bounds_the_retries_by_its_wait(timed, queue, timer):
    # receive_messages runs `_receive` through `_do_retryable_operation(timeout=max_wait_time)`: each attempt gets
    # what is left of that one budget (`get_attempt_timeout`), a backoff only if it fits (`_backoff`), and the last
    # attempt ends at the client's link deadline (_common/utils.py `check_link_ready_deadline`).
    q = queue(requires_session=True)
    receiver = timed.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)
    with pytest.raises(OperationTimeoutError) as timeout:
        receiver.receive_messages(max_wait_time=30)
    assert timer.sleeps == [1.6, 3.2, 6.4]  # attempts at 0, 6.6, 14.8 and 26.2 s; the last one cut at 30 s
    assert timer.elapsed() == pytest.approx(30)
    assert str(timeout.value) == "Timed out waiting for the AMQP link to open." + HINT
    timer.sleeps.clear()
    with pytest.raises(OperationTimeoutError):
        receiver.receive_messages()  # the receiver's 5 s is the whole budget: one attempt, no backoff fits
    assert timer.sleeps == [] and timer.elapsed() == pytest.approx(35)


def test_a_session_that_comes_during_a_backoff_is_taken_by_the_next_attempt(timed, queue, timer):
    q = queue(requires_session=True)
    timer.on_sleep = lambda: _send(timed, q, "late", "x")
    with timed.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as receiver:
        assert receiver.session.session_id == "late"
    assert timer.sleeps == [1.6] and timer.elapsed() == pytest.approx(5 + 1.6)


def test_a_locked_named_session_is_retried_before_session_cannot_be_locked(timed, queue, timer):
    # exceptions.py: SessionCannotBeLockedError is retryable, so `_open_with_retry` tries four times.
    q = queue(requires_session=True)
    holder = timed.get_queue_receiver(q, session_id="A")
    holder.__enter__()
    with pytest.raises(SessionCannotBeLockedError):
        timed.get_queue_receiver(q, session_id="A").__enter__()
    assert timer.sleeps == [1.6, 3.2, 6.4] and timer.elapsed() == pytest.approx(11.2)


def test_retry_options_are_the_sdk_keywords(broker, queue, timer):
    # ServiceBusClient(retry_total=..., retry_backoff_factor=..., retry_mode=...) and the same per handler.
    q = queue(requires_session=True)
    with ServiceBusClient(broker, _timer=timer, retry_total=1, retry_backoff_factor=2, retry_mode="fixed") as c:
        with pytest.raises(OperationTimeoutError):
            c.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1).__enter__()
        assert timer.sleeps == [2]
        with pytest.raises(OperationTimeoutError):
            c.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1, retry_total=0).__enter__()
        assert timer.sleeps == [2]


async def test_the_aio_receiver_retries_as_the_sync_one(broker, queue, timer):
    # aio/_base_handler_async.py `_do_retryable_operation` / `_backoff` (asyncio.sleep).
    q = queue(requires_session=True)
    async with client_aio.ServiceBusClient(broker, _timer=timer) as aclient:
        receiver = aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)
        with pytest.raises(OperationTimeoutError):
            await asyncio.wait_for(receiver.__aenter__(), timeout=30)  # a bound on real time, should it hang
    assert timer.sleeps == [1.6, 3.2, 6.4] and timer.elapsed() == pytest.approx(31.2)


# -- 3. closing a receiver without settling: the delivery count -------------------------------------------------


def test_closing_a_session_receiver_without_settling_counts_no_delivery(client, queue):
    # learn.microsoft.com/azure/service-bus-messaging/message-sessions#impact-of-delivery-count: "Session is
    # accepted, the messages within the session aren't completed (even if they're locked), and the session is
    # closed": delivery count incremented: No.
    q = queue(requires_session=True)
    _send(client, q, "A", "a1")
    with client.get_queue_receiver(q, session_id="A") as receiver:
        receiver.receive_messages(max_wait_time=SHORT)
    with client.get_queue_receiver(q, session_id="A") as again:
        [msg] = again.receive_messages(max_wait_time=SHORT)
    assert msg.delivery_count == 0


def test_a_session_lock_that_expires_counts_a_delivery(client, queue, clock):
    # The same table: "Session is accepted, but the session lock expires (due to timeout)": Yes.
    q = queue(requires_session=True, lock_duration="PT30S")
    _send(client, q, "A", "a1")
    client.get_queue_receiver(q, session_id="A").receive_messages(max_wait_time=SHORT)
    clock.advance(31)
    with client.get_queue_receiver(q, session_id="A") as again:
        [msg] = again.receive_messages(max_wait_time=SHORT)
    assert msg.delivery_count == 1


def test_a_session_lock_that_expired_before_the_close_counts_a_delivery(client, queue, clock):
    # The same table: the lock expired while the receiver held it; closing the receiver afterwards does not make
    # the expiry a close (the broker's release_session).
    q = queue(requires_session=True, lock_duration="PT30S")
    _send(client, q, "A", "a1")
    with client.get_queue_receiver(q, session_id="A") as receiver:
        receiver.receive_messages(max_wait_time=SHORT)
        clock.advance(31)
    with client.get_queue_receiver(q, session_id="A") as again:
        [msg] = again.receive_messages(max_wait_time=SHORT)
    assert msg.delivery_count == 1


def test_closing_a_receiver_leaves_its_unsettled_messages_locked_until_the_lock_expires(client, queue, clock):
    # _servicebus_receiver.py `_close_handler` releases only the deliveries the link buffered and never handed out
    # (drain_and_release_messages; a release counts no delivery); a message handed to the caller keeps its lock,
    # which counts a delivery when it expires. The embedded client buffers nothing (no prefetch).
    q = queue(lock_duration="PT30S")
    client.get_queue_sender(q).send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(q) as receiver:
        receiver.receive_messages(max_wait_time=SHORT)
    assert client.get_queue_receiver(q).receive_messages(max_wait_time=SHORT) == []  # still locked
    clock.advance(31)
    [msg] = client.get_queue_receiver(q).receive_messages(max_wait_time=SHORT)
    assert msg.delivery_count == 1


# -- 4. a queue that does not exist --------------------------------------------------------------------------------


def _not_found(error: ServiceBusAuthenticationError, entity: str) -> None:
    """What the SDK raised over the AMQP endpoint and on Service Bus (azure-sdk-for-python tests/test_sessions.py
    test_session_connection_failure_is_idempotent): the put-token's 404 in the inner TokenAuthFailure."""
    assert error._condition == "amqp:client-error" and error._retryable
    inner = error.inner_exception
    assert isinstance(inner, TokenAuthFailure) and inner.status_code == 404
    assert inner.status_description == f"The messaging entity 'sb://embedded/{entity}' could not be found.".encode()


def test_a_missing_queue_is_retried_then_raised_as_the_sdk_raises_it(timed, timer):
    # exceptions.py: ServiceBusAuthenticationError is retryable; `_open_with_retry` tries four times, no budget.
    with pytest.raises(ServiceBusAuthenticationError) as sending:
        timed.get_queue_sender("nowhere").__enter__()
    _not_found(sending.value, "nowhere")
    assert timer.sleeps == [1.6, 3.2, 6.4]
    with pytest.raises(ServiceBusAuthenticationError) as dead:
        timed.get_queue_receiver("nowhere", sub_queue="deadletter").__enter__()
    _not_found(dead.value, "nowhere/$DeadLetterQueue")


def test_a_missing_queue_within_a_receive_is_retried_within_its_wait(timed, timer):
    # _servicebus_receiver.py receive_messages: `_do_retryable_operation(timeout=max_wait_time)`; `_backoff` backs
    # off only when the backoff fits in what is left (1.6 and 3.2 fit in 5 s, 6.4 does not).
    with pytest.raises(ServiceBusAuthenticationError) as receiving:
        timed.get_queue_receiver("nowhere").receive_messages(max_wait_time=5)
    _not_found(receiving.value, "nowhere")
    assert timer.sleeps == [1.6, 3.2]


async def test_the_aio_sender_retries_a_missing_queue_as_the_sync_one(broker, timer):
    async with client_aio.ServiceBusClient(broker, _timer=timer) as aclient:
        with pytest.raises(ServiceBusAuthenticationError) as sending:
            await aclient.get_queue_sender("nowhere").send_messages(ServiceBusMessage("x"))
    _not_found(sending.value, "nowhere")
    assert timer.sleeps == [1.6, 3.2, 6.4]
