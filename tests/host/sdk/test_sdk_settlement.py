"""SettlementServer: the real ServiceBusMessageActions client (azurefunctions/extensions/bindings/servicebus/
serviceBusMessageActions.py) settles over a real gRPC round trip (protos/settlement_pb2_grpc.py
`Settlement`)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import grpc
import pytest
from azure.servicebus.exceptions import MessageLockLostError
from azurefunctions.extensions.bindings.protos import settlement_pb2, settlement_pb2_grpc
from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
from azurefunctions.extensions.bindings.servicebus.grpc_utils import parse_grpc_args
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError
from support.servicebus_sdk import NOW, BrokerMessage, HostLoop, RecordingReceiver, in_flight

from devhost.sdk_servicebus import (
    DeliveryRegistry,
    SettlementServer,
    configure_message_actions,
    to_sdk_message,
)


def _status(err: SettlementError) -> grpc.StatusCode:
    assert isinstance(err.original, grpc.RpcError)
    return err.original.code()


def test_complete_settles_on_the_host_loop(
    settlement: SettlementServer, registry: DeliveryRegistry, host_loop: HostLoop
) -> None:
    delivery = in_flight(registry)
    ServiceBusMessageActions.get_instance().complete(to_sdk_message(delivery.message))
    assert delivery.receiver.calls == [("complete", delivery.message, {})]
    assert delivery.settled
    assert delivery.receiver.threads == {host_loop.thread.ident}  # ran on the loop that owns the receiver


@pytest.mark.parametrize(("method", "recorded"), [("abandon", "abandon"), ("defer", "defer")])
def test_abandon_and_defer(
    settlement: SettlementServer, registry: DeliveryRegistry, method: str, recorded: str
) -> None:
    delivery = in_flight(registry)
    getattr(ServiceBusMessageActions.get_instance(), method)(to_sdk_message(delivery.message))
    assert delivery.receiver.calls == [(recorded, delivery.message, {})]
    assert delivery.settled


def test_deadletter_passes_reason_and_description(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    delivery = in_flight(registry)
    ServiceBusMessageActions.get_instance().deadletter(
        to_sdk_message(delivery.message),
        deadletter_reason="ConflictingOrder",
        deadletter_error_description="order o-1 resubmitted with different data",
    )
    assert delivery.receiver.calls == [
        (
            "dead_letter",
            delivery.message,
            {"reason": "ConflictingOrder", "error_description": "order o-1 resubmitted with different data"},
        )
    ]
    assert delivery.settled


def test_deadletter_without_reason_sends_none(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    # The client leaves the StringValue wrappers unset when no reason is given (serviceBusMessageActions.py).
    delivery = in_flight(registry)
    ServiceBusMessageActions.get_instance().deadletter(to_sdk_message(delivery.message))
    assert delivery.receiver.calls[0][2] == {"reason": None, "error_description": None}


# The host's SDK refuses a reason or description past 4,096 characters before it calls the service: Azure.Messaging.
# ServiceBus AmqpReceiver.DeadLetterInternalAsync, `Argument.AssertNotTooLong(deadLetterReason,
# Constants.MaxDeadLetterReasonLength, ...)`: ArgumentOutOfRangeException "The argument '{name}' cannot exceed
# {max} characters."; the extension's SettlementService.Deadletter answers `new RpcException(new
# Status(StatusCode.Unknown, ex.ToString()))` (azure-sdk-for-net, sdk/servicebus). .NET counts UTF-16 code units.
@pytest.mark.parametrize(
    ("reason", "description", "refused"),
    [
        ("r" * 4097, None, "deadLetterReason"),
        ("BadInput", "d" * 4097, "deadLetterErrorDescription"),
        ("\U0001f600" * 2049, None, "deadLetterReason"),  # 2,049 code points, 4,098 UTF-16 code units
    ],
    ids=["reason", "description", "astral-reason"],
)
def test_deadletter_text_over_4096_characters_is_refused_as_the_host_refuses_it(
    settlement: SettlementServer, registry: DeliveryRegistry, reason: str, description: str | None, refused: str
) -> None:
    delivery = in_flight(registry)
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().deadletter(
            to_sdk_message(delivery.message), deadletter_reason=reason, deadletter_error_description=description
        )
    assert _status(info.value) == grpc.StatusCode.UNKNOWN
    assert info.value.original.details() == (
        f"System.ArgumentOutOfRangeException: The argument '{refused}' cannot exceed 4096 characters. "
        f"(Parameter '{refused}')"
    )
    assert delivery.receiver.calls == [] and not delivery.settled  # still locked: the function may settle it again


def test_deadletter_text_of_exactly_4096_characters_is_accepted(
    settlement: SettlementServer, registry: DeliveryRegistry
) -> None:
    delivery = in_flight(registry)
    ServiceBusMessageActions.get_instance().deadletter(
        to_sdk_message(delivery.message), deadletter_reason="r" * 4096, deadletter_error_description="\U0001f600" * 2048
    )
    assert delivery.receiver.calls[0][2] == {"reason": "r" * 4096, "error_description": "\U0001f600" * 2048}
    assert delivery.settled


def test_renew_message_lock_does_not_settle(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    delivery = in_flight(registry)
    ServiceBusMessageActions.get_instance().renew_message_lock(to_sdk_message(delivery.message))
    assert [c[0] for c in delivery.receiver.calls] == ["renew"]
    assert not delivery.settled


# The host's answer when no delivery is in flight under a lock token, or for no session (SettlementService.cs:
# `new RpcException(new Status(StatusCode.FailedPrecondition, $"LockToken {request.Locktoken} not found."))`, and
# "SessionId {request.SessionId} not found.").
def test_unknown_lock_token_is_not_found(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    stranger = to_sdk_message(BrokerMessage())  # never registered: no delivery in flight with its token
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().complete(stranger)
    assert _status(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.original.details() == f"LockToken {stranger.lock_token} not found."


def test_finished_delivery_is_no_longer_found(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    delivery = in_flight(registry)
    registry.remove(delivery)  # the runner's on_done hook
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().abandon(to_sdk_message(delivery.message))
    assert _status(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert len(registry) == 0 and delivery.receiver.calls == []


def test_second_settlement_is_refused(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    delivery = in_flight(registry)
    actions = ServiceBusMessageActions.get_instance()
    actions.complete(to_sdk_message(delivery.message))
    with pytest.raises(SettlementError) as info:
        actions.deadletter(to_sdk_message(delivery.message), deadletter_reason="late")
    assert _status(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert [c[0] for c in delivery.receiver.calls] == ["complete"]


def test_lock_lost_surfaces_as_settlement_error(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    receiver = RecordingReceiver()
    receiver.fail_with = MessageLockLostError(message="lock expired")
    delivery = in_flight(registry, receiver=receiver)
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().complete(to_sdk_message(delivery.message))
    assert _status(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert "lock expired" in info.value.original.details()
    assert not delivery.settled  # the runner may still settle it (auto-complete) or the broker redelivers


def test_session_state_and_lock_renewal(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    delivery = in_flight(registry, BrokerMessage(session_id="o-7"))
    actions = ServiceBusMessageActions.get_instance()
    actions.set_session_state("o-7", b"step-2")
    assert delivery.receiver.session.state == b"step-2"
    locked_until = actions.renew_session_lock("o-7")  # a protobuf Timestamp
    assert locked_until.ToDatetime(tzinfo=NOW.tzinfo) == NOW + timedelta(minutes=10)


def test_unknown_session_is_not_found(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    in_flight(registry, BrokerMessage(session_id="o-7"))
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().set_session_state("o-8", b"x")
    assert _status(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.original.details() == "SessionId o-8 not found."


def test_release_session_needs_a_host_hook(settlement: SettlementServer, registry: DeliveryRegistry) -> None:
    in_flight(registry, BrokerMessage(session_id="o-7"))
    with pytest.raises(SettlementError) as info:
        ServiceBusMessageActions.get_instance().release_session("o-7")
    assert _status(info.value) == grpc.StatusCode.UNIMPLEMENTED
    released: list[str] = []
    settlement.on_release_session = released.append
    ServiceBusMessageActions.get_instance().release_session("o-7")
    assert released == ["o-7"]


def test_configure_overrides_devhost_port_and_replaces_its_own_tail(isolated_argv: list[str]) -> None:
    # grpc_utils.parse_grpc_args reads sys.argv with argparse (last occurrence wins); devhost's own `--port
    # 7071` is already there, so the gRPC options go after it.
    configure_message_actions(50001)
    first = ServiceBusMessageActions.get_instance()
    configure_message_actions(50002)
    args = parse_grpc_args(isolated_argv[1:])
    assert (args.host, args.port) == ("127.0.0.1", "50002")
    assert args.functions_grpc_max_message_length > 4 * 1024 * 1024
    assert isolated_argv.count("--host") == 1  # reconfiguring does not grow argv
    assert isolated_argv[:4][2:] == ["--port", "7071"]  # devhost's own option untouched
    second = ServiceBusMessageActions.get_instance()
    assert second is not first and second._uri == "127.0.0.1:50002"


def test_concurrent_settlements_each_reach_their_delivery(
    settlement: SettlementServer, registry: DeliveryRegistry
) -> None:
    deliveries = [in_flight(registry) for _ in range(16)]
    actions = ServiceBusMessageActions.get_instance()
    threads = [threading.Thread(target=actions.complete, args=(to_sdk_message(d.message),)) for d in deliveries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(d.settled and d.receiver.calls == [("complete", d.message, {})] for d in deliveries)


def test_stopped_loop_fails_the_call_instead_of_hanging(registry: DeliveryRegistry, isolated_argv: list[str]) -> None:
    with HostLoop() as hl:
        loop = hl.loop
    delivery = in_flight(registry)
    with SettlementServer(registry.lookup, loop, settle_timeout_s=5.0) as server:
        configure_message_actions(server.port)
        with pytest.raises(SettlementError) as info:
            ServiceBusMessageActions.get_instance().complete(to_sdk_message(delivery.message))
    assert _status(info.value) == grpc.StatusCode.INTERNAL
    assert not delivery.settled


def test_lock_tokens_are_matched_case_insensitively(registry: DeliveryRegistry) -> None:
    token = uuid.uuid4()
    delivery = in_flight(registry, BrokerMessage(lock_token=str(token).upper()))
    assert registry.lookup(str(token)) is delivery


@pytest.fixture
def raw_stub(settlement: SettlementServer) -> Iterator[settlement_pb2_grpc.SettlementStub]:
    """The generated stub itself, for requests the Python client never builds."""
    with grpc.insecure_channel(f"127.0.0.1:{settlement.port}") as channel:
        yield settlement_pb2_grpc.SettlementStub(channel)


def test_malformed_lock_token_is_not_found(raw_stub: settlement_pb2_grpc.SettlementStub) -> None:
    # The host looks any string up in its cache of lock tokens: not there, FailedPrecondition.
    with pytest.raises(grpc.RpcError) as info:
        raw_stub.Complete(settlement_pb2.CompleteRequest(locktoken="not-a-uuid"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "LockToken not-a-uuid not found.",
    )


def test_properties_to_modify_is_refused_not_dropped(
    raw_stub: settlement_pb2_grpc.SettlementStub, registry: DeliveryRegistry
) -> None:
    # The Python client always sends b"" (serviceBusMessageActions.py); another client's changes must not be
    # silently lost.
    delivery = in_flight(registry)
    request = settlement_pb2.AbandonRequest(locktoken=delivery.message.lock_token, propertiesToModify=b"\x00")
    with pytest.raises(grpc.RpcError) as info:
        raw_stub.Abandon(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert not delivery.settled and delivery.receiver.calls == []


def test_get_session_state_returns_what_was_set(
    raw_stub: settlement_pb2_grpc.SettlementStub, registry: DeliveryRegistry
) -> None:
    # GetSessionState is in the Settlement service (settlement_pb2_grpc.py) though the Python client lacks it.
    delivery = in_flight(registry, BrokerMessage(session_id="o-7"))
    delivery.receiver.session.state = b"step-3"
    reply = raw_stub.GetSessionState(settlement_pb2.GetSessionStateRequest(sessionId="o-7"), timeout=10)
    assert reply.sessionState == b"step-3"
