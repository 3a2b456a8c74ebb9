"""Receiver links of the clients: a queue's or dead-letter queue's messages delivered within the link credit
(peek-lock or receive-and-delete), the session filter (a named session or the next available one, the attach
held until one is free), and the client's dispositions applied as complete, abandon, defer, dead-letter or
release, answered with the outcome the SDKs await. Sources and differences: docs/modules-product.md."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode, ServiceBusSubQueue
from proton import Condition, Delivery, Disposition, Link, Sender, symbol
from proton.reactor import Container

if TYPE_CHECKING:
    from proton._reactor import Task  # the type of Container.schedule's result (not re-exported)

from orderflow.embedded._core import ReceiverCore
from orderflow.embedded.broker import DEAD_LETTER, EmbeddedBroker, SessionLock, Taken

from ._codec import Address, delivery_tag, encode_stored, to_ticks
from ._errors import DEAD_LETTER as DEAD_LETTER_CONDITION
from ._errors import SESSION_LOCK_LOST, TIMEOUT, AmqpError, classify
from ._faults import WireFaults
from ._links import echo_terminus
from ._waiting import Later, Wait

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
TIMEOUT_PROPERTY = "com.microsoft:timeout"
DEFAULT_ACCEPT_TIMEOUT = 60.0  # seconds an attach for the next available session waits when the client names none
_BATCH = 100  # messages taken from the broker per transaction at most
_NO_FILTER = object()


def session_filter(link: Link) -> Any:
    """The session the attach asks for: a session id, None (the next available one), or `_NO_FILTER`."""
    data = link.remote_source.filter
    filters = None
    if data is not None:
        data.rewind()
        filters = data.get_object() if data.next() else None
    if not isinstance(filters, dict):
        return _NO_FILTER
    for key, value in filters.items():
        if str(key) == str(SESSION_FILTER):
            return None if value is None else str(value)
    return _NO_FILTER


def _accept_timeout(link: Link) -> float:
    for key, value in (link.remote_properties or {}).items():
        if str(key) == TIMEOUT_PROPERTY and isinstance(value, int) and value > 0:
            return int(value) / 1000
    return DEFAULT_ACCEPT_TIMEOUT


class DeliveryLink:
    """One receiver link of a client: what it receives from, how, and the messages it has not settled."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        container: Container,
        link: Sender,
        address: Address,
        faults: WireFaults | None = None,
    ) -> None:
        self.broker, self.container, self.link, self.address = broker, container, link, address
        self.faults = faults
        self.name = link.name
        self.delete = link.remote_snd_settle_mode == Link.SND_SETTLED  # pre-settled deliveries: receive-and-delete
        self.wanted = session_filter(link)
        self.session: SessionLock | None = None
        self.opened = False
        self.closed = False
        self._wait: Wait[Any] | None = None
        self._expiry: Task | None = None
        self._more = True
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if self.delete else ServiceBusReceiveMode.PEEK_LOCK
        self.core = ReceiverCore(
            broker,
            address.queue,
            self,
            session_id=None if self.wanted is _NO_FILTER else (self.wanted or NEXT_AVAILABLE_SESSION),
            sub_queue=ServiceBusSubQueue.DEAD_LETTER if address.sub_queue == DEAD_LETTER else None,
            receive_mode=mode,
        )

    @property
    def sessionful(self) -> bool:
        return self.wanted is not _NO_FILTER

    # -- attach ---------------------------------------------------------------------------------------------

    def attach(self, refuse: Callable[[AmqpError], None]) -> None:
        """Answer the attach: at once, or (next available session, none free) once a session is, or with
        `com.microsoft:timeout` when the client's `com.microsoft:timeout` passes first."""
        if not self.sessionful:
            self._open()
            return
        lock = self.broker.accept_session(self.address.queue, self.wanted)
        if lock is not None:
            self._open(lock)
            return

        def accepted(found: SessionLock | AmqpError | None) -> None:
            self._wait = None
            if self.closed:
                if isinstance(found, SessionLock):
                    self.broker.release_session(self.address.queue, found)
                return
            if isinstance(found, SessionLock):
                self._open(found)
                return
            self.closed = True
            self.core.close_waiter()
            refuse(found or AmqpError(TIMEOUT, "No session is available within the requested timeout.", 408))

        timeout = _accept_timeout(self.link)
        self._wait = Wait(self.container, self.core, self._accept_next, accepted, timeout, register_first=True)
        self._wait.start()

    def _accept_next(self) -> SessionLock | AmqpError | None:
        try:
            return self.broker.accept_session(self.address.queue, None)
        except Exception as exc:  # noqa: BLE001 - the attach is refused with it
            return classify(exc)

    def _open(self, lock: SessionLock | None = None) -> None:
        link = self.link
        echo_terminus(link)
        if lock is not None:
            self.session = self.core.lock = lock
            link.source.filter.clear()
            link.source.filter.put_dict({SESSION_FILTER: lock.session_id})
            link.properties = {LOCKED_UNTIL: to_ticks(lock.locked_until)}
            self._watch_expiry()
        link.open()
        self.opened = True
        self.pump()

    # -- delivering -------------------------------------------------------------------------------------------

    def on_flow(self) -> None:
        """The client gave credit (a receive call): an injected fault detaches the link (or drops the connection)
        in place of delivering."""
        if self.opened and not self.closed and self.link.credit > 0 and self._fault("receive", self.detach):
            return
        self.pump()

    def _fault(self, op: str, reply: Callable[[AmqpError], None]) -> bool:
        if self.faults is None:
            return False
        return self.faults.answer(op, self.address.queue, self.link.connection, reply)

    def pump(self) -> None:
        """Deliver what the credit allows; with credit left, wait for more (or, when draining, give it back)."""
        if not self.opened or self.closed:
            return
        link = self.link
        if link.credit <= 0:
            self._stop_waiting()
            return
        if link.drain_mode:
            self._stop_waiting()
            self._deliver_taken(self._take())
            link.drained()
            return
        if self._wait is not None and self._wait.active:
            self._wait.refresh()  # a flow while waiting: look again (and recompute when to wake)
            return
        while link.credit > 0 and self._more:
            if not self._deliver_taken(self._take()):
                break
        if link.credit > 0 and not self.closed:
            self._wait = Wait(self.container, self.core, self._take_some, self._after_wait, register_first=True)
            self._wait.start()

    def _take(self) -> Taken | None:
        try:
            return self.broker.take(
                self.address.queue,
                min(self.link.credit, _BATCH),
                sub_queue=self.address.sub_queue,
                session=self.session,
                delete=self.delete,
            )
        except Exception as exc:  # noqa: BLE001 - a lost session lock (or a broker failure) ends the link
            self.detach(classify(exc))
            return None

    def _take_some(self) -> Taken | None:
        taken = self._take()
        return taken if taken is not None and taken.messages else None

    def _after_wait(self, taken: Taken | None) -> None:
        self._wait = None
        if taken is not None:
            self._deliver_taken(taken)
        self._more = True
        self.pump()

    def _deliver_taken(self, taken: Taken | None) -> bool:
        if taken is None or self.closed:
            return False
        self._more = taken.more_ready
        now = self.broker.clock()
        for stored in taken.messages:
            token = stored.lock_token
            until = self.session.locked_until if self.session is not None else stored.locked_until_utc
            payload = encode_stored(stored, now=now, lock_token=token, locked_until=until if token else None)
            tag: Any = delivery_tag(token) if token else uuid.uuid4().bytes  # proton takes bytes (typed str)
            delivery = self.link.delivery(tag)
            delivery.lock = (stored.sequence_number, token)
            self.link.send(payload)
            self.link.advance()
            if self.delete:
                delivery.settle()
        return bool(taken.messages)

    def _stop_waiting(self) -> None:
        if self._wait is not None:
            self._wait.cancel()
            self._wait = None

    # -- dispositions -----------------------------------------------------------------------------------------

    def on_disposition(self, delivery: Delivery) -> None:
        """The client settled (or stated an outcome for) a delivery: apply it, echo the outcome, settle."""
        entry = getattr(delivery, "lock", None)
        if delivery.remote_state == 0 or entry is None or entry[1] is None:
            if delivery.settled:
                delivery.settle()
            return
        seq, token = entry
        delivery.lock = None
        remote = delivery.remote
        op = _SETTLEMENTS.get(remote.type)
        if op == "abandon" and remote.undeliverable:
            op = "defer"
        if op is not None and self._fault(op, partial(_answer, delivery, remote=remote)):
            return  # the message stays locked: the SDK settles again by lock token ($management update-disposition)
        try:
            self._apply(remote, seq, token)
            outcome: Any = remote.type
        except Exception as exc:  # noqa: BLE001 - answered as the condition the SDK maps
            outcome = classify(exc)
        _answer(delivery, outcome, remote)

    def _apply(self, remote: Disposition, seq: int, token: str) -> None:
        broker, queue, session = self.broker, self.address.queue, self.session
        kind = remote.type
        if kind == Disposition.ACCEPTED:
            broker.complete(queue, seq, token, session=session)
        elif kind == Disposition.REJECTED:
            reason, description = _dead_letter_details(remote.condition)
            broker.dead_letter(queue, seq, token, reason=reason, error_description=description, session=session)
        elif kind == Disposition.MODIFIED and remote.undeliverable:
            broker.defer(queue, seq, token, session=session, properties=_properties(remote.annotations))
        elif kind == Disposition.MODIFIED:
            # Abandon, delivery-failed or not: the JavaScript SDK abandons with `modified` and no delivery-failed
            # (@azure/service-bus receiverHelpers settleMessage), pyamqp with delivery-failed; both count one.
            broker.abandon(queue, seq, token, session=session, properties=_properties(remote.annotations))
        else:  # released (pyamqp releases what arrives outside a receive call): back without counting a delivery
            broker.release(queue, seq, token, session=session)

    # -- session lock ---------------------------------------------------------------------------------------

    def renewed(self, lock: SessionLock) -> None:
        self.session = self.core.lock = lock
        self._watch_expiry()

    def _watch_expiry(self) -> None:
        """Detach with `com.microsoft:session-lock-lost` once the session lock expires unrenewed (as Service Bus
        detaches the link of an expired session)."""
        if self._expiry is not None:
            self._expiry.cancel()
        lock = self.session
        if lock is None:
            return
        delay = max((lock.locked_until - self.broker.clock()).total_seconds(), 0.0)
        self._expiry = self.container.schedule(delay + 0.01, Later(self._check_expiry))

    def _check_expiry(self) -> None:
        self._expiry = None
        lock = self.session
        if lock is None or self.closed:
            return
        if lock.locked_until <= self.broker.clock():
            self.detach(AmqpError(SESSION_LOCK_LOST, "The session lock has expired.", 410), release=False)
        else:
            self._watch_expiry()

    # -- detach -----------------------------------------------------------------------------------------------

    def detach(self, error: AmqpError | None = None, *, release: bool = True) -> None:
        """End the link (the client's detach, ours with `error`, or the connection's end)."""
        if self.closed:
            return
        self.closed = True
        self._stop_waiting()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.session is not None and self.session.locked_until <= self.broker.clock():
            release = False  # an expired lock is the broker's to end, as a failed delivery (housekeeping)
        if self.session is not None and release:
            # Service Bus counts no delivery for the messages of a session whose receiver closes its link.
            try:
                self.broker.release_session(self.address.queue, self.session)
            except Exception:  # noqa: BLE001 - the queue is gone: nothing is held
                pass
        self.session = None
        self.core.close_waiter()
        if error is not None:
            self.link.condition = error.to_condition()
        if self.link.state & Link.LOCAL_ACTIVE or self.link.state & Link.LOCAL_UNINIT:
            self.link.close()

    def abandon_connection(self) -> None:
        """The connection dropped without closing: stop, keep the session locked until it expires (as a crashed
        receiver's lock on Service Bus)."""
        self.detach(release=False)


def _dead_letter_details(condition: Condition | None) -> tuple[str | None, str | None]:
    """A rejected outcome as Service Bus reads it: `com.microsoft:dead-letter` with the reason and description in
    its info map (azure/servicebus/_transport/_pyamqp_transport.py `settle_message_via_receiver_link`)."""
    if condition is None:
        return None, None
    raw = condition.info
    info = {str(key): value for key, value in raw.items()} if isinstance(raw, dict) else {}
    reason = info.get("DeadLetterReason")
    description = info.get("DeadLetterErrorDescription", condition.description)
    if reason is None and condition.name != DEAD_LETTER_CONDITION:
        reason = condition.name
    return (None if reason is None else str(reason)), (None if description is None else str(description))


def _properties(annotations: Any) -> dict[str, Any] | None:
    if not annotations:
        return None
    return {str(key): value for key, value in dict(annotations).items()}


# The client's dispositions by their outcome, as the operations the fault switch knows.
_SETTLEMENTS: dict[Any, str] = {
    Disposition.ACCEPTED: "complete",
    Disposition.REJECTED: "dead-letter",
    Disposition.MODIFIED: "abandon",
}


def _answer(delivery: Delivery, outcome: Any, remote: Disposition) -> None:
    if not delivery.settled:
        _set_outcome(delivery, outcome, remote)
    delivery.settle()


def _set_outcome(delivery: Delivery, outcome: Any, remote: Disposition) -> None:
    """Echo the client's outcome (a bare `rejected` for a dead-letter: a rejected with an error is a refusal to
    the SDKs, azure/servicebus/_pyamqp/receiver.py `check_disposition_outcome`), or reject with the error."""
    if isinstance(outcome, AmqpError):
        delivery.local.condition = outcome.to_condition()
        delivery.update(Delivery.REJECTED)
        return
    if outcome == Disposition.MODIFIED:
        delivery.local.failed = remote.failed
        delivery.local.undeliverable = remote.undeliverable
    delivery.update(outcome)
