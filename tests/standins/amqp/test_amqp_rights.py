"""Rights on the bus (orderflow/embedded/rights, read from infra/): an identity without Send or Listen on a queue is
refused exactly as Service Bus refuses it, through the embedded client and through the real azure-servicebus SDK
against the AMQP endpoint (its SAS key name is the identity), with the same exception class and message.

What Service Bus answers, from its users' reports and the SDK:
- the link to the entity is refused (a detach, condition amqp:unauthorized-access; Azure/azure-service-bus#258
  shows the frame: `Detach{handle=0, closed=true, error=Error{condition=amqp:unauthorized-access, ...}}`), with the
  description "Unauthorized access. '<claim>' claim(s) are required to perform this operation. Resource:
  'sb://<namespace>/<entity>'. TrackingId:<id>, SystemTracker:<tracker>, Timestamp:<utc>"
  (Azure/azure-sdk-for-java#27831 for Listen, microsoft/azure-spring-boot#939 for Send with a managed identity;
  the DLQ's resource is `<queue>/$deadletterqueue`, Azure/azure-sdk-for-net#24289);
- azure-servicebus maps that condition to ServiceBusAuthorizationError, not retried (_transport/_pyamqp_transport.py
  `_ERROR_CODE_TO_ERROR_MAPPING`, _pyamqp/error.py `RetryPolicy.no_retry`), and raises it before the first transfer:
  its live test sends with a listen-only key and expects ServiceBusAuthorizationError (azure-sdk-for-python
  sdk/servicebus/azure-servicebus/tests/test_sb_client.py `test_sb_client_readonly_credentials`);
- a dead-letter queue is part of its queue: its rights are the queue's (learn.microsoft.com/azure/service-bus-
  messaging/service-bus-dead-letter-queues); a `$management` request needs the claim of its operation.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from proton import Message, symbol
from proton.utils import BlockingConnection
from support.amqp_endpoint import InProcess

from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient as EmbeddedClient
from orderflow.embedded.rights import AGENT, FUNCTION_APP

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "servicebus.config.json"
# main.parameters.json's submitting application, the legacy app: Send on app-orders and orders-inbound, Listen on
# app-status. The local system's second app (orderflow/embedded/rights/_grants.py LOCAL_APPS): Send on partner-orders,
# Listen on partner-status, nothing else (issue 25).
SUBMITTER = "app"
PARTNER = "partner"
AZURE_TEXT = re.compile(
    r"^Unauthorized access\. '(Send|Listen)' claim\(s\) are required to perform this operation\. "
    r"Resource: 'sb://NAMESPACE/[^']+'\. TrackingId:\w+, SystemTracker:\w+, Timestamp:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d "
    r"Error condition: amqp:unauthorized-access\.$"
)


def normalized(error: BaseException) -> str:
    """The message with the namespace's host as NAMESPACE (sb://embedded vs sb://127.0.0.1:PORT)."""
    return re.sub(r"sb://[^/']+/", "sb://NAMESPACE/", str(error))


def same_but_tracking(text: str) -> str:
    return re.sub(r"TrackingId:.*? Error condition", "TrackingId:... Error condition", text)


@pytest.fixture
def served(in_process: InProcess) -> InProcess:
    EmbeddedBroker(in_process.db_path, config=CONFIG).close()  # the system's queues in the endpoint's broker file
    return in_process


def embedded(served: InProcess, identity: str) -> Any:
    return EmbeddedClient.from_connection_string(
        f"Endpoint=embedded://{served.db_path};ConfigFile={CONFIG};Identity={identity}", retry_total=0
    )


def sdk(served: InProcess, identity: str) -> Any:
    return ServiceBusClient.from_connection_string(
        f"Endpoint=sb://127.0.0.1:{served.port};SharedAccessKeyName={identity};SharedAccessKey=SAS_KEY_VALUE;"
        "UseDevelopmentEmulator=true;",
        retry_total=0,
    )


CLIENTS = {"embedded": embedded, "amqp": sdk}


def refusal(make: Callable[[], Any], act: Callable[[Any], None]) -> ServiceBusAuthorizationError:
    with make() as client, pytest.raises(ServiceBusAuthorizationError) as refused:
        act(client)
    assert refused.value._retryable is False  # not retried: _pyamqp/error.py RetryPolicy.no_retry
    return refused.value


def send(queue: str) -> Callable[[Any], None]:
    def act(client: Any) -> None:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("x", session_id="s-1", message_id=str(uuid.uuid4())))

    return act


def receive(queue: str, **options: Any) -> Callable[[Any], None]:
    def act(client: Any) -> None:
        with client.get_queue_receiver(queue, max_wait_time=1, **options) as receiver:
            receiver.receive_messages(max_message_count=1, max_wait_time=1)

    return act


def both(served: InProcess, identity: str, act: Callable[[Any], None]) -> tuple[str, str]:
    """The refusal's message through the embedded client and through the SDK over AMQP, normalized."""
    local = refusal(lambda: embedded(served, identity), act)
    wire = refusal(lambda: sdk(served, identity), act)
    return normalized(local), normalized(wire)


def test_a_send_to_an_ungranted_queue_fails_as_on_azure_on_both_transports(served: InProcess) -> None:
    # The Agent receives agent-requests and sends agent-replies: no Send on agent-requests (infra/app/rbac.bicep).
    local, wire = both(served, AGENT, send("agent-requests"))
    assert AZURE_TEXT.match(local) and same_but_tracking(local) == same_but_tracking(wire), (local, wire)
    assert "'Send' claim(s)" in local and "Resource: 'sb://NAMESPACE/agent-requests'" in local
    # The operator cancel route's old bug: the function app has no Send on orders-inbound.
    local, wire = both(served, FUNCTION_APP, send("orders-inbound"))
    assert AZURE_TEXT.match(local) and same_but_tracking(local) == same_but_tracking(wire)


def test_a_receive_without_listen_fails_as_on_azure_on_both_transports(served: InProcess) -> None:
    # The function app sends agent-requests (a session queue) and may not receive from it.
    local, wire = both(served, FUNCTION_APP, receive("agent-requests", session_id="s-1"))
    assert AZURE_TEXT.match(local) and same_but_tracking(local) == same_but_tracking(wire), (local, wire)
    assert "'Listen' claim(s)" in local and "Resource: 'sb://NAMESPACE/agent-requests'" in local


def test_the_dead_letter_queue_has_its_queues_rights(served: InProcess) -> None:
    dlq = {"sub_queue": ServiceBusSubQueue.DEAD_LETTER}
    # The submitting app sends to orders-inbound but may not read it, nor its dead letters.
    local, wire = both(served, SUBMITTER, receive("orders-inbound", **dlq))
    assert AZURE_TEXT.match(local) and same_but_tracking(local) == same_but_tracking(wire)
    assert "Resource: 'sb://NAMESPACE/orders-inbound/$deadletterqueue'" in local
    # The function app receives orders-inbound: its dead letters too, on both transports.
    for make in CLIENTS.values():
        with make(served, FUNCTION_APP) as client:
            with client.get_queue_receiver("orders-inbound", **dlq) as receiver:
                assert receiver.peek_messages(max_message_count=1) == []


@pytest.mark.parametrize("transport", sorted(CLIENTS))
def test_granted_operations_pass_and_the_owner_has_every_right(served: InProcess, transport: str) -> None:
    make = CLIENTS[transport]
    with make(served, AGENT) as client:  # the Agent's replies
        send("agent-replies")(client)
    with make(served, SUBMITTER) as client:  # the submitting app's order and its own status queue
        send("orders-inbound")(client)
        with client.get_queue_receiver("app-status", session_id="s-1") as receiver:
            assert receiver.peek_messages(max_message_count=1) == []
    owner = "RootManageSharedAccessKey"  # the emulator's root policy: every right, as on the Service Bus emulator
    with make(served, owner) as client:
        send("agent-requests")(client)


@pytest.mark.parametrize("transport", sorted(CLIENTS))
def test_each_app_sends_to_its_own_inbound_queue_and_reads_its_own_status_queue(
    served: InProcess, transport: str
) -> None:
    make = CLIENTS[transport]
    with make(served, PARTNER) as client:
        send("partner-orders")(client)
        with client.get_queue_receiver("partner-status", session_id="s-1") as receiver:
            assert receiver.peek_messages(max_message_count=1) == []
    with make(served, SUBMITTER) as client:
        send("app-orders")(client)


def test_an_app_may_not_touch_another_apps_queues_nor_orders_inbound_unless_legacy(served: InProcess) -> None:
    """Refused as Service Bus refuses it, on both transports: the queue an order arrives on names its app, so no app
    may send to another's inbound queue (nor read another's statuses), and only the legacy app to orders-inbound."""
    refused = [
        (PARTNER, send("app-orders"), "Send", "app-orders"),
        (PARTNER, send("orders-inbound"), "Send", "orders-inbound"),
        (PARTNER, receive("app-status", session_id="s-1"), "Listen", "app-status"),
        (SUBMITTER, send("partner-orders"), "Send", "partner-orders"),
        (SUBMITTER, receive("partner-status", session_id="s-1"), "Listen", "partner-status"),
    ]
    for identity, act, claim, queue in refused:
        local, wire = both(served, identity, act)
        assert AZURE_TEXT.match(local) and same_but_tracking(local) == same_but_tracking(wire), (identity, local, wire)
        assert f"'{claim}' claim(s)" in local and f"Resource: 'sb://NAMESPACE/{queue}'" in local, (identity, queue)


@pytest.mark.parametrize("transport", sorted(CLIENTS))
def test_a_key_name_that_names_no_identity_fails_the_put_token(served: InProcess, transport: str) -> None:
    # A SAS key name Service Bus does not know fails CBS (401), which the SDK raises as ServiceBusAuthenticationError
    # (_pyamqp/cbs.py `handle_token`: TokenAuthFailure; _pyamqp_transport.py `_handle_amqp_exception_with_condition`).
    with CLIENTS[transport](served, "nobody") as client, pytest.raises(ServiceBusAuthenticationError):
        send("agent-replies")(client)


# ---- `$management` requests: each operation needs the claim of what it does ----


@pytest.fixture
def wire(served: InProcess) -> Iterator[BlockingConnection]:
    connection = BlockingConnection(f"amqp://127.0.0.1:{served.port}", timeout=10)
    yield connection
    connection.close()


def _request(connection: BlockingConnection, node: str, properties: dict[str, Any], body: Any) -> dict[str, Any]:
    sender, receiver = connection.create_sender(node), connection.create_receiver(node)
    sender.send(Message(id=str(uuid.uuid4()), reply_to=node, properties=properties, body=body))
    answer = receiver.receive(10)
    receiver.accept()
    return {str(k): v for k, v in (answer.properties or {}).items()}


def _put_token(connection: BlockingConnection, port: int, queue: str, key_name: str) -> None:
    audience = f"sb://127.0.0.1:{port}/{queue}"
    token = f"SharedAccessSignature sr={audience}&sig=x&se={int(time.time()) + 3600}&skn={key_name}"
    answer = _request(
        connection,
        "$cbs",
        {"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": audience},
        token,
    )
    assert answer["status-code"] == 202


def test_a_management_request_needs_its_operations_claim(served: InProcess, wire: BlockingConnection) -> None:
    """A peek is a receiver's request (Listen), a schedule a sender's (Send): refused with 401 and
    amqp:unauthorized-access, the response an SDK reads (_common/mgmt_handlers.py → ServiceBusAuthorizationError)."""
    _put_token(wire, served.port, "orders-inbound", SUBMITTER)
    peek = {"operation": "com.microsoft:peek-message"}
    answer = _request(wire, "orders-inbound/$management", peek, {"from-sequence-number": 0, "message-count": 1})
    assert answer["statusCode"] == 401 and answer["errorCondition"] == symbol("amqp:unauthorized-access")
    assert "'Listen' claim(s) are required" in answer["statusDescription"]
    assert "orders-inbound/$management'" in answer["statusDescription"]
