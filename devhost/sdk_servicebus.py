"""The Service Bus SDK-type binding on devhost: what the Functions host does for
`azurefunctions-extensions-bindings-servicebus`, so a function written for Azure runs here unchanged.

Two halves, both copied from the Azure side of the contract:

- **Input.** For a parameter annotated
  `azurefunctions.extensions.bindings.servicebus.ServiceBusReceivedMessage` the host sends a
  `model_binding_data` whose content is the lock token (UUID, .NET `Guid.ToByteArray()` = `bytes_le`) followed
  by the AMQP-encoded received message (host:
  `ServiceBusExtensionConfigProvider.ConvertReceivedMessageToBindingData`, source
  "AzureServiceBusReceivedMessage", version "1.0", content type "application/octet-stream"). The worker
  decodes it with the extension's `ServiceBusConverter.decode` (extension file `serviceBusConverter.py`, which
  uses `utils.get_decoded_message`). `to_sdk_message` builds those bytes from a message of our broker client
  and decodes them with that very converter, so the function gets the real
  `azure.servicebus.ServiceBusReceivedMessage`.

  Fidelity note: `utils.get_decoded_message` decodes from the first `x-opt-lock-token` it finds, which sits in
  the delivery-annotations section; the AMQP spec puts the header section (delivery count, TTL) before it, so
  in Azure the decoded message has `delivery_count is None` and `time_to_live is None`. We encode in spec
  order, hence the same result here; a function that needs the delivery count cannot get it from this binding
  in Azure either.

- **Settlement.** `ServiceBusMessageActions.get_instance()` (extension file `serviceBusMessageActions.py`) is
  a gRPC client of the host's `Settlement` service (`protos/settlement_pb2_grpc.py`) at the address it parses
  from `sys.argv` (`grpc_utils.parse_grpc_args`: `--host --port --functions-grpc-max-message-length`).
  `SettlementServer` is that service: it finds the in-flight `Delivery` by lock token and settles it through
  the receiver that holds the lock, on the host's event loop. `configure_message_actions(port)` points the
  client at it. Functions must therefore run off that loop: `WorkerLoop` runs them the way the worker does."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable
from concurrent import futures
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from azure.servicebus import ServiceBusReceivedMessage as SdkReceivedMessage
from azure.servicebus._pyamqp._encode import (
    encode_annotations,
    encode_payload,
    encode_value,
)  # AMQP 1.0 encoder
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    ServiceBusError,
    SessionLockLostError,
)
from azurefunctions.extensions.base import Datum
from azurefunctions.extensions.bindings.protos import settlement_pb2, settlement_pb2_grpc
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusConverter,
    ServiceBusMessageActions,
    ServiceBusReceivedMessage,
)
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp

from .servicebus_trigger import Delivery

log = logging.getLogger("devhost.sdk_servicebus")

T = TypeVar("T")

# model_binding_data of one received message (host:
# ServiceBusExtensionConfigProvider.ConvertReceivedMessageToBindingData).
BINDING_SOURCE = "AzureServiceBusReceivedMessage"
BINDING_VERSION = "1.0"
BINDING_CONTENT_TYPE = "application/octet-stream"
# The extension's client defaults to 4 MiB (grpcClient.py); the host passes its own limit in argv.
DEFAULT_GRPC_MAX_MESSAGE_LENGTH = 128 * 1024 * 1024
# How long a gRPC handler waits for the settlement coroutine on the host loop before failing the call.
SETTLE_TIMEOUT_S = 60.0

_LOCK_TOKEN = b"x-opt-lock-token"
_ENQUEUED_TIME = b"x-opt-enqueued-time"
_SEQUENCE_NUMBER = b"x-opt-sequence-number"
_LOCKED_UNTIL = b"x-opt-locked-until"
_SCHEDULED_ENQUEUE_TIME = b"x-opt-scheduled-enqueue-time"
_DELIVERY_ANNOTATIONS = 0x71  # AMQP 1.0 section descriptor amqp:delivery-annotations:map


# ----------------------------------------------------------------------------------------------------
# Annotations: which parameters the SDK-type binding serves
# ----------------------------------------------------------------------------------------------------


def is_sdk_message_type(annotation: Any) -> bool:
    """True for `servicebus.ServiceBusReceivedMessage` and iterables of it (`list[...]`, cardinality many),
    by the extension's own check (`ServiceBusConverter.check_input_type_annotation`). Pass resolved
    annotations (`typing.get_type_hints`), not the strings of `from __future__ import annotations`."""
    try:
        return bool(ServiceBusConverter.check_input_type_annotation(annotation))
    except TypeError:  # e.g. a typing construct issubclass() rejects
        return False


def is_message_actions_type(annotation: Any) -> bool:
    """True for a `servicebus.ServiceBusMessageActions` parameter (the worker injects `get_instance()`)."""
    return isinstance(annotation, type) and issubclass(annotation, ServiceBusMessageActions)


def is_sdk_batch_type(annotation: Any) -> bool:
    """True when the SDK-type parameter takes a batch (`list[ServiceBusReceivedMessage]`)."""
    return is_sdk_message_type(annotation) and not isinstance(annotation, type)


# ----------------------------------------------------------------------------------------------------
# Input: broker message -> model_binding_data -> the real azure.servicebus.ServiceBusReceivedMessage
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelBindingData:
    """The fields of the worker protocol's `ModelBindingData` that the extension reads
    (serviceBusReceivedMessage.py)."""

    version: str
    source: str
    content_type: str
    content: bytes


@dataclass(frozen=True)
class CollectionModelBindingData:
    """The worker protocol's `CollectionModelBindingData` (serviceBusConverter.py reads
    `.model_binding_data`)."""

    model_binding_data: list[ModelBindingData]


def _ms(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(round(aware.timestamp() * 1000))


def _timestamp(moment: datetime | None) -> dict[str, Any] | None:
    millis = _ms(moment)
    return None if millis is None else {TYPE: AMQPTypes.timestamp, VALUE: millis}


def _body(msg: Any) -> bytes:
    body = msg.body
    return bytes(body) if isinstance(body, (bytes, bytearray)) else b"".join(body)


def _ttl_ms(ttl: timedelta | int | float | None) -> int | None:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    return int(seconds * 1000)


def _application_properties(msg: Any) -> dict[str | bytes, Any] | None:
    """Application properties, plus the dead-letter reason/description that Service Bus stores there."""
    props: dict[str | bytes, Any] = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in (getattr(msg, "application_properties", None) or {}).items()
    }
    for name, attr in (
        ("DeadLetterReason", "dead_letter_reason"),
        ("DeadLetterErrorDescription", "dead_letter_error_description"),
    ):
        value = getattr(msg, attr, None)
        if value is not None and name not in props:
            props[name] = value
    return props or None


def _message_annotations(msg: Any) -> dict[str | bytes, Any]:
    annotations: dict[str | bytes, Any] = {
        _ENQUEUED_TIME: _timestamp(getattr(msg, "enqueued_time_utc", None)),
        _LOCKED_UNTIL: _timestamp(getattr(msg, "locked_until_utc", None)),
        _SCHEDULED_ENQUEUE_TIME: _timestamp(getattr(msg, "scheduled_enqueue_time_utc", None)),
    }
    sequence_number = getattr(msg, "sequence_number", None)
    if sequence_number is not None:
        annotations[_SEQUENCE_NUMBER] = {TYPE: AMQPTypes.long, VALUE: int(sequence_number)}
    return {k: v for k, v in annotations.items() if v is not None}


def _properties(msg: Any, ttl_ms: int | None) -> Properties:
    created = _ms(getattr(msg, "enqueued_time_utc", None))
    return Properties(
        message_id=msg.message_id,
        to=getattr(msg, "to", None),
        subject=msg.subject,
        reply_to=msg.reply_to,
        correlation_id=msg.correlation_id,
        content_type=msg.content_type,
        creation_time=created,
        absolute_expiry_time=created + ttl_ms if created is not None and ttl_ms else None,
        group_id=msg.session_id,
        reply_to_group_id=getattr(msg, "reply_to_session_id", None),
    )


def _lock_token(msg: Any) -> uuid.UUID:
    token = getattr(msg, "lock_token", None)
    if not token:
        raise ValueError(
            "the message has no lock token (peeked or already settled): the SDK-type binding needs one"
        )
    return token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))


def encode_amqp_message(msg: Any, lock_token: uuid.UUID) -> bytes:
    """The received message as AMQP 1.0 bytes, sections in spec order: header, delivery annotations (the lock
    token, as Service Bus delivers it), message annotations (x-opt-*), properties, application properties, one
    data section. The SDK reads these where `azure/servicebus/_common/message.py` says (delivery_count ←
    header, sequence_number / enqueued_time_utc / locked_until_utc ← x-opt-* annotations, session_id ←
    group_id)."""
    ttl_ms = _ttl_ms(getattr(msg, "time_to_live", None))
    output = bytearray()
    header = Header(delivery_count=int(msg.delivery_count or 0), ttl=ttl_ms)
    encode_payload(output, Message(header=header))
    encode_value(
        output,
        {
            TYPE: AMQPTypes.described,
            VALUE: (
                {TYPE: AMQPTypes.ulong, VALUE: _DELIVERY_ANNOTATIONS},
                encode_annotations({_LOCK_TOKEN: {TYPE: AMQPTypes.uuid, VALUE: lock_token}}),
            ),
        },
    )
    encode_payload(
        output,
        Message(
            message_annotations=_message_annotations(msg) or None,
            properties=_properties(msg, ttl_ms),
            application_properties=_application_properties(msg),
            data=[_body(msg)],
        ),
    )
    return bytes(output)


def model_binding_data(msg: Any) -> ModelBindingData:
    """The `model_binding_data` the host sends for one message: the lock token (`Guid.ToByteArray()`, i.e.
    UUID bytes_le), then the AMQP message."""
    token = _lock_token(msg)
    return ModelBindingData(
        version=BINDING_VERSION,
        source=BINDING_SOURCE,
        content_type=BINDING_CONTENT_TYPE,
        content=token.bytes_le + encode_amqp_message(msg, token),
    )


def to_sdk_message(msg: Any) -> SdkReceivedMessage:
    """One broker message, decoded by the extension's `ServiceBusConverter.decode` as the worker does."""
    datum = Datum(model_binding_data(msg), "model_binding_data")
    return ServiceBusConverter.decode(datum, trigger_metadata=None, pytype=ServiceBusReceivedMessage)


def to_sdk_messages(msgs: Iterable[Any]) -> list[SdkReceivedMessage]:
    """Cardinality many: one `collection_model_binding_data` decoded into a list, as the worker does."""
    collection = CollectionModelBindingData([model_binding_data(m) for m in msgs])
    datum = Datum(collection, "collection_model_binding_data")
    return ServiceBusConverter.decode(datum, trigger_metadata=None, pytype=list[ServiceBusReceivedMessage])


# ----------------------------------------------------------------------------------------------------
# In-flight deliveries, by lock token and by session
# ----------------------------------------------------------------------------------------------------


def normalize_lock_token(token: str | uuid.UUID) -> str:
    """The canonical text of a lock token: lower-case hyphenated UUID, as the client sends it."""
    return str(token if isinstance(token, uuid.UUID) else uuid.UUID(str(token)))


class DeliveryRegistry:
    """Thread-safe index of the deliveries a function is working on; plug `add`/`remove` into
    `ServiceBusTriggerRunner(on_delivery=..., on_done=...)` and `lookup`/`lookup_session` into
    `SettlementServer`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_token: dict[str, Delivery] = {}

    def add(self, delivery: Delivery) -> None:
        token = getattr(delivery.message, "lock_token", None)
        if token:
            with self._lock:
                self._by_token[normalize_lock_token(token)] = delivery

    def remove(self, delivery: Delivery) -> None:
        with self._lock:
            for key in [k for k, d in self._by_token.items() if d is delivery]:
                del self._by_token[key]

    def lookup(self, lock_token: str) -> Delivery | None:
        with self._lock:
            return self._by_token.get(lock_token)

    def lookup_session(self, session_id: str) -> Delivery | None:
        with self._lock:
            return next(
                (d for d in self._by_token.values() if getattr(d.message, "session_id", None) == session_id),
                None,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_token)


# ----------------------------------------------------------------------------------------------------
# Settlement: the host's gRPC Settlement service
# ----------------------------------------------------------------------------------------------------


class _Abort(Exception):
    """A gRPC status to return instead of a response."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _status_for(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, (MessageLockLostError, SessionLockLostError, MessageAlreadySettled)):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, ServiceBusError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, (ValueError, TypeError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


class _SettlementServicer(settlement_pb2_grpc.SettlementServicer):
    """Each RPC: find the delivery, run the receiver call on the host loop, map failures to gRPC status
    codes."""

    def __init__(self, server: SettlementServer) -> None:
        self._server = server
        self._guard = threading.Lock()
        self._settling: set[int] = set()  # id() of deliveries with a settlement under way

    # -- message settlement --
    def Complete(self, request: settlement_pb2.CompleteRequest, context: grpc.ServicerContext) -> Empty:
        return self._settle(context, request.locktoken, lambda d: d.receiver.complete_message(d.message))

    def Abandon(self, request: settlement_pb2.AbandonRequest, context: grpc.ServicerContext) -> Empty:
        self._reject_property_changes(context, request.propertiesToModify)
        return self._settle(context, request.locktoken, lambda d: d.receiver.abandon_message(d.message))

    def Deadletter(self, request: settlement_pb2.DeadletterRequest, context: grpc.ServicerContext) -> Empty:
        self._reject_property_changes(context, request.propertiesToModify)
        reason = request.deadletterReason.value if request.HasField("deadletterReason") else None
        description = (
            request.deadletterErrorDescription.value
            if request.HasField("deadletterErrorDescription")
            else None
        )
        return self._settle(
            context,
            request.locktoken,
            lambda d: d.receiver.dead_letter_message(d.message, reason=reason, error_description=description),
        )

    def Defer(self, request: settlement_pb2.DeferRequest, context: grpc.ServicerContext) -> Empty:
        self._reject_property_changes(context, request.propertiesToModify)
        return self._settle(context, request.locktoken, lambda d: d.receiver.defer_message(d.message))

    def RenewMessageLock(
        self, request: settlement_pb2.RenewMessageLockRequest, context: grpc.ServicerContext
    ) -> Empty:
        def renew() -> None:
            delivery = self._delivery(request.locktoken)
            self._server.run(delivery.receiver.renew_message_lock(delivery.message))

        self._call(context, renew)
        return Empty()

    # -- sessions --
    def GetSessionState(
        self, request: settlement_pb2.GetSessionStateRequest, context: grpc.ServicerContext
    ) -> settlement_pb2.GetSessionStateResponse:
        state = self._call(context, lambda: self._server.run(self._session(request.sessionId).get_state()))
        return settlement_pb2.GetSessionStateResponse(sessionState=state or b"")

    def SetSessionState(
        self, request: settlement_pb2.SetSessionStateRequest, context: grpc.ServicerContext
    ) -> Empty:
        self._call(
            context,
            lambda: self._server.run(self._session(request.sessionId).set_state(request.sessionState)),
        )
        return Empty()

    def RenewSessionLock(
        self, request: settlement_pb2.RenewSessionLockRequest, context: grpc.ServicerContext
    ) -> settlement_pb2.RenewSessionLockResponse:
        locked_until = self._call(
            context, lambda: self._server.run(self._session(request.sessionId).renew_lock())
        )
        stamp = Timestamp()
        stamp.FromDatetime(locked_until)
        return settlement_pb2.RenewSessionLockResponse(lockedUntil=stamp)

    def ReleaseSession(
        self, request: settlement_pb2.ReleaseSessionRequest, context: grpc.ServicerContext
    ) -> Empty:
        def release() -> None:
            self._session(request.sessionId)  # NOT_FOUND when no delivery of that session is in flight
            if self._server.on_release_session is None:
                raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "this host does not release sessions on request")
            self._server.on_release_session(request.sessionId)

        self._call(context, release)
        return Empty()

    # -- helpers --
    def _delivery(self, lock_token: str) -> Delivery:
        try:
            key = normalize_lock_token(lock_token)
        except ValueError:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed lock token {lock_token!r}") from None
        delivery = self._server.lookup(key)
        if delivery is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no message in flight with lock token {key}")
        return delivery

    def _session(self, session_id: str) -> Any:
        delivery = self._server.lookup_session(session_id) if self._server.lookup_session else None
        session = getattr(delivery.receiver, "session", None) if delivery else None
        if session is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r} held by a running function")
        return session

    def _settle(
        self,
        context: grpc.ServicerContext,
        lock_token: str,
        action: Callable[[Delivery], Coroutine[Any, Any, None]],
    ) -> Empty:
        def settle() -> None:
            delivery = self._delivery(lock_token)
            with self._guard:
                if delivery.settled or id(delivery) in self._settling:
                    raise _Abort(
                        grpc.StatusCode.FAILED_PRECONDITION, f"message {lock_token} is already settled"
                    )
                self._settling.add(id(delivery))
            try:
                self._server.run(action(delivery))
                delivery.settled = True
            finally:
                with self._guard:
                    self._settling.discard(id(delivery))

        self._call(context, settle)
        return Empty()

    @staticmethod
    def _reject_property_changes(context: grpc.ServicerContext, properties_to_modify: bytes) -> None:
        if properties_to_modify:  # the Python client always sends b"" (serviceBusMessageActions.py)
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "propertiesToModify is not supported")

    @staticmethod
    def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _Abort as exc:
            context.abort(exc.code, exc.details)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a gRPC status for the client
            log.warning("settlement call failed: %r", exc)
            context.abort(_status_for(exc), f"{type(exc).__name__}: {exc}")
        raise AssertionError("unreachable: context.abort raises")


class _StartGate:
    """Decides, once, between "the settlement started on the loop" and "the caller gave up waiting", so a call
    reported as failed never settles the message later."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self._abandoned = False

    async def guard(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._abandoned:
                coro.close()
                raise asyncio.CancelledError
            self._started = True
        return await coro

    def abandon(self) -> bool:
        """True if the coroutine had not started; it then never will."""
        with self._lock:
            self._abandoned = not self._started
            return self._abandoned


class SettlementServer:
    """The host's `Settlement` gRPC service on 127.0.0.1. Handlers run on gRPC threads and hand the receiver
    calls to `loop` (the host's loop, where the receivers live) with `run_coroutine_threadsafe`."""

    def __init__(
        self,
        lookup: Callable[[str], Delivery | None],
        loop: asyncio.AbstractEventLoop,
        *,
        lookup_session: Callable[[str], Delivery | None] | None = None,
        on_release_session: Callable[[str], None] | None = None,
        max_message_length: int = DEFAULT_GRPC_MAX_MESSAGE_LENGTH,
        max_workers: int = 8,
        settle_timeout_s: float = SETTLE_TIMEOUT_S,
    ) -> None:
        self.lookup = lookup
        self.lookup_session = lookup_session
        self.on_release_session = on_release_session
        self.loop = loop
        self.max_message_length = max_message_length
        self.settle_timeout_s = settle_timeout_s
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self.port: int | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the host loop from a gRPC thread and wait for its result."""
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("the host event loop is not running")
        gate = _StartGate()
        future = asyncio.run_coroutine_threadsafe(gate.guard(coro), self.loop)
        try:
            return future.result(timeout=self.settle_timeout_s)
        except TimeoutError:
            if gate.abandon():  # never started (the loop is blocked or busy): it never will
                future.cancel()
                raise
            return future.result(
                timeout=self.settle_timeout_s
            )  # already under way on the loop: let it finish

    def start(self) -> int:
        """Listen on 127.0.0.1 on a free port; return it."""
        if self._server is not None:
            raise RuntimeError("SettlementServer already started")
        options = [
            ("grpc.max_send_message_length", self.max_message_length),
            ("grpc.max_receive_message_length", self.max_message_length),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="settlement"),
            options=options,
        )
        settlement_pb2_grpc.add_SettlementServicer_to_server(_SettlementServicer(self), server)
        port = server.add_insecure_port("127.0.0.1:0")
        if not port:
            raise RuntimeError("could not bind the Settlement gRPC server on 127.0.0.1")
        server.start()
        self._server, self.port = server, port
        log.info("Settlement gRPC service on 127.0.0.1:%d", port)
        return port

    def stop(self, grace_s: float | None = 1.0) -> None:
        """Stop accepting calls; in-flight calls get `grace_s` to finish."""
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server, self.port = None, None

    def __enter__(self) -> SettlementServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------------------------
# Pointing the extension's client at the server
# ----------------------------------------------------------------------------------------------------

_appended: list[str] = []  # the argv tail configure_message_actions added last time


def _grpc_argv(port: int, max_message_length: int) -> list[str]:
    return [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--functions-grpc-max-message-length",
        str(max_message_length),
    ]


def configure_message_actions(
    port: int, *, max_message_length: int = DEFAULT_GRPC_MAX_MESSAGE_LENGTH, argv: list[str] | None = None
) -> None:
    """Make `ServiceBusMessageActions.get_instance()` in this process talk to the Settlement server on `port`.

    The client parses `--host --port --functions-grpc-max-message-length` from `sys.argv`
    (grpc_utils.parse_grpc_args, argparse: the last occurrence wins), so the options are appended at the end
    of argv — after devhost's own `--port` — replacing the tail a previous call appended. Then the cached
    singleton is dropped so the next `get_instance()` connects to the new address."""
    args = sys.argv if argv is None else argv
    if _appended and args[-len(_appended) :] == _appended:
        del args[-len(_appended) :]
    tail = _grpc_argv(port, max_message_length)
    args.extend(tail)
    _appended[:] = tail
    with ServiceBusMessageActions._lock:  # the extension's own singleton lock (serviceBusMessageActions.py)
        ServiceBusMessageActions._instance = None


# ----------------------------------------------------------------------------------------------------
# Where functions run: never on the loop that owns the receivers
# ----------------------------------------------------------------------------------------------------


class WorkerLoop:
    """Runs functions apart from the host loop, as the Python worker (another process in Azure) does: `async
    def` functions on this object's own event loop thread, plain functions in its thread pool.

    Required for the SDK-type binding: `ServiceBusMessageActions` calls are blocking gRPC calls, and the
    Settlement service carries them out on the host loop. A function awaited directly on the host loop that
    settles would block that loop and the settlement could never run (`SettlementServer` then fails the call
    with DEADLINE_EXCEEDED after `settle_timeout_s`)."""

    def __init__(self, *, max_workers: int | None = None, name: str = "functions-worker") -> None:
        self._name = name
        self._pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"{name}-sync")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("WorkerLoop already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop, self._thread = None, None

    async def call(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """Run `fn(**kwargs)` off the calling loop and await its result (exceptions propagate)."""
        if asyncio.iscoroutinefunction(fn):
            if self._loop is None:
                raise RuntimeError("WorkerLoop not started")
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(**kwargs), self._loop))
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, **kwargs))

    def __enter__(self) -> WorkerLoop:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
