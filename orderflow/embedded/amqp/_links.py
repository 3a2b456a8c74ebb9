"""The clients' sender links (to a queue, to `$cbs`, to a `$management` node) and the reply links requests are
answered on: transfers read whole (multi-frame), the size limit, settlement with Service Bus's conditions, and
credit kept topped up. Sources and differences: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Callable

from proton import Delivery, Link, Message, Receiver, Sender, Terminus

from orderflow.embedded.broker import EmbeddedBroker

from ._codec import MAX_MESSAGE_SIZE, Address, decode_transfer
from ._errors import MESSAGE_SIZE_EXCEEDED, UNAUTHORIZED, AmqpError, classify
from ._faults import WireFaults

CREDIT = 100  # transfers a client may send before the endpoint tops its credit up again
MAX_REQUEST = 1024 * 1024  # a `$management` or `$cbs` request (a scheduled batch) may be larger than a message
Consumer = Callable[[bytes, Link], None]  # raises AmqpError (or a broker exception) to reject the transfer


def echo_terminus(link: Link) -> None:
    """Take the client's own source, target and settle modes as the answer's (the SDKs compare the echoed address)."""
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.snd_settle_mode = link.remote_snd_settle_mode
    link.rcv_settle_mode = link.remote_rcv_settle_mode


def open_link(link: Link) -> None:
    """Answer an attach with the client's own terminus (`echo_terminus`)."""
    echo_terminus(link)
    link.open()


def refuse_link(link: Link, error: AmqpError) -> None:
    """Refuse an attach as Service Bus does: attach (with source and target: pyamqp drops an attach without them,
    azure/servicebus/_pyamqp/link.py `_incoming_attach`), then detach with the error. The echoed source carries no
    filter: @azure/service-bus reads a session filter echoed back as a granted session and only then sees the
    detach (messageSession.js `createRheaLink`: a named session answered without its id is SessionCannotBeLocked).
    A missing claim (amqp:unauthorized-access) is refused as AMQP refuses a link, with the local terminus null
    (AMQP 1.0 part 2.6.3): pyamqp then never counts the link attached, and raises the detach's error before a
    transfer (_pyamqp/link.py `get_state`), as the SDK's live test against Service Bus expects of a listen-only key
    (tests/test_sb_client.py `test_sb_client_readonly_credentials`: ServiceBusAuthorizationError)."""
    if link.state & Link.LOCAL_UNINIT:
        if error.condition == UNAUTHORIZED:
            echo_terminus(link)
            (link.target if link.is_receiver else link.source).type = Terminus.UNSPECIFIED  # null on the wire
            link.open()
        else:
            open_link(link)
            link.source.filter.clear()
    link.condition = error.to_condition()
    link.close()


class InboundLink:
    """A client's sender link: every complete transfer goes to `consume`; accepted, or rejected with the
    condition of what it raised."""

    def __init__(
        self,
        link: Receiver,
        consume: Consumer,
        max_size: int = MAX_MESSAGE_SIZE,
        *,
        faults: tuple[WireFaults, str] | None = None,
    ) -> None:
        self.link, self.consume, self.max_size = link, consume, max_size
        self.faults = faults  # a queue's sender link: the broker's injected faults answer its sends ("send")
        self.closed = False

    def open(self, *, announce_size: bool) -> None:
        if announce_size:  # Service Bus announces the entity's limit on a sender's attach (the SDK sizes batches)
            self.link.max_message_size = self.max_size
        open_link(self.link)
        self.link.flow(CREDIT)

    def on_delivery(self, delivery: Delivery) -> None:
        if not delivery.readable or self.closed:
            return
        chunk = self.link.recv(delivery.pending) or b""
        delivery.buffer = getattr(delivery, "buffer", b"") + chunk
        if delivery.partial:
            return
        payload: bytes = delivery.buffer
        delivery.buffer = b""
        self.link.advance()
        if delivery.aborted:
            delivery.settle()
            return
        if self.faults is not None:
            faults, queue = self.faults
            if faults.answer("send", queue, self.link.connection, lambda error: self._settle(delivery, error)):
                return
        outcome: AmqpError | None = None
        try:
            if len(payload) > self.max_size:
                raise AmqpError(
                    MESSAGE_SIZE_EXCEEDED,
                    f"The received message (size {len(payload)} bytes) exceeds the limit ({self.max_size} bytes) "
                    "currently allowed on the link.",
                    413,
                )
            self.consume(payload, self.link)
        except Exception as exc:  # noqa: BLE001 - rejected with the condition the SDK maps
            outcome = classify(exc)
        self._settle(delivery, outcome)

    def _settle(self, delivery: Delivery, outcome: AmqpError | None) -> None:
        """Accept the transfer, or reject it with the error; top the credit up."""
        if self.closed:
            return
        if not delivery.settled:
            if outcome is None:
                delivery.update(Delivery.ACCEPTED)
            else:
                delivery.local.condition = outcome.to_condition()
                delivery.update(Delivery.REJECTED)
        delivery.settle()
        if self.link.credit < CREDIT // 2:
            self.link.flow(CREDIT - self.link.credit)

    def detach(self) -> None:
        self.closed = True


def queue_consumer(broker: EmbeddedBroker, address: Address) -> Consumer:
    """Store what a client sends to a queue: one message or a batch, atomically (duplicate detection, scheduled
    enqueue times and TTL are the broker's)."""

    def consume(payload: bytes, link: Link) -> None:
        broker.send(address.queue, decode_transfer(payload))

    return consume


class ReplyLink:
    """A client's receiver link for responses (`$cbs`, `<entity>/$management`): responses wait for credit."""

    def __init__(self, link: Sender) -> None:
        self.link = link
        self.pending: list[bytes] = []
        self.closed = False
        self._tag = 0

    @property
    def reply_to(self) -> str | None:
        return self.link.remote_target.address

    @property
    def node(self) -> str | None:
        return self.link.remote_source.address

    def send(self, message: Message) -> None:
        self.pending.append(bytes(message.encode()))
        self.flush()

    def flush(self) -> None:
        while self.pending and self.link.credit > 0 and not self.closed:
            self._tag += 1
            self.link.delivery(str(self._tag))
            self.link.send(self.pending.pop(0))
            self.link.advance()

    def on_delivery(self, delivery: Delivery) -> None:
        if delivery.settled:  # the client settled a response: forget it
            delivery.settle()

    def detach(self) -> None:
        self.closed = True
        self.pending.clear()
