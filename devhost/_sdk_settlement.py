"""The settlement half of the Service Bus SDK-type binding on devhost (see devhost/sdk_servicebus.py, which
re-exports it): in-flight deliveries by lock token and session, the host's gRPC `Settlement` service, pointing the
extension's client at it, and `WorkerLoop`, where functions run off the loop that owns the receivers."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine
from concurrent import futures
from typing import Any, TypeVar

import grpc
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    ServiceBusError,
    SessionLockLostError,
)
from azurefunctions.extensions.bindings.protos import settlement_pb2, settlement_pb2_grpc
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusMessageActions,
)
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp

from orderflow.text import DEAD_LETTER_TEXT_MAX, utf16_length

from .servicebus_trigger import Delivery

log = logging.getLogger("devhost.sdk_servicebus")

T = TypeVar("T")

# The extension's client defaults to 4 MiB (grpcClient.py); the host passes its own limit in argv.
DEFAULT_GRPC_MAX_MESSAGE_LENGTH = 128 * 1024 * 1024
# How long a gRPC handler waits for the settlement coroutine on the host loop before failing the call.
SETTLE_TIMEOUT_S = 60.0


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
            request.deadletterErrorDescription.value if request.HasField("deadletterErrorDescription") else None
        )
        self._call(context, lambda: self._delivery(request.locktoken))  # the host looks the lock token up first
        self._check_length(context, "deadLetterReason", reason)
        self._check_length(context, "deadLetterErrorDescription", description)
        return self._settle(
            context,
            request.locktoken,
            lambda d: d.receiver.dead_letter_message(d.message, reason=reason, error_description=description),
        )

    def Defer(self, request: settlement_pb2.DeferRequest, context: grpc.ServicerContext) -> Empty:
        self._reject_property_changes(context, request.propertiesToModify)
        return self._settle(context, request.locktoken, lambda d: d.receiver.defer_message(d.message))

    def RenewMessageLock(self, request: settlement_pb2.RenewMessageLockRequest, context: grpc.ServicerContext) -> Empty:
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

    def SetSessionState(self, request: settlement_pb2.SetSessionStateRequest, context: grpc.ServicerContext) -> Empty:
        self._call(
            context,
            lambda: self._server.run(self._session(request.sessionId).set_state(request.sessionState)),
        )
        return Empty()

    def RenewSessionLock(
        self, request: settlement_pb2.RenewSessionLockRequest, context: grpc.ServicerContext
    ) -> settlement_pb2.RenewSessionLockResponse:
        locked_until = self._call(context, lambda: self._server.run(self._session(request.sessionId).renew_lock()))
        stamp = Timestamp()
        stamp.FromDatetime(locked_until)
        return settlement_pb2.RenewSessionLockResponse(lockedUntil=stamp)

    def ReleaseSession(self, request: settlement_pb2.ReleaseSessionRequest, context: grpc.ServicerContext) -> Empty:
        def release() -> None:
            self._session(request.sessionId)  # refused when no delivery of that session is in flight
            if self._server.on_release_session is None:
                raise _Abort(grpc.StatusCode.UNIMPLEMENTED, "this host does not release sessions on request")
            self._server.on_release_session(request.sessionId)

        self._call(context, release)
        return Empty()

    # -- helpers --
    def _delivery(self, lock_token: str) -> Delivery:
        """The delivery in flight under `lock_token`, or the host's answer when there is none (a malformed token
        included): FailedPrecondition "LockToken {token} not found." (SettlementService.cs, every settlement)."""
        try:
            delivery = self._server.lookup(normalize_lock_token(lock_token))
        except ValueError:
            delivery = None
        if delivery is None:
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, f"LockToken {lock_token} not found.")
        return delivery

    def _session(self, session_id: str) -> Any:
        delivery = self._server.lookup_session(session_id) if self._server.lookup_session else None
        session = getattr(delivery.receiver, "session", None) if delivery else None
        if session is None:  # the host's answer (SettlementService.cs Get/Set)
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, f"SessionId {session_id} not found.")
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
                    raise _Abort(grpc.StatusCode.FAILED_PRECONDITION, f"message {lock_token} is already settled")
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
    def _check_length(context: grpc.ServicerContext, name: str, value: str | None) -> None:
        """The host's SDK refuses a dead-letter reason or description over 4,096 characters (.NET's String.Length,
        UTF-16 code units) before it calls the service, and the host's Settlement service answers the exception's
        text with status Unknown; the message stays locked, unsettled. Sources: docs/modules-host.md."""
        if value is not None and utf16_length(value) > DEAD_LETTER_TEXT_MAX:
            text = f"The argument '{name}' cannot exceed {DEAD_LETTER_TEXT_MAX} characters. (Parameter '{name}')"
            context.abort(grpc.StatusCode.UNKNOWN, f"System.ArgumentOutOfRangeException: {text}")

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
            return future.result(timeout=self.settle_timeout_s)  # already under way on the loop: let it finish

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
