"""The stand-ins' rights come from infra/ and from nowhere else: one parser (orderflow/embedded/rights/_bicep.py,
which the infra tests read through too), every role assignment read as main.bicep deploys it, a change to a grant
in a copy of infra/ changing the verdict of the rights, of the embedded client and of the AMQP endpoint, and
tree-sitter loaded only when rights are checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import support.bicep_tree as tests_view
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthorizationError
from support.bicep_tree import INFRA, REPO
from support.infra_rules import assignments

import orderflow.embedded.rights._bicep as parser
from orderflow.embedded.amqp import Endpoint
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.client import ServiceBusClient as EmbeddedClient
from orderflow.embedded.rights import AGENT, FUNCTION_APP, LISTEN, OPERATORS, SEND, load_rights

CONFIG = REPO / "servicebus.config.json"
# The one grant the copy changes: the Agent's Send on agent-replies becomes a Receive (rbac.bicep agentSendsReplies).
GRANT = """resource agentSendsReplies 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(namespace::agentRepliesQueue.id, agentPrincipalId, roles.serviceBusDataSender)
  scope: namespace::agentRepliesQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)"""


def test_the_tests_read_infra_through_the_stand_ins_parser() -> None:
    for name in ("parse", "evaluate", "load", "Scope", "all_files", "module_scope"):
        assert getattr(tests_view, name) is getattr(parser, name), name


def test_every_role_assignment_of_infra_is_a_grant_of_the_rights() -> None:
    """As main.bicep deploys it: every assignment but those of a module main.bicep leaves out by default (the
    Durable Task Scheduler's, durableBackend AzureStorage)."""
    rights = load_rights()
    read = {g.where.rsplit(" ", 1)[1] for g in rights.grants}
    declared = {a.symbol for a in assignments()} | {
        r.symbol
        for f in tests_view.all_files()
        for r in f.resources_of("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments")
    }
    assert declared - read == {"appUsesTaskHub"}
    # The submitting apps: main.parameters.json's `app`, then the local-only `partner` (_grants.LOCAL_APPS).
    assert rights.identities == {FUNCTION_APP, AGENT, OPERATORS, "app", "partner", "simulator"}


def test_the_verdicts_follow_the_bicep() -> None:
    rights = load_rights()
    assert rights.bus_allows(AGENT, SEND, "agent-replies") and not rights.bus_allows(AGENT, SEND, "agent-requests")
    assert rights.bus_allows(AGENT, LISTEN, "agent-requests") and not rights.bus_allows(AGENT, LISTEN, "agent-replies")
    assert rights.bus_allows("app", LISTEN, "app-status") and not rights.bus_allows("app", LISTEN, "orders-inbound")
    assert not rights.bus_allows(FUNCTION_APP, SEND, "orders-inbound")  # the cancel route sends nothing
    # Each app sends to its own inbound queue, reads its own status queue, and nothing of the other's; only the legacy
    # app (legacyOrdersApp's default, the first: `app`) still sends to orders-inbound (issue 25).
    assert rights.bus_allows("app", SEND, "app-orders") and rights.bus_allows("app", SEND, "orders-inbound")
    assert rights.bus_allows("partner", SEND, "partner-orders") and rights.bus_allows(
        "partner", LISTEN, "partner-status"
    )
    for queue in ("app-orders", "orders-inbound", "app-status"):
        assert not rights.bus_allows("partner", SEND, queue) and not rights.bus_allows("partner", LISTEN, queue), queue
    assert not rights.bus_allows("app", SEND, "partner-orders") and not rights.bus_allows(
        "app", LISTEN, "partner-status"
    )
    assert {(g.role.name, g.resource) for g in rights.of("partner")} == {
        ("Service Bus Data Sender", "partner-orders"),
        ("Service Bus Data Receiver", "partner-status"),
    }
    for queue in ("app-orders", "partner-orders", "orders-inbound"):
        assert rights.bus_allows(FUNCTION_APP, LISTEN, queue), queue
    breakers = "/dbs/state/colls/circuitBreakers"
    assert rights.store_allows(AGENT, "sqlDatabases/containers/items/replace", breakers)
    assert not rights.store_allows(AGENT, "sqlDatabases/containers/items/delete", breakers)
    assert not rights.store_allows(AGENT, "sqlDatabases/containers/items/read", "/dbs/state/colls/orderState")


@pytest.fixture
def changed_infra(tmp_path: Path) -> Path:
    """A copy of infra/ whose Agent receives from agent-replies instead of sending to it."""
    copy = tmp_path / "infra"
    shutil.copytree(INFRA, copy)
    rbac = copy / "app" / "rbac.bicep"
    source = rbac.read_text()
    assert GRANT in source, "rbac.bicep changed: update GRANT"
    rbac.write_text(source.replace(GRANT, GRANT.replace("roles.serviceBusDataSender", "roles.serviceBusDataReceiver")))
    return copy


def test_a_grant_changed_in_a_copy_of_infra_changes_the_verdict(changed_infra: Path, tmp_path: Path) -> None:
    changed = load_rights(changed_infra)
    assert not changed.bus_allows(AGENT, SEND, "agent-replies") and changed.bus_allows(AGENT, LISTEN, "agent-replies")
    assert load_rights().bus_allows(AGENT, SEND, "agent-replies")  # the repository's own is untouched
    connection = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={CONFIG};Identity={AGENT}"
    message = ServiceBusMessage("reply", session_id="s-1", message_id=str(uuid.uuid4()))
    with EmbeddedClient.from_connection_string(connection, infra=changed_infra) as client:
        with pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            with client.get_queue_sender("agent-replies") as sender:
                sender.send_messages(message)
    # The AMQP endpoint reads the same copy (`python -m devhost servicebus --infra DIR`).
    broker = EmbeddedBroker(tmp_path / "bus.db", config=CONFIG)
    endpoint = Endpoint(broker, "127.0.0.1", 0, changed_infra)
    thread = threading.Thread(target=endpoint.run, daemon=True)
    thread.start()
    try:
        sdk = ServiceBusClient.from_connection_string(
            f"Endpoint=sb://127.0.0.1:{endpoint.port};SharedAccessKeyName={AGENT};SharedAccessKey=SAS_KEY_VALUE;"
            "UseDevelopmentEmulator=true;",
            retry_total=0,
        )
        with sdk, pytest.raises(ServiceBusAuthorizationError, match="'Send' claim"):
            with sdk.get_queue_sender("agent-replies") as sender:
                sender.send_messages(message)
    finally:
        endpoint.stop()
        thread.join(10)
        broker.close()


def test_tree_sitter_is_loaded_only_when_rights_are_checked(tmp_path: Path) -> None:
    """tree-sitter is a dev dependency: the stand-ins import it when an identity's rights are checked, not before
    (the owner's connections, the lab's own checks, never need it)."""
    code = f"""
import asyncio, sys
from orderflow.embedded.client import ServiceBusClient
from orderflow.embedded.store import open_sqlite_stores
from orderflow.embedded.amqp import _server
from azure.servicebus import ServiceBusMessage
with ServiceBusClient.from_connection_string("Endpoint=embedded://{tmp_path}/b.db;ConfigFile={CONFIG}") as c:
    with c.get_queue_sender("operator-alerts") as s:
        s.send_messages(ServiceBusMessage("x"))
orders, state = open_sqlite_stores("{tmp_path}/s.db")
asyncio.run(state.get("x"))
print("before", "tree_sitter" in sys.modules)
with ServiceBusClient.from_connection_string("Endpoint=embedded://{tmp_path}/b.db;Identity=agent") as c:
    with c.get_queue_sender("operator-alerts") as s:
        s.send_messages(ServiceBusMessage("x"))
print("after", "tree_sitter" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["before", "False", "after", "True"], out.stderr[-2000:]
