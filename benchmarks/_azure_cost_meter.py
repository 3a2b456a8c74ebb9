"""The counting of benchmarks/azure_cost.py (runs inside devhost and the Agent): `Meter` wraps the embedded store,
the embedded broker, the embedded clients' waiting receives and devhost's invoker in place; `activate_child` dumps
the counts on request."""

from __future__ import annotations

import atexit
import contextvars
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ._azure_cost_figures import QUERY_KINDS
from ._waits import IN_WAIT, WAITED, waiting_wrapper

COUNT_DIR_VARIABLE = "ORDERFLOW_AZURE_COST_DIR"
TIMER_FUNCTIONS = ("starter_timer", "supervisor")  # orderflow/function_names.py STARTER_TIMER, SUPERVISOR


# What each embedded-store method sends to Cosmos DB in the Cosmos adapter: (container, operation). `create|replace`
# is a create when the etag argument is None, else an If-Match replace (put_data); a create_if_absent that finds the
# item (409) also reads it (create_or_read); `a+b` is two operations (set_ttl: a point read, then an If-Match replace,
# orderflow/azure/cosmos.py; counted both even when a kept order skips the replace). update_with_retry and
# oldest_in_state are not counted: they call the methods below.
STORE_OPERATIONS: dict[str, dict[str, tuple[str, str]]] = {
    "SqliteOrdersDb": {
        "create_if_absent": ("orders", "create"),
        "get": ("orders", "point_read"),
        "set_ttl": ("orders", "point_read+replace"),
    },
    "SqliteStateStore": {
        "create_if_absent": ("state", "create"),
        "get": ("state", "point_read"),
        "replace": ("state", "replace"),
        "query_claimable": ("state", "query_cross"),
        "query_unnotified": ("state", "query_cross"),
        "query_expired": ("state", "query_cross"),
        "query_in_state": ("state", "query_cross"),
        "count_in_state": ("state", "count_cross"),
        "count_expired": ("state", "count_cross"),
        "get_checkpoint": ("checkpoints", "point_read"),
        "put_checkpoint": ("checkpoints", "create|replace"),
    },
    "SqliteDocuments": {"get": ("documents", "point_read"), "put": ("documents", "create|replace")},
    "SqliteRecoveryIndex": {
        "add": ("recoveryIndex", "upsert"),
        "page": ("recoveryIndex", "query_single"),
        "first_at_or_after": ("recoveryIndex", "query_cross"),
        "remove": ("recoveryIndex", "delete"),
    },
}
# EmbeddedBroker methods that are Service Bus API calls (an allow-list: helpers the broker gains are not operations).
SERVICE_BUS_OPERATIONS = frozenset(
    {
        "send",
        "cancel_scheduled",
        "receive",
        "take",
        "receive_deferred",
        "peek",
        "complete",
        "abandon",
        "defer",
        "dead_letter",
        "renew_message_lock",
        "accept_session",
        "renew_session_lock",
        "release_session",
        "get_session_state",
        "set_session_state",
    }
)
RECEIVES = ("receive", "take", "receive_deferred", "peek")

SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("azure_cost_scope", default="-")


def key(kind: str, scope: str, a: str, b: str) -> str:
    """Counter keys are `kind|scope|a|b` (JSON-friendly): cosmos|scope|container|op, cosmos_items|..., sb|scope|queue|
    method, sb_msgs|scope|queue|sent/received/peeked, sb_empty|scope|queue|method, fn|name|name|exec."""
    return f"{kind}|{scope}|{a}|{b}"


def split(counter_key: str) -> tuple[str, str, str, str]:
    kind, scope, a, b = counter_key.split("|", 3)
    return kind, scope, a, b


def _items(result: Any) -> int:
    """Items a query returned: a list, a Page (`items`), a (list, charge) or (value or None, charge) pair."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], float):
        result = result[0]
        if not isinstance(result, list):
            return 0 if result is None else 1
    if isinstance(result, list):
        return len(result)
    items = getattr(result, "items", None)
    return len(items) if isinstance(items, list) else 0


class Meter:
    """Counts, by wrapping classes in place (undone by `restore`). Cheap: a dict increment under a lock per call."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._undo: list[tuple[type, str, Any]] = []
        self._depth = threading.local()

    def bump(self, counter_key: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.counts[counter_key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def _set(self, cls: type, name: str, wrapper: Any) -> None:
        original = vars(cls)[name]
        wrapper.__wrapped__ = original
        self._undo.append((cls, name, original))
        setattr(cls, name, wrapper)

    def restore(self) -> None:
        while self._undo:
            cls, name, original = self._undo.pop()
            setattr(cls, name, original)

    # The embedded store (orderflow.embedded.store) --------------------------------------------------------------
    def patch_store(self, module: Any) -> None:
        for class_name, methods in STORE_OPERATIONS.items():
            cls = getattr(module, class_name, None)
            for method, (container, op) in methods.items():
                if cls is not None and method in vars(cls):
                    self._set(cls, method, self._store_wrapper(vars(cls)[method], container, op))

    def _store_wrapper(self, method: Any, container: str, op: str) -> Any:
        meter = self

        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            where = container
            if container == "documents":  # the breaker container (and any other named collection)
                where = str(getattr(self, "_collection", "documents"))
            kind = op
            if op == "create|replace":
                etag = args[2] if len(args) > 2 else kwargs.get("etag")
                kind = "create" if etag is None else "replace"
            scope = SCOPE.get()
            for each in kind.split("+"):
                meter.bump(key("cosmos", scope, where, each))
            result = await method(self, *args, **kwargs)
            if op == "create" and isinstance(result, tuple) and result[1] is False:
                meter.bump(key("cosmos", scope, where, "point_read"))  # create_or_read: 409, then a point read
            if kind in QUERY_KINDS:
                meter.bump(key("cosmos_items", scope, where, kind), _items(result))
            return result

        return wrapper

    # The embedded broker (orderflow.embedded.broker) ----------------------------------------------------------------
    def patch_broker(self, module: Any) -> None:
        cls = module.EmbeddedBroker
        for name in sorted(SERVICE_BUS_OPERATIONS):
            owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)  # the seam defining it
            if owner is not None:
                self._set(owner, name, self._broker_wrapper(vars(owner)[name], name))

    def _broker_wrapper(self, method: Any, name: str) -> Any:
        meter, depth = self, self._depth

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            level = getattr(depth, "n", 0)
            depth.n = level + 1
            try:
                result = method(self, *args, **kwargs)
            finally:
                depth.n = level
            if level == 0:  # outermost only: `receive` calls `take`
                queue = str(args[0] if args else kwargs.get("queue", "?"))
                scope = SCOPE.get()
                waited = name in WAITED and IN_WAIT.get()  # counted once by the waiting call (patch_receivers)
                if not waited:
                    meter.bump(key("sb", scope, queue, name))
                if name == "send" and len(args) > 1:
                    meter.bump(key("sb_msgs", scope, queue, "sent"), len(args[1]))
                elif name in RECEIVES:
                    messages = result if isinstance(result, list) else getattr(result, "messages", None)
                    if isinstance(messages, list):
                        meter.bump(
                            key("sb_msgs", scope, queue, "peeked" if name == "peek" else "received"), len(messages)
                        )
                        if not messages and not waited:
                            meter.bump(key("sb_empty", scope, queue, name))
                elif name == "accept_session" and result is None and not waited:
                    meter.bump(key("sb_empty", scope, queue, name))
            return result

        return wrapper

    # The embedded clients' waiting calls (orderflow.embedded.client, client_aio: ServiceBusReceiver._wait_for) --------
    def patch_receivers(self, module: Any) -> None:
        """A waiting receive or accept counts once, found nothing if it returned nothing (benchmarks/_waits.py)."""
        cls = module.ServiceBusReceiver
        meter = self

        def count(queue: str, name: str, found: bool) -> None:
            scope = SCOPE.get()
            meter.bump(key("sb", scope, queue, name))
            if not found:
                meter.bump(key("sb_empty", scope, queue, name))

        self._set(cls, "_wait_for", waiting_wrapper(vars(cls)["_wait_for"], count))

    # devhost's one entry point of every function execution (devhost.invoke.Invoker.call) -------------------------
    def patch_invoker(self, module: Any) -> None:
        cls = module.Invoker
        original = vars(cls)["call"]
        meter = self

        async def call(self: Any, fn: Any, inputs: Mapping[str, Any], **kwargs: Any) -> Any:
            name = str(fn.get_function_name())
            meter.bump(key("fn", name, name, "exec"))
            token = SCOPE.set(name)  # store and broker calls of this execution count under its name
            try:
                return await original(self, fn, inputs, **kwargs)
            finally:
                SCOPE.reset(token)

        self._set(cls, "call", call)

    def install(self) -> None:
        """Patch each module now if it is loaded, else when it is first imported."""
        patches = {
            "orderflow.embedded.store": self.patch_store,
            "orderflow.embedded.broker": self.patch_broker,
            "orderflow.embedded.client": self.patch_receivers,
            "orderflow.embedded.client_aio": self.patch_receivers,
            "devhost.invoke": self.patch_invoker,
        }
        for name, patch in list(patches.items()):
            if name in sys.modules:
                patch(sys.modules[name])
                del patches[name]
        if patches:
            sys.meta_path.insert(0, _PatchOnImport(patches))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.pop(fullname, None)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


METER = Meter()


def activate_child(count_dir: str) -> None:
    """In a measured process (from the generated sitecustomize): count, and dump on request (a byte on
    `<dir>/<pid>.req`, echoed as `seq` in `<dir>/<pid>.json`: compare_counts.request_dump's protocol) and at exit."""
    METER.install()
    os.makedirs(count_dir, exist_ok=True)
    fifo, out = os.path.join(count_dir, f"{os.getpid()}.req"), os.path.join(count_dir, f"{os.getpid()}.json")

    def dump(seq: int = 0) -> None:
        temporary = f"{out}.tmp"
        with open(temporary, "w") as f:
            json.dump({"pid": os.getpid(), "seq": seq, "counts": METER.snapshot()}, f)
        os.replace(temporary, out)

    def serve() -> None:
        while True:
            try:
                with open(fifo, "rb", buffering=0) as requests:  # blocks until a request; costs nothing meanwhile
                    while data := requests.read(64):
                        dump(data[-1])
            except OSError:
                return

    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    threading.Thread(target=serve, name="azure-cost-dump", daemon=True).start()
    atexit.register(dump)
    dump()


SITECUSTOMIZE = f'''"""Generated by benchmarks/azure_cost.py: counts Cosmos, Service Bus and function calls."""
import os

if os.environ.get("{COUNT_DIR_VARIABLE}"):
    from benchmarks.azure_cost import activate_child

    activate_child(os.environ["{COUNT_DIR_VARIABLE}"])
'''


@contextmanager
def metered() -> Iterator[Meter]:
    """A fresh Meter whose patches are undone on exit (for tests)."""
    meter = Meter()
    try:
        yield meter
    finally:
        meter.restore()
