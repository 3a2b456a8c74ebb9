"""The endpoint: a proton reactor listening on a TCP port, SASL ANONYMOUS, and each link routed by its address
to a queue, its dead-letter queue, its `$management` node or `$cbs`. `Endpoint.run` serves on the calling
thread, `stop` (any thread, a signal handler) ends it. Design and differences: docs/modules-product.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.servicebus.exceptions import MessagingEntityNotFoundError
from proton import Connection, Event, Handler, Link, Message, Receiver, Sender, int32
from proton import Endpoint as ProtonEndpoint
from proton.reactor import ApplicationEvent, Container, EventInjector

from orderflow.embedded.broker import DEAD_LETTER, EmbeddedBroker
from orderflow.embedded.rights import LISTEN, OWNER, SEND, load_rights, unauthorized_description
from orderflow.embedded.rights import unknown_identity_description as unknown_identity

from ._codec import Address, owned, parse_address
from ._delivering import DeliveryLink
from ._errors import NOT_ALLOWED, NOT_FOUND, UNAUTHORIZED, AmqpError, classify
from ._faults import WireFaults
from ._identity import CBS_NODE, ConnectionIdentity, put_token
from ._links import MAX_REQUEST, InboundLink, ReplyLink, open_link, queue_consumer, refuse_link
from ._management import Request, refusal, respond
from ._waiting import guarded

CONTAINER_ID = "orderflow-devhost-servicebus"
_STOP = "endpoint_stop"
_STOP_GRACE = 0.2  # seconds the reactor gets to write the close frames before it stops
T = TypeVar("T")


@dataclass
class ConnectionState:
    """What the endpoint keeps per AMQP connection: who it is (CBS tokens) and its links' nodes."""

    identity: ConnectionIdentity = field(default_factory=ConnectionIdentity)
    nodes: list[Any] = field(default_factory=list)

    def delivery_links(self) -> Iterator[DeliveryLink]:
        return (node for node in self.nodes if isinstance(node, DeliveryLink))


def _state(connection: Connection) -> ConnectionState:
    state = getattr(connection, "endpoint_state", None)
    if not isinstance(state, ConnectionState):
        state = ConnectionState()
        connection.endpoint_state = state
    return state


def _present(value: T | None) -> T:
    """The object an event is about (proton types every one of them optional)."""
    if value is None:
        raise LookupError("the event carries no such object")
    return value


class _Dispatcher(Handler):
    """proton's events for every connection of the endpoint."""

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.broker = endpoint.broker
        self.connections: set[Connection] = set()
        self._faults: WireFaults | None = None

    @property
    def faults(self) -> WireFaults:
        """The broker's injected faults, answered on the wire (made once the endpoint's container exists)."""
        if self._faults is None:
            self._faults = WireFaults(self.broker, self.endpoint.container)
        return self._faults

    # -- connection and session -------------------------------------------------------------------------------

    def on_connection_bound(self, event: Event) -> None:
        _present(event.transport).sasl().allowed_mechs("ANONYMOUS")  # the SDKs authenticate with CBS afterwards

    def on_connection_remote_open(self, event: Event) -> None:
        connection = _present(event.connection)
        self.connections.add(connection)
        _state(connection)
        connection.container = CONTAINER_ID
        connection.open()

    def on_session_remote_open(self, event: Event) -> None:
        _present(event.session).open()

    def on_session_remote_close(self, event: Event) -> None:
        session = _present(event.session)
        for node in list(_state(session.connection).nodes):
            if node.link.session == session:
                self._detach(node)
        session.close()

    def on_connection_remote_close(self, event: Event) -> None:
        connection = _present(event.connection)
        for node in list(_state(connection).nodes):
            self._detach(node)
        connection.close()

    def on_transport_closed(self, event: Event) -> None:
        connection = event.connection
        if connection is None:
            return
        self.connections.discard(connection)
        for node in list(_state(connection).nodes):  # dropped without a close: a crashed client
            if isinstance(node, DeliveryLink):
                node.abandon_connection()
            else:
                node.detach()
        _state(connection).nodes.clear()

    # -- links ------------------------------------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:
        link = _present(event.link)
        if not link.state & ProtonEndpoint.LOCAL_UNINIT:
            return
        queue = _queue_of(link)
        if queue is not None and self.faults.answer("open", queue, link.connection, partial(refuse_link, link)):
            return
        try:
            if isinstance(link, Receiver):
                node: Any = self._attach_receiver(link)
            else:
                assert isinstance(link, Sender)
                node = self._attach_sender(link)
        except Exception as exc:  # noqa: BLE001 - refused with the condition the SDK maps
            refuse_link(link, classify(exc))
            return
        link.endpoint_node = node
        _state(link.connection).nodes.append(node)

    def _attach_receiver(self, link: Receiver) -> InboundLink:
        """A client's sender: to `$cbs`, to a `$management` node, or to a queue."""
        target = link.remote_target.address
        if target == CBS_NODE:
            node = InboundLink(link, self._cbs_request, MAX_REQUEST)
            node.open(announce_size=False)
            return node
        address = _address(target)
        if address.management:  # a scheduled message travels in a request: room for the queue's largest
            node = InboundLink(link, self._management_request(address), MAX_REQUEST + self._message_limit(address))
            node.open(announce_size=False)
            return node
        if address.sub_queue == DEAD_LETTER:
            raise AmqpError(NOT_ALLOWED, "Messages cannot be sent to a dead-letter queue.", 400)
        limit = self.broker.queue_properties(address.queue).max_message_size_bytes  # Standard's, or Premium's
        self._authorize(link.connection, address, SEND)
        node = InboundLink(link, queue_consumer(self.broker, address), limit, faults=(self.faults, address.queue))
        node.open(announce_size=True)
        return node

    def _message_limit(self, address: Address) -> int:
        try:
            return self.broker.queue_properties(address.queue).max_message_size_bytes
        except MessagingEntityNotFoundError:  # its requests are answered 404
            return 0

    def _attach_sender(self, link: Sender) -> ReplyLink | DeliveryLink:
        """A client's receiver: of `$cbs` or `$management` responses, or of a queue's messages."""
        source = link.remote_source.address
        if source == CBS_NODE or (source and _address(source).management):
            open_link(link)
            return ReplyLink(link)
        address = _address(source)
        self.broker.queue_properties(address.queue)
        self._authorize(link.connection, address, LISTEN)
        node = DeliveryLink(self.broker, self.endpoint.container, link, address, self.faults)
        node.core.link()  # the entity's session-ness against the link's filter (ServiceBusError: amqp:not-allowed)
        node.attach(lambda error: refuse_link(link, error))
        return node

    def on_link_remote_close(self, event: Event) -> None:
        link = _present(event.link)
        node = getattr(link, "endpoint_node", None)
        if node is not None:
            self._detach(node)
        elif link.state & ProtonEndpoint.LOCAL_ACTIVE:
            link.close()

    def _detach(self, node: Any) -> None:
        node.detach()
        nodes = _state(node.link.connection).nodes
        if node in nodes:
            nodes.remove(node)
        if node.link.state & (ProtonEndpoint.LOCAL_ACTIVE | ProtonEndpoint.LOCAL_UNINIT):
            node.link.close()

    def on_link_flow(self, event: Event) -> None:
        node = getattr(event.link, "endpoint_node", None)
        if isinstance(node, DeliveryLink):
            node.on_flow()
        elif isinstance(node, ReplyLink):
            node.flush()

    def on_delivery(self, event: Event) -> None:
        delivery = _present(event.delivery)
        node = getattr(delivery.link, "endpoint_node", None)
        if isinstance(node, InboundLink):
            node.on_delivery(delivery)
        elif isinstance(node, DeliveryLink):
            if delivery.updated or delivery.settled:
                node.on_disposition(delivery)
        elif isinstance(node, ReplyLink):
            node.on_delivery(delivery)

    # -- requests -----------------------------------------------------------------------------------------------

    def _cbs_request(self, payload: bytes, link: Link) -> None:
        request = _decoded(payload)
        raw: dict[Any, Any] = dict(request.properties or {})
        properties = {str(k): v for k, v in raw.items()}
        try:
            identity = _state(link.connection).identity
            status, description = put_token(
                identity, properties, owned(request.body), self._audience_exists, self._refused_key
            )
        except AmqpError as error:
            status, description = error.status, error.description
        response = Message(
            correlation_id=request.id,
            properties={"status-code": int32(status), "status-description": description},
        )
        self._reply(link, request, response)

    def _audience_exists(self, audience: str) -> bool:
        """Whether a token's audience (`sb://host/<entity>`, or the namespace) names an existing entity."""
        address = parse_address(audience.split("://", 1)[1].partition("/")[2] if "://" in audience else audience)
        if address is None:
            return True  # the namespace itself
        try:
            self.broker.queue_properties(address.queue)
        except MessagingEntityNotFoundError:
            return False
        return True

    # -- rights (orderflow/embedded/rights): the SAS key name of the link's token is its identity ----------------

    def _refused_key(self, key_name: str) -> str | None:
        """The put-token refusal of a key name that is neither the owner's nor an identity of infra/."""
        if key_name == OWNER or load_rights(self.endpoint.infra).knows(key_name):
            return None
        return unknown_identity(key_name)

    def _authorize(self, connection: Connection, address: Address, claim: str) -> None:
        """Refuse a link or a request whose identity lacks `claim` on the queue (its dead-letter queue and
        `$management` node are part of it) as Service Bus does: amqp:unauthorized-access, 401."""
        entity = address.queue + ("/$deadletterqueue" if address.sub_queue == DEAD_LETTER else "")
        entity += "/$management" if address.management else ""
        identity = _state(connection).identity
        key_name = identity.key_name_for(entity)
        if key_name is None or key_name == OWNER:
            return
        if not load_rights(self.endpoint.infra).bus_allows(key_name, claim, address.queue):
            host = next((urlsplit(t.audience).netloc for t in identity.tokens.values() if "://" in t.audience), "")
            resource = f"sb://{host or self.endpoint.url.removeprefix('amqp://')}/{entity.lower()}"
            raise AmqpError(UNAUTHORIZED, unauthorized_description(claim, resource), 401)

    def _management_request(self, address: Address) -> Callable[[bytes, Link], None]:
        def consume(payload: bytes, link: Link) -> None:
            request = _decoded(payload)
            raw: dict[Any, Any] = dict(request.properties or {})
            operation = str(raw.get("operation") or "").removeprefix("com.microsoft:")

            def refuse(error: AmqpError) -> None:
                self._reply(link, request, refusal(request, error))

            if self.faults.answer(operation, address.queue, link.connection, refuse):
                return
            state = _state(link.connection)

            def authorize(claim: str) -> None:
                self._authorize(link.connection, address, claim)

            entity = Request(self.broker, address, request, state.delivery_links, authorize)
            self._reply(link, request, respond(entity))

        return consume

    def _reply(self, link: Link, request: Message, response: Message) -> None:
        """Send on the reply link of the request's connection: the one whose target is the request's reply-to,
        else the one on the same node (the SDK's `$cbs` requests name no reply-to); one in the same session first."""
        node_address = link.remote_target.address
        replies = [n for n in _state(link.connection).nodes if isinstance(n, ReplyLink) and not n.closed]
        matching = [n for n in replies if request.reply_to and n.reply_to == request.reply_to] or [
            n for n in replies if n.node == node_address
        ]
        matching.sort(key=lambda n: n.link.session != link.session)
        if not matching:
            raise AmqpError(NOT_FOUND, f"No reply link to {request.reply_to or node_address} is attached.", 404)
        matching[0].send(response)

    # -- stopping -----------------------------------------------------------------------------------------------

    def on_endpoint_stop(self, event: Event) -> None:
        self.endpoint.acceptor.close()
        for connection in list(self.connections):
            for node in list(_state(connection).nodes):
                guarded(partial(self._detach, node))
            connection.close()
        self.endpoint.injector.close()
        self.endpoint.container.schedule(_STOP_GRACE, _Stopper(self.endpoint.container))


class _Stopper(Handler):
    def __init__(self, container: Container) -> None:
        super().__init__()
        self.container = container

    def on_timer_task(self, event: Event) -> None:
        self.container.stop()


def _decoded(payload: bytes) -> Message:
    message = Message()
    try:
        message.decode(payload)
    except Exception as exc:  # noqa: BLE001
        raise AmqpError("amqp:decode-error", f"The request could not be decoded: {exc}", 400) from exc
    return message


def _queue_of(link: Link) -> str | None:
    """The queue a link to or from a queue (or its dead-letter queue) names; None for `$cbs` and `$management`."""
    terminus = link.remote_target if isinstance(link, Receiver) else link.remote_source
    address = terminus.address
    parsed = None if address == CBS_NODE else parse_address(address)
    return None if parsed is None or parsed.management else parsed.queue


def _address(address: str | None) -> Address:
    parsed = parse_address(address)
    if parsed is None:
        raise AmqpError(NOT_FOUND, f"The messaging entity '{address}' could not be found.", 404)
    return parsed


class _GuardedDispatcher(_Dispatcher):
    """Every event handled under `guarded`: one failing link must not stop the reactor and every client."""

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name.startswith("on_") and callable(value):
            return lambda *args: guarded(lambda: value(*args))
        return value


class Endpoint:
    """The AMQP endpoint over one broker, bound to `host:port` (0: a port the OS chooses, see `port`)."""

    def __init__(
        self, broker: EmbeddedBroker, host: str = "127.0.0.1", port: int = 5672, infra: Path | None = None
    ) -> None:
        """`infra`: the folder whose role assignments give each SAS key name its rights (default: infra/)."""
        self.broker, self.infra = broker, infra
        self._dispatcher = _GuardedDispatcher(self)
        self.container = Container(self._dispatcher)
        self.container.container_id = CONTAINER_ID
        self.injector = EventInjector()
        self.container.selectable(self.injector)
        self.acceptor = self.container.acceptor(host, str(port))
        # The listening socket is the acceptor's selectable's delegate (proton keeps it private).
        self.host, self.port = host, int(self.acceptor._selectable.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"amqp://{host}:{self.port}"

    def identities(self) -> list[ConnectionIdentity]:
        """Who each open connection authenticated as (CBS tokens): where a later issue enforces rights."""
        return [_state(connection).identity for connection in list(self._dispatcher.connections)]

    def run(self) -> None:
        """Serve until `stop`."""
        self.container.run()

    def stop(self) -> None:
        """Close every connection and end `run` (thread-safe; safe in a signal handler)."""
        self.injector.trigger(ApplicationEvent(_STOP))
