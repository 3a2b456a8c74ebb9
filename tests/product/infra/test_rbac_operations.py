"""Service Bus rights against the code: every queue operation the deployed code performs is covered by a role
assignment in infra/ (read from the Bicep tree), and every Service Bus grant to a deployed identity is used.

Identities: the function app (function_app.py's blueprints: triggers/, activities/, orchestrators/, and the core in
orderflow/ they run), the Agent (agent/), the submitting application (examples/client.py, as main.parameters.json's
first app, the legacy app). A queue is known by its role: one of the pattern's queues, or a submitting app's own
inbound queue (`<app>-orders`) or status queue (`<app>-status`); for a submitting app, another app's queue keeps its
name, so a grant there is never taken for its own. Rights, as Azure checks
them: Azure Service Bus Data Sender = Send, Data Receiver = Listen; a receive, a peek and a settlement are Listen, on
the queue and on its dead-letter sub-queue `<queue>/$deadletterqueue`
(https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/integration,
https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues). Reader = Read: the control
plane's GET of the queue (Microsoft.ServiceBus/namespaces/queues/read), its runtime counts included
(https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/general#reader).

The operations come from three sources: the Service Bus triggers the app registers (Listen on their queue); a scan of
every call that opens a sender or a receiver in the deployed code, through the helpers that pass a queue on, with each
queue argument mapped to its queue (an unknown one fails the suite until it is mapped here); and a run of the operator
routes (cancel, summary) on the embedded broker through a recording bus and, for the summary's ARM reads, a local
fake of Azure Resource Manager that logs every queue read (tests/support/arm_server.py); their queues only exist at
run time.
"""

from __future__ import annotations

import ast
import base64
import importlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.arm_server import NAMESPACE_ID, FakeCredential, run_fake_arm
from support.bicep_tree import REPO

from orderflow import runtime, settings
from orderflow.adapters import aio_bus_from_connection_string
from orderflow.azure.queue_counts import ArmQueueCounts
from orderflow.clock import FakeClock
from orderflow.embedded.rights import AGENT as AGENT_IDENTITY
from orderflow.embedded.rights import BUS_ACTIONS, FUNCTION_APP, OPERATORS, SIMULATOR, load_rights
from orderflow.embedded.store import open_sqlite_stores
from orderflow.messages import SubmitOrder
from orderflow.records import ProcessState
from orderflow.runtime import Services, Tunables
from orderflow.starter import run_starter
from orderflow.submission import Accepted, submit

# The identities as the rights module names them (orderflow/embedded/rights: the grants of infra/, read from the Bicep
# tree, the one source): every submitting application of the local deployment; examples/client.py is the first of
# main.parameters.json's, the legacy app (legacyOrdersApp's default).
RIGHTS_OF_INFRA = load_rights()
APP, AGENT = FUNCTION_APP, AGENT_IDENTITY
SUBMITTERS = frozenset(RIGHTS_OF_INFRA.identities - {FUNCTION_APP, AGENT_IDENTITY, OPERATORS, SIMULATOR})
SUBMITTER = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]["submittingApps"]["value"][
    0
]["name"]
SEND, LISTEN, READ = "Send", "Listen", "Read"
# Queues by role in the system; "inbound" and "status" are a submitting application's own inbound and status queues.
ORDERS, INBOUND, REQUESTS, REPLIES, ALERTS, STATUS = (
    "orders-inbound",
    "inbound",
    "agent-requests",
    "agent-replies",
    "operator-alerts",
    "status",
)
QUEUE_SETTINGS = {
    "OrdersQueueName": ORDERS,
    "AgentRequestsQueueName": REQUESTS,
    "AgentRepliesQueueName": REPLIES,
    "OperatorAlertsQueueName": ALERTS,
}

# The code of each identity. orderflow/cli/ holds the operator tools run with the operator's own rights;
# orderflow/embedded/ is the local stand-ins.
NOT_DEPLOYED = ("orderflow/cli/", "orderflow/embedded/")
SOURCES = {
    APP: ("function_app.py", "triggers", "activities", "orchestrators", "orderflow"),
    AGENT: ("agent",),
    SUBMITTER: ("examples/client.py",),
}
# Queue arguments, as written at the call sites, and the queue each one names.
QUEUE_ARGUMENTS = {
    "services.tunables.orders_queue": ORDERS,
    "self.services.tunables.orders_queue": ORDERS,
    "orders_queue": ORDERS,
    "services.tunables.agent_requests_queue": REQUESTS,
    "cfg.requests_queue": REQUESTS,
    "self._config.requests_queue": REQUESTS,
    "cfg.replies_queue": REPLIES,
    "services.tunables.alerts_queue": ALERTS,
    "cfg.alerts_queue": ALERTS,
    "rec.reply_to": STATUS,
    "order.reply_to": STATUS,
    "request.reply_to": STATUS,
    "reply_queue": STATUS,
}
# Queue arguments known only at run time, and the test that runs them.
RUN_TIME = {
    ("orderflow/operations.py", "q"): "the summary's dead-letter queues, peeked: test_the_operator_routes_*",
    ("orderflow/operations.py", "queues"): "the summary's queues, read on ARM: test_the_operator_routes_*",
}
# Operations the code performs knowing the right may be missing (it catches the refusal and says so).
MAY_BE_REFUSED = {
    (SUBMITTER, queue, LISTEN): "examples/client.py dead_letter_reason: peeks the orders DLQ for its "
    "own rejected order, and says so when it may not (ServiceBusError)"
    for queue in (ORDERS, INBOUND)
}
# Grants held by design whether or not the code uses them: the legacy app may send to orders-inbound and to its own
# inbound queue while it moves (docs/deploy.md, "Move an app to its own queue"); examples/client.py sends to one.
MIGRATION = {(SUBMITTER, ORDERS, SEND), (SUBMITTER, INBOUND, SEND)}
# Bus and ARM calls: name → (keyword of the queue argument, at position 0; the rights it needs).
PRIMITIVES = {
    "get_queue_sender": ("queue_name", {SEND}),
    "get_queue_receiver": ("queue_name", {LISTEN}),
    "dead_letter_depths": ("queues", {READ}),
}  # orderflow/azure/queue_counts.py: GET .../queues/{queue}


@dataclass(frozen=True)
class Operation:
    identity: str
    queue: str
    right: str
    where: str


def queue_role(queue: str, identity: str) -> str:
    """The role of `queue` for `identity`: a pattern queue's role; INBOUND or STATUS for a submitting app's own
    `<app>-orders` or `<app>-status` (types.bicep), or for any app's when `identity` is not a submitting app; another
    app's queue, for a submitting app, by its own name."""
    pattern = {settings.get(key, env={}): role for key, role in QUEUE_SETTINGS.items()}
    if queue in pattern:
        return pattern[queue]
    for suffix, role in (("-orders", INBOUND), ("-status", STATUS)):
        owner = queue.removesuffix(suffix)
        if queue.endswith(suffix) and owner in SUBMITTERS:
            return role if identity not in SUBMITTERS or owner == identity else queue
    raise AssertionError(f"{queue}: a queue unknown here")


def grants() -> dict[str, set[tuple[str, str]]]:
    """identity → {(queue, right)}, from every Service Bus grant of the rights module: Send and Listen as its roles'
    data actions give them, Read for Reader (`*/read`)."""
    every_role = {*QUEUE_SETTINGS.values(), INBOUND, STATUS}
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for grant in RIGHTS_OF_INFRA.grants:
        if grant.service != "servicebus":
            continue
        rights = {right for right in (SEND, LISTEN) if grant.role.allows(BUS_ACTIONS[right])}
        rights |= {READ} if grant.role.name == "Reader" else set()
        on = every_role if not grant.resource else {queue_role(grant.resource, grant.identity)}  # "": the namespace
        found[grant.identity] |= {(queue, right) for queue in on for right in rights}
    return found


def _files(identity: str) -> Iterator[Path]:
    for source in SOURCES[identity]:
        path = REPO / source
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            relative = file.relative_to(REPO).as_posix()
            if not relative.startswith(NOT_DEPLOYED):
                yield file


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _queue_argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[position] if len(call.args) > position else None


def _calls(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, ast.Call]]:
    """Every call, with the innermost function it is in."""

    def walk(node: ast.AST, owner: ast.FunctionDef | ast.AsyncFunctionDef | None) -> Iterator[Any]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else owner
            if isinstance(child, ast.Call):
                yield owner, child
            yield from walk(child, inner)

    yield from walk(tree, None)


def _name(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)


def _imports(tree: ast.AST) -> dict[str, str]:
    """name → the module stem it comes from, for `from x.y import name` and `from x import y` (a module)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module.rsplit(".", 1)[-1]
    return found


Spec = tuple[int, str, frozenset[str]]  # position and keyword of the queue argument, the rights it needs


def _spec(call: ast.Call, stem: str, imports: dict[str, str], bus: dict[tuple[str, str], Spec]) -> Spec | None:
    """The bus function a call calls: a primitive (any receiver), or a function of a scanned module, called by its
    bare name (defined or imported here), as `module.name` or as `self.name` (a method of this module)."""
    name = _name(call)
    if name in PRIMITIVES:
        return bus[("", name)]
    if isinstance(call.func, ast.Name):
        return bus.get((stem, call.func.id)) or bus.get((imports.get(call.func.id, ""), call.func.id))
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        owner = call.func.value.id
        return bus.get((stem if owner == "self" else owner, call.func.attr))
    return None


def scanned_operations() -> tuple[list[Operation], list[str]]:
    """(operations with a known queue, call sites whose queue argument is unknown)."""
    trees = {(identity, f): ast.parse(f.read_text()) for identity in SOURCES for f in _files(identity)}
    imports = {key: _imports(tree) for key, tree in trees.items()}
    # Bus functions: (module stem, name) → the spec of their queue argument; a function that passes its own parameter
    # on as the queue of a bus function is one too (to a fixpoint).
    bus: dict[tuple[str, str], Spec] = {("", name): (0, kw, frozenset(r)) for name, (kw, r) in PRIMITIVES.items()}
    changed = True
    while changed:
        changed = False
        for (identity, file), tree in trees.items():
            for owner, call in _calls(tree):
                spec = _spec(call, file.stem, imports[(identity, file)], bus)
                arg = None if spec is None else _queue_argument(call, spec[0], spec[1])
                if owner is None or spec is None or not isinstance(arg, ast.Name):
                    continue
                params = _parameters(owner)
                if arg.id in params:
                    old = bus.get((file.stem, owner.name))
                    rights = spec[2] | (old[2] if old else frozenset())
                    if old is None or old[2] != rights:
                        bus[(file.stem, owner.name)] = (params.index(arg.id), arg.id, rights)
                        changed = True
    found: list[Operation] = []
    unknown: list[str] = []
    for (identity, file), tree in trees.items():
        relative = file.relative_to(REPO).as_posix()
        for owner, call in _calls(tree):
            spec = _spec(call, file.stem, imports[(identity, file)], bus)
            if spec is None:
                continue
            arg = _queue_argument(call, spec[0], spec[1])
            source = "" if arg is None else ast.unparse(arg)
            if owner is not None and isinstance(arg, ast.Name) and arg.id in _parameters(owner):
                continue  # passed on: counted where the caller names the queue
            where = f"{relative}:{call.lineno}"
            if source in QUEUE_ARGUMENTS:
                found.extend(Operation(identity, QUEUE_ARGUMENTS[source], r, where) for r in spec[2])
            elif (relative, source) not in RUN_TIME:
                unknown.append(f"{where} {_name(call)}({source!r}, ...)")
    return found, unknown


def trigger_operations() -> list[Operation]:
    """Listen on the queue of every Service Bus trigger the app registers (the host receives and settles there): each
    blueprint's functions as registered, one per app's inbound queue included (`submission-<app>`)."""
    from support.product_app import BLUEPRINT_MODULES

    found = []
    for module_name in BLUEPRINT_MODULES:
        for builder in importlib.import_module(module_name).bp._function_builders:
            function = builder._function
            for binding in function.get_bindings():
                if binding.type == "serviceBusTrigger":
                    name = binding.queue_name
                    queue = settings.get(name.strip("%"), env={}) if name.startswith("%") else name
                    where = f"{module_name}: {function.get_function_name()} ({name})"
                    found.append(Operation(APP, queue_role(str(queue), APP), LISTEN, where))
    return found


def _missing(operations: list[Operation]) -> list[str]:
    granted = grants()
    return sorted(
        {
            f"{o.identity} needs {o.right} on {o.queue}: {o.where}"
            for o in operations
            if (o.queue, o.right) not in granted[o.identity] and (o.identity, o.queue, o.right) not in MAY_BE_REFUSED
        }
    )


def test_every_queue_argument_of_the_deployed_code_is_known() -> None:
    _, unknown = scanned_operations()
    assert unknown == [], "map these queue arguments in QUEUE_ARGUMENTS (or RUN_TIME, with a run below)"


def test_the_scan_and_the_triggers_see_each_identitys_operations() -> None:
    operations, _ = scanned_operations()
    seen = {(o.identity, o.queue, o.right) for o in operations + trigger_operations()}
    assert {
        (APP, ORDERS, LISTEN),
        (APP, INBOUND, LISTEN),
        (APP, REPLIES, LISTEN),
        (APP, REQUESTS, SEND),
        (APP, ALERTS, SEND),
        (APP, STATUS, SEND),
        (AGENT, REQUESTS, LISTEN),
        (AGENT, REPLIES, SEND),
        (AGENT, ALERTS, SEND),
        (SUBMITTER, STATUS, LISTEN),
    } <= seen
    assert seen & MIGRATION, "examples/client.py sends its orders to orders-inbound or to its own inbound queue"


def test_every_operation_of_the_deployed_code_is_granted() -> None:
    operations, _ = scanned_operations()
    assert _missing(operations + trigger_operations()) == []


def test_every_service_bus_grant_to_a_deployed_identity_is_used() -> None:
    # Read (Reader) is used by the summary's ARM reads, whose queues are known at run time: the run below checks it.
    operations, _ = scanned_operations()
    used = {(o.identity, o.queue, o.right) for o in operations + trigger_operations()}
    unused = sorted(
        (identity, queue, right)
        for identity, pairs in grants().items()
        if identity in SOURCES
        for queue, right in pairs
        if (identity, queue, right) not in used | MIGRATION and right != READ
    )
    assert unused == []


# ---- the operator routes, run on the embedded broker through a recording bus ----


class RecordingBus:
    """The embedded broker's aio client, recording (queue, right) of every sender and receiver opened. It hides the
    client's `broker` (the embedded shortcut to the broker's counts), so that a dead-letter depth is read as on Azure,
    by peeking."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.opened = inner, []

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        self.opened.append((queue_name, SEND))
        return self.inner.get_queue_sender(queue_name, **kwargs)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> Any:
        self.opened.append((queue_name, LISTEN))
        return self.inner.get_queue_receiver(queue_name, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "broker":
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.fixture
async def app_services(tmp_path: Path) -> AsyncIterator[Services]:
    conn = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={REPO / 'servicebus.config.json'}"
    orders, state = open_sqlite_stores(tmp_path / "store.db")
    services = Services(
        orders=orders,
        state=state,
        bus=RecordingBus(aio_bus_from_connection_string(conn)),
        tunables=Tunables.from_env({}),
        clock=FakeClock(),
    )
    runtime.use_services(services)
    yield services
    runtime.reset_services()
    await services.bus.close()
    await state.aclose()


def _order(order_id: str, reply_to: str) -> bytes:
    return (
        SubmitOrder.model_validate(
            {
                "orderId": order_id,
                "replyTo": reply_to,
                "customer": {"id": "c-1", "name": "Ada"},
                "items": [{"sku": "SKU-001", "quantity": 1, "unitPrice": "9.99"}],
                "currency": "EUR",
                "submittedAt": "2024-01-01T00:00:00+00:00",
            }
        )
        .to_json()
        .encode()
    )


# An operator as App Service authentication hands the request to the app (X-MS-CLIENT-PRINCIPAL: Base64 JSON of the
# token's claims, the app role among them), on an app where it is on (WEBSITE_AUTH_ENABLED, set by App Service).
OPERATOR_CLAIMS = {
    "auth_typ": "aad",
    "name_typ": "name",
    "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
    "claims": [{"typ": "name", "val": "ops@example.com"}, {"typ": "roles", "val": "Orders.Operator"}],
}
OPERATOR_HEADERS = {"X-MS-CLIENT-PRINCIPAL": base64.b64encode(json.dumps(OPERATOR_CLAIMS).encode()).decode()}
EASY_AUTH_ON = {"WEBSITE_AUTH_ENABLED": "True"}


def _as_operations(services: Services, route: str, read: list[str] | None = None) -> list[Operation]:
    """The recording bus's (queue, right) pairs as operations; with `read`, those ARM queue reads (Read) instead."""
    pairs = services.bus.opened if read is None else [(q, READ) for q in read]
    return [Operation(APP, queue_role(q, APP), right, route) for q, right in pairs]


@pytest.mark.parametrize("arm", [True, False], ids=["azure-arm-counts", "no-resource-id-peek"])
async def test_the_operator_routes_use_only_what_the_function_app_is_granted(app_services: Services, arm: bool) -> None:
    """As deployed (ServiceBusNamespaceResourceId set): the summary reads every queue's counts on ARM, each read
    needs Reader there, and every Reader grant of the app is read. Without the setting it peeks, within Listen."""
    from orderflow import ops_http

    reply_to = sorted(app_services.tunables.allowed_reply_queues)[0]

    async def start(name: str, instance: str, data: Any) -> str:
        return instance

    for order_id in ("running-1", "pending-1"):  # the Starter claims the first one only
        assert isinstance(await submit(app_services, _order(order_id, reply_to), order_id), Accepted)
        if order_id == "running-1":
            assert (await run_starter(app_services, start)).claimed == ["running-1:1"]
    app_services.bus.opened.clear()
    told: list[tuple[str, str]] = []

    async def tell(instance: str, event: str, data: Any) -> None:
        told.append((instance, event))

    queues = sorted(app_services.tunables.internal_queues() | app_services.tunables.allowed_reply_queues)
    async with run_fake_arm(dict.fromkeys(queues, 0)) as fake:
        if arm:
            app_services.queue_counts = ArmQueueCounts(NAMESPACE_ID, FakeCredential(), endpoint=fake.url)
        answers = [
            await ops_http.serve(ops_http.cancel(o, b"", tell), OPERATOR_HEADERS, EASY_AUTH_ON, ok=202)
            for o in ("pending-1", "running-1")
        ]
        summary = await ops_http.serve(ops_http.summary(), OPERATOR_HEADERS, EASY_AUTH_ON)
    assert [a.status for a in answers] == [202, 202], answers
    assert summary.status == 200
    route = "POST /api/orders/{id}/cancel, GET /api/ops/summary"
    read = _as_operations(app_services, route, fake.queues_read())
    assert _missing(_as_operations(app_services, route) + read) == []
    states = {(await app_services.state.get(o))[0].process_state for o in ("pending-1", "running-1")}  # type: ignore
    assert states == {ProcessState.CANCELLED, ProcessState.PROCESSING}
    assert told == [("running-1:1", "CancelOrder")]
    depths = summary.body["deadLetters"]
    if arm:
        assert depths == {q: {"count": 0, "capped": False} for q in queues}
        assert [q for q, right in app_services.bus.opened if right == LISTEN] == []  # no peek: control-plane counts
        assert {(o.queue, o.right) for o in read} == {pair for pair in grants()[APP] if pair[1] == READ}
        return
    assert fake.seen == []
    assert depths[ORDERS] == depths[REPLIES] == {"count": 0, "capped": False}
    for queue in (REQUESTS, ALERTS, reply_to):
        assert "no Listen right" in depths[queue]["error"] and "DeadletteredMessages" in depths[queue]["error"]
