"""`python -m benchmarks azure_cost [--orders N] [--json]`: what one order costs on Azure, counted from a run.

It runs the local system (devhost with function_app.py, the Agent, the simulator, and the demo's client app in this
process: benchmarks/compare_ours.py `OurClient`) and counts, per order, what the Azure services would be asked to do:

- Cosmos DB operations by container and kind (point read, create, replace (If-Match), upsert, delete, query within one
  partition or across partitions, count query), from the calls of the embedded store's adapters, each mapped to what
  the Cosmos adapter (orderflow/azure/cosmos.py) sends for it; RU estimated from Microsoft's published figures
  (`RU_RULES`, with their sources);
- Service Bus operations by kind and queue (every call of the embedded broker that is an API call on Service Bus:
  `SERVICE_BUS_OPERATIONS`), the messages they carry, and the receives and session accepts that found nothing;
- function executions (every call through devhost's `Invoker.call`, by function name), Durable activities, episodes
  and history events (devhost's Durable store, as benchmarks/compare_counts.py reads it) and the Durable Task
  Scheduler's billed "actions" derived from those events.

How it counts: every devhost and Agent process starts with a generated `sitecustomize` (PYTHONPATH) that wraps those
classes when their modules are first imported (`Meter`); a process dumps its counts on request through the FIFO
protocol of benchmarks/compare_counts.py (`request_dump`). Nothing in the product changes. Each function call sets the
scope its store and broker calls are counted under, so the timer triggers' own work (Starter, Supervisor) is known.

Scenarios, each N orders submitted at once on one running system: `happy` (nothing scripted); `hang` (the first step's
first remote call hangs past the step's CompleteBy: the attempt times out, the Supervisor recovers the record, a
second attempt completes: one recovery per order); `permanent` (the last step fails permanently: the two steps before
it are compensated). Before them, an idle window measures the background (timer ticks, receivers' polling); the
background that fell within a scenario's window (per timer tick for the timers, per second otherwise) is subtracted
before dividing by N.

Writes benchmarks/results/azure_cost.json and azure_cost.md; prints the per-order figures and the monthly table (1, 10
and 100 orders/s). With --json the last line printed is the result document. Prices and the figures behind the RU
estimate are in `PRICES`/`RU_RULES` with the page each comes from (read 2026-11-30); docs/cost.md explains them.
"""

from __future__ import annotations

import argparse
import atexit
import contextvars
import importlib.abc
import importlib.machinery
import json
import math
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import compare_counts

READ_ON = "2026-11-30"  # when every source below was read (the stored copies of the search corpus)
MONTH_S = 2_628_000  # 730 hours: the month of the Durable Task Scheduler billing doc's examples ("seconds in a month")
RATES = (1, 10, 100)  # orders/s of the monthly table
COUNT_DIR_VARIABLE = "ORDERFLOW_AZURE_COST_DIR"
TIMER_FUNCTIONS = ("starter_timer", "supervisor")  # orderflow/function_names.py STARTER_TIMER, SUPERVISOR


# --- published figures -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    url: str
    says: str  # what the page says, quoted or closely paraphrased
    note: str = ""


COSMOS_RU_DOC = "https://learn.microsoft.com/azure/cosmos-db/optimize-cost-reads-writes"
SOURCES: dict[str, Source] = {
    "cosmos_point_read": Source(COSMOS_RU_DOC, "Cost of one point read: 1 KB item 1 RU; 100 KB item 10 RUs.",
                                "source: MicrosoftDocs/azure-databases-docs articles/cosmos-db/"
                                "optimize-cost-reads-writes.md, ms.date 08/26/2021"),
    "cosmos_write": Source(COSMOS_RU_DOC, "Inserting a 1 KB item without indexing costs around ~5.5 RUs. Replacing an "
                           "item costs two times the charge required to insert the same item.",
                           "our containers index every path (STATE_INDEXING_POLICY): real writes cost more"),
    "cosmos_query": Source(COSMOS_RU_DOC, "Sample query metrics: Retrieved Document Count 1 (9,963 bytes) ... Request "
                           "Charge 3.19 RUs; a query returning 1000 1-KB items costs 1000.",
                           "no published minimum per query: 3 RU per query and 1 RU per item returned is our rule of "
                           "thumb from this sample"),
    "cosmos_cross_partition": Source("https://learn.microsoft.com/azure/cosmos-db/how-to-query-container",
                                     "a cross-partition query fans out to all physical partitions: effectively one "
                                     "query per physical partition",
                                     "figures assume one physical partition (containers this small have one)"),
    "cosmos_prices": Source("https://learn.microsoft.com/azure/cosmos-db/understand-your-bill",
                            "$0.008 (per 100 RU/sec per hour) [provisioned, single write region]; serverless: 500,000 "
                            "Request Units ... $0.125 (500,000 * $0.25/million)",
                            "examples 'based on the price for an Azure Cosmos DB account deployed in a non-government "
                            "region in the US'; source ms.date 03/31/2022"),
    "cosmos_autoscale": Source("https://learn.microsoft.com/azure/cosmos-db/how-to-choose-offer",
                               "public pricing rates for manual ($0.008 USD per 100 RU/s per hour) and autoscale "
                               "throughput ($0.012 USD per 100 RU/s per hour) in single-region write accounts; "
                               "autoscale scales 0.1*Tmax <= T <= Tmax; manual entry point 400 RU/s",
                               "source ms.date 07/26/2024"),
    "cosmos_serverless_limit": Source("https://learn.microsoft.com/azure/cosmos-db/serverless",
                                      "A serverless container begins with a throughput of 5,000 RU/s. Each physical "
                                      "partition within a serverless container can handle up to 5,000 RU/s; best for "
                                      "low (less than 10 percent) average-to-peak traffic ratio",
                                      "source ms.date 03/16/2023"),
    "cosmos_autoscale_entry": Source("https://learn.microsoft.com/azure/cosmos-db/provision-throughput-autoscale",
                                     "The entry point for autoscale maximum throughput Tmax starts at 1000 RU/s ... "
                                     "You can set Tmax in increments of 1000 RU/s"),
    "servicebus_throttling": Source("https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling",
                                    "The credit limits are currently set to 1000 credits every second (per namespace). "
                                    "Data operations (Send, SendAsync, Receive, ReceiveAsync, Peek): 1 credit per "
                                    "message; management operations: 10 credits",
                                    "complete, abandon, session accept, lock renewal are not in the table"),
    "servicebus_pricing": Source("https://azure.microsoft.com/pricing/details/service-bus/",
                                 "An operation is any API call to the Service Bus service. Standard: base charge; "
                                 "first 13M ops/month included; next 87M (13M-100M); next 2,400M (100M-2,500M); "
                                 "over 2,500M",
                                 "USD figures NOT FOUND in the stored docs: the stored page shows '$-' for each"),
    "servicebus_pricing_cn": Source("https://www.azure.cn/en-us/pricing/details/service-bus/",
                                    "Standard: base charge ¥0.0851/hour; first 13M operations/month included; next 88M "
                                    "(13M-100M) ¥5.21 per million; next 2,400M ¥3.20 per million; over 2,500M ¥1.27 "
                                    "per million (tax-inclusive; 744 hours a month)",
                                    "Azure operated by 21Vianet (China), in CNY: the only Service Bus prices found"),
    "dts_billing": Source("https://learn.microsoft.com/azure/azure-functions/durable/durable-task-scheduler/"
                          "durable-task-scheduler-billing",
                          "An action is a message dispatched by the Durable Task Scheduler to your application: "
                          "starting an orchestration, starting an activity, completing a timer, triggering an external "
                          "event, processing the result of an activity ...; an activity uses two actions (scheduling, "
                          "processing the result). Dedicated: each CU supports up to 2,000 actions per second (up to "
                          "three CUs). Consumption: up to 500 actions per second. Month: 2,628,000 seconds",
                          "price per CU and per action: NOT FOUND in the stored docs ('see the pricing page')"),
    "durable_billing": Source("https://learn.microsoft.com/azure/azure-functions/durable/durable-functions-billing",
                              "Each replay is viewed by the Azure Functions runtime as a distinct function invocation",
                              "Azure Storage backend: transactions billed to your storage account; no per-episode "
                              "figure is published"),
    "durable_azure_storage": Source("https://learn.microsoft.com/azure/azure-functions/durable/"
                                    "durable-functions-azure-storage-provider",
                                    "all function execution is driven by Azure Storage queues (one work-item queue for "
                                    "activity messages, control queues for instance messages); Tables store history "
                                    "(new rows as an instance runs; loaded by a range query when it replays) and "
                                    "instance state; blobs and blob leases distribute partitions",
                                    "transactions per order are OUR MODEL from these components (`storage_model`), "
                                    "not measured and not published; queue polling and lease renewals are left out"),
    "functions_pricing": Source("https://azure.microsoft.com/pricing/details/functions/",
                                "Executions are counted each time a function is executed in response to an event, "
                                "triggered by a binding",
                                "Flex Consumption USD prices NOT FOUND in the stored docs: the stored page shows '$-'"),
}


@dataclass(frozen=True)
class Price:
    value: float
    unit: str
    currency: str
    source: str  # key of SOURCES


PRICES: dict[str, Price] = {
    "cosmos_serverless_per_million_ru": Price(0.25, "per million RU", "USD", "cosmos_prices"),
    "cosmos_manual_per_100rus_hour": Price(0.008, "per 100 RU/s per hour", "USD", "cosmos_autoscale"),
    "cosmos_autoscale_per_100rus_hour": Price(0.012, "per 100 RU/s per hour", "USD", "cosmos_autoscale"),
    "servicebus_cn_base_hour": Price(0.0851, "per hour (Standard base)", "CNY", "servicebus_pricing_cn"),
}
HOURS_PER_MONTH = MONTH_S / 3600
COSMOS_MANUAL_MIN_RUS = 400
COSMOS_AUTOSCALE_STEP = 1000
COSMOS_SERVERLESS_PARTITION_RUS = 5000
# Service Bus Standard operations tiers: (ops up to, price per million); None = not found. Tier bounds from the
# pricing page; CNY prices from azure.cn (its second tier reads "Next 88M", the global page "Next 87M": same bound).
SERVICEBUS_TIERS_CN: tuple[tuple[float, float], ...] = ((13e6, 0.0), (100e6, 5.21), (2_500e6, 3.20), (math.inf, 1.27))
SERVICEBUS_CREDITS_PER_S = 1000
DTS_ACTIONS_PER_CU_S = 2000
DTS_MAX_CUS = 3
DTS_CONSUMPTION_MAX_ACTIONS_S = 500

# RU per operation (1 KB items): published where a figure exists, our rule of thumb otherwise (SOURCES says which).
RU_RULES: dict[str, float] = {
    "point_read": 1.0,  # cosmos_point_read
    "create": 5.5,  # cosmos_write ("without indexing": a floor)
    "replace": 11.0,  # cosmos_write: twice an insert
    "upsert": 5.5,  # the recovery index's entries are new ids (<orderId>|<completeBy>): an insert
    "delete": 5.5,  # not published: taken as an insert
    "query_single": 3.0,  # cosmos_query rule of thumb (+ RU_PER_ITEM_RETURNED)
    "query_cross": 3.0,  # the same per physical partition (one here)
    "count_cross": 3.0,
}
RU_PER_ITEM_RETURNED = 1.0
QUERY_KINDS = ("query_single", "query_cross", "count_cross")


# --- counting (runs inside devhost and the Agent) ------------------------------------------------------------------
# What each embedded-store method sends to Cosmos DB in the Cosmos adapter: (container, operation). `create|replace`
# is a create when the etag argument is None, else an If-Match replace (put_data); a create_if_absent that finds the
# item (409) also reads it (create_or_read). update_with_retry and oldest_in_state are not counted: they call the
# methods below.
STORE_OPERATIONS: dict[str, dict[str, tuple[str, str]]] = {
    "SqliteOrdersDb": {"create_if_absent": ("orders", "create"), "get": ("orders", "point_read")},
    "SqliteStateStore": {
        "create_if_absent": ("state", "create"), "get": ("state", "point_read"), "replace": ("state", "replace"),
        "query_claimable": ("state", "query_cross"), "query_unnotified": ("state", "query_cross"),
        "query_expired": ("state", "query_cross"), "query_in_state": ("state", "query_cross"),
        "count_in_state": ("state", "count_cross"), "count_expired": ("state", "count_cross"),
        "get_checkpoint": ("checkpoints", "point_read"), "put_checkpoint": ("checkpoints", "create|replace"),
    },
    "SqliteDocuments": {"get": ("documents", "point_read"), "put": ("documents", "create|replace")},
    "SqliteRecoveryIndex": {
        "add": ("recoveryIndex", "upsert"), "page": ("recoveryIndex", "query_single"),
        "first_at_or_after": ("recoveryIndex", "query_cross"), "remove": ("recoveryIndex", "delete"),
    },
}
# EmbeddedBroker methods that are Service Bus API calls (an allow-list: helpers the broker gains are not operations).
SERVICE_BUS_OPERATIONS = frozenset({
    "send", "cancel_scheduled", "receive", "take", "receive_deferred", "peek", "complete", "abandon", "defer",
    "dead_letter", "renew_message_lock", "accept_session", "renew_session_lock", "release_session",
    "get_session_state", "set_session_state"})
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
            meter.bump(key("cosmos", scope, where, kind))
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
                meter.bump(key("sb", scope, queue, name))
                if name == "send" and len(args) > 1:
                    meter.bump(key("sb_msgs", scope, queue, "sent"), len(args[1]))
                elif name in RECEIVES:
                    messages = result if isinstance(result, list) else getattr(result, "messages", None)
                    if isinstance(messages, list):
                        meter.bump(key("sb_msgs", scope, queue, "peeked" if name == "peek" else "received"),
                                   len(messages))
                        if not messages:
                            meter.bump(key("sb_empty", scope, queue, name))
                elif name == "accept_session" and result is None:
                    meter.bump(key("sb_empty", scope, queue, name))
            return result

        return wrapper

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
        patches = {"orderflow.embedded.store": self.patch_store, "orderflow.embedded.broker": self.patch_broker,
                   "devhost.invoke": self.patch_invoker}
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


# --- arithmetic (pure) -------------------------------------------------------------------------------------------
def per_order(delta: Mapping[str, float], idle: Mapping[str, float], idle_s: float, idle_ticks: Mapping[str, float],
              span_s: float, ticks: Mapping[str, float], orders: int) -> dict[str, float]:
    """One process's counts per order: the scenario's delta less the background that fell in its window (per timer
    tick under a timer's scope, per second otherwise, both from the idle window), never below 0, divided by `orders`."""
    out: dict[str, float] = {}
    for counter_key, value in delta.items():
        scope = split(counter_key)[1]
        background = 0.0
        if scope in TIMER_FUNCTIONS:
            if idle_ticks.get(scope):
                background = idle.get(counter_key, 0) / idle_ticks[scope] * ticks.get(scope, 0)
        elif idle_s > 0:
            background = idle.get(counter_key, 0) / idle_s * span_s
        left = max(0.0, value - background) / orders
        if left:
            out[counter_key] = left
    return out


def cosmos_ru(ops: Mapping[tuple[str, str], float], items: Mapping[tuple[str, str], float],
              rules: Mapping[str, float] = RU_RULES, per_item: float = RU_PER_ITEM_RETURNED,
              partitions: int = 1) -> dict[str, float]:
    """Estimated RU by container (and 'total') for operation counts {(container, op): n} and items returned by
    queries {(container, op): n}. A cross-partition query or count is charged once per physical partition."""
    by_container: Counter[str] = Counter()
    for (container, op), n in ops.items():
        each = rules[op] * (partitions if op in ("query_cross", "count_cross") else 1)
        by_container[container] += n * each
    for (container, _op), n in items.items():
        by_container[container] += n * per_item
    out = {c: round(v, 4) for c, v in sorted(by_container.items())}
    out["total"] = round(sum(by_container.values()), 4)
    return out


def tiered(quantity: float, tiers: tuple[tuple[float, float], ...]) -> float:
    """The price of `quantity` units under (up_to, price per million) tiers, each applied to the part within it."""
    cost, below = 0.0, 0.0
    for up_to, per_million in tiers:
        part = max(0.0, min(quantity, up_to) - below)
        cost += part / 1e6 * per_million
        below = up_to
        if quantity <= up_to:
            break
    return cost


def _ceil_to(value: float, step: float) -> float:
    return math.ceil(value / step - 1e-9) * step


def cosmos_provisioned(ru_per_s: float) -> dict[str, float]:
    """Monthly USD for one database's shared throughput at a steady `ru_per_s`: manual (rounded up to 100 RU/s, at
    least the 400 RU/s entry point) and autoscale (Tmax in steps of 1000; billed for the RU/s reached, at least
    0.1*Tmax, at the autoscale rate)."""
    manual = max(COSMOS_MANUAL_MIN_RUS, _ceil_to(ru_per_s, 100))
    tmax = max(COSMOS_AUTOSCALE_STEP, _ceil_to(ru_per_s, COSMOS_AUTOSCALE_STEP))
    billed = max(_ceil_to(ru_per_s, 100), tmax / 10)
    manual_rate = PRICES["cosmos_manual_per_100rus_hour"].value
    auto_rate = PRICES["cosmos_autoscale_per_100rus_hour"].value
    return {"ru_per_s": round(ru_per_s, 3), "manual_rus": manual,
            "manual_usd": round(manual / 100 * manual_rate * HOURS_PER_MONTH, 2),
            "autoscale_tmax": tmax, "autoscale_billed_rus": billed,
            "autoscale_usd": round(billed / 100 * auto_rate * HOURS_PER_MONTH, 2)}


def monthly(order: Mapping[str, Any], background: Mapping[str, Any], rate: float) -> dict[str, Any]:
    """The monthly figures at `rate` orders/s from one order's counts (`order`, as `summarize` makes them) and the
    fixed background per second (`background`: cosmos_ru_by_database, functions_executions per second)."""
    orders = rate * MONTH_S
    cosmos = order["cosmos"]
    by_db = {db: ru * rate + background.get("cosmos_ru_per_s_by_database", {}).get(db, 0.0)
             for db, ru in cosmos["ru_by_database"].items()}
    for db, ru in background.get("cosmos_ru_per_s_by_database", {}).items():
        by_db.setdefault(db, ru)
    ru_month = sum(by_db.values()) * MONTH_S
    busiest = max((ru * rate for ru in cosmos["ru_by_container"].values()), default=0.0)
    provisioned = {db: cosmos_provisioned(ru) for db, ru in sorted(by_db.items())}
    sb = order["servicebus"]
    sb_ops = sb["operations"] * orders
    client_ops = sb["client"]["operations"] * orders
    durable = order["durable"]
    actions_s = durable["dts_actions"] * rate
    executions = order["functions"]["executions"] * orders + background.get("executions_per_s", 0.0) * MONTH_S
    return {
        "orders_per_s": rate,
        "orders_per_month": orders,
        "cosmos": {
            "ru_per_month": round(ru_month),
            "serverless_usd": round(ru_month / 1e6 * PRICES["cosmos_serverless_per_million_ru"].value, 2),
            "busiest_container_ru_per_s": round(busiest, 1),
            "serverless_fits_one_partition": busiest <= COSMOS_SERVERLESS_PARTITION_RUS,
            "provisioned_by_database": provisioned,
            "manual_usd": round(sum(p["manual_usd"] for p in provisioned.values()), 2),
            "autoscale_usd": round(sum(p["autoscale_usd"] for p in provisioned.values()), 2),
        },
        "servicebus": {
            "operations_per_month": round(sb_ops),
            "client_operations_per_month": round(client_ops),
            "credits_per_s_messages": round((sb["credits_messages"] + sb["client"]["credits_messages"]) * rate, 1),
            "credits_per_s_all_calls": round((sb["operations"] + sb["client"]["operations"]) * rate, 1),
            "fits_one_namespace": (sb["operations"] + sb["client"]["operations"]) * rate <= SERVICEBUS_CREDITS_PER_S,
            "fits_one_namespace_messages_only":
                (sb["credits_messages"] + sb["client"]["credits_messages"]) * rate <= SERVICEBUS_CREDITS_PER_S,
            "usd": None,  # not found in the stored docs
            "cny_azure_china": round(PRICES["servicebus_cn_base_hour"].value * HOURS_PER_MONTH
                                     + tiered(sb_ops + client_ops, SERVICEBUS_TIERS_CN), 2),
        },
        "durable": {
            "episodes_per_month": round(durable["episodes"] * orders),
            "azure_storage_transactions_per_month_model": round(durable["azure_storage_transactions_model"] * orders),
            "activities_per_month": round(durable["activities"] * orders),
            "history_events_per_month": round(durable["history_events"] * orders),
            "dts_actions_per_s": round(actions_s, 2),
            "dts_dedicated_cus": max(1, math.ceil(actions_s / DTS_ACTIONS_PER_CU_S - 1e-9)),
            "dts_dedicated_fits": actions_s <= DTS_ACTIONS_PER_CU_S * DTS_MAX_CUS,
            "dts_consumption_fits": actions_s <= DTS_CONSUMPTION_MAX_ACTIONS_S,
            "usd": None,  # DTS prices and Azure Storage transactions per episode: not found in the stored docs
        },
        "functions": {"executions_per_month": round(executions), "usd": None},  # Flex Consumption price: not found
    }


def namespace_capacity(order: Mapping[str, Any]) -> dict[str, Any]:
    """Credits one order draws from a Standard namespace's 1,000 per second (ours and the client app's calls: they share
    the namespace), and so the most orders/s one namespace carries, three ways: only the throttling doc's data
    operations (1 credit per message sent, received or peeked: the fewest credits), every call that moved a message or
    settled one (the empty receives and session accepts left out), and every API call."""
    sb, client = order["servicebus"], order["servicebus"]["client"]
    credits = {
        "messages_only": sb["credits_messages"] + client["credits_messages"],
        "calls_without_empty": (sb["operations"] - sum(sb["empty"].values())
                                + client["operations"] - sum(client["empty"].values())),
        "all_calls": sb["operations"] + client["operations"],
    }
    return {"credits_per_order": {k: round(v, 3) for k, v in credits.items()},
            "max_orders_per_s": {k: round(SERVICEBUS_CREDITS_PER_S / v, 1) if v else None for k, v in credits.items()}}


def dts_actions(by_type: Mapping[str, float]) -> float:
    """Durable Task Scheduler actions from history events (SOURCES['dts_billing']): the orchestration's start, two per
    activity (scheduling, processing the result), one per fired timer and one per raised external event."""
    return (by_type.get("EXECUTION_STARTED", 0) + 2 * by_type.get("TASK_SCHEDULED", 0)
            + by_type.get("TIMER_FIRED", 0) + by_type.get("EVENT_RAISED", 0))


# Azure Storage transactions of the Durable Azure Storage provider, by history event (our model from the documented
# components, SOURCES['durable_azure_storage']): the start puts a message on a control queue and inserts the instance
# row; an episode gets and deletes its control-queue message(s), loads the history (range query), appends history rows
# (a table batch) and updates the instance row; an activity is a work-item message put, got and deleted, and its result
# a control-queue message put; a durable timer and a raised event are one control-queue message put each.
STORAGE_MODEL: dict[str, int] = {"EXECUTION_STARTED": 2, "ORCHESTRATOR_STARTED": 5, "TASK_SCHEDULED": 4,
                                 "TIMER_CREATED": 1, "EVENT_RAISED": 1}


def storage_model(by_type: Mapping[str, float]) -> float:
    return sum(n * by_type.get(event, 0) for event, n in STORAGE_MODEL.items())


def database_of(container: str) -> str:
    """The Cosmos database of a container (orderflow.azure.cosmos.CosmosNames): orders in `orders`, everything else in
    `state`."""
    return "orders" if container == "orders" else "state"


def summarize(per_role: Mapping[str, Mapping[str, float]], durable: Mapping[str, Any]) -> dict[str, Any]:
    """One order's figures from per-order counts by process role (devhost, agent, client) and devhost's Durable counts
    per order (compare_counts.durable_counts / orders)."""
    ops: Counter[tuple[str, str]] = Counter()
    items: Counter[tuple[str, str]] = Counter()
    cosmos_by_process: Counter[str] = Counter()
    sb = {"product": _sb_totals(), "client": _sb_totals()}
    functions: Counter[str] = Counter()
    for role, counts in per_role.items():
        side = sb["client" if role == "client" else "product"]
        for counter_key, n in counts.items():
            kind, scope, a, b = split(counter_key)
            if kind == "cosmos":
                ops[(a, b)] += n
                cosmos_by_process[f"{role}:{scope}"] += n
            elif kind == "cosmos_items":
                items[(a, b)] += n
            elif kind == "sb":
                side["operations"] += n
                side["by_operation"][b] += n
                side["by_queue"][a] += n
            elif kind == "sb_msgs":
                side[f"messages_{b}"] += n
            elif kind == "sb_empty":
                side["empty"][b] += n
            elif kind == "fn" and scope not in TIMER_FUNCTIONS:
                functions[scope] += n
    # Orchestrator episodes and activities come from the Durable history (by order prefix): a cancelled timer that
    # fires after the window would put an episode of these orders outside the counters' window.
    from_history = {"order_workflow": durable["episodes"]}
    triggers = {name: n for name, n in functions.items() if name in ("submission", "agent_replies")}
    executions = sum(triggers.values()) + durable["episodes"] + durable["activities"]
    ru = cosmos_ru(ops, items)
    ru_by_db: Counter[str] = Counter()
    for container, value in ru.items():
        if container != "total":
            ru_by_db[database_of(container)] += value
    return {
        "cosmos": {
            "operations": round(sum(ops.values()), 3),
            "by_container": _nested(ops),
            "items_returned": _nested(items),
            "by_process": {k: round(v, 3) for k, v in sorted(cosmos_by_process.items())},
            "ru": ru["total"],
            "ru_by_container": {k: v for k, v in ru.items() if k != "total"},
            "ru_by_database": {k: round(v, 4) for k, v in sorted(ru_by_db.items())},
        },
        "servicebus": {**_sb_out(sb["product"]), "client": _sb_out(sb["client"])},
        "functions": {"executions": round(executions, 3),
                      "by_function": {**{k: round(v, 3) for k, v in sorted(triggers.items())}, **from_history,
                                      "activities": durable["activities"]},
                      "counted_by_devhost": {k: round(v, 3) for k, v in sorted(functions.items())}},
        "durable": {**durable, "dts_actions": round(dts_actions(durable["history_events_by_type"]), 3),
                    "azure_storage_transactions_model": round(storage_model(durable["history_events_by_type"]), 3)},
    }


def _sb_totals() -> dict[str, Any]:
    return {"operations": 0.0, "by_operation": Counter(), "by_queue": Counter(), "empty": Counter(),
            "messages_sent": 0.0, "messages_received": 0.0, "messages_peeked": 0.0}


def _sb_out(t: Mapping[str, Any]) -> dict[str, Any]:
    credits = t["messages_sent"] + t["messages_received"] + t["messages_peeked"]
    return {"operations": round(t["operations"], 3),
            "by_operation": {k: round(v, 3) for k, v in sorted(t["by_operation"].items())},
            "by_queue": {k: round(v, 3) for k, v in sorted(t["by_queue"].items())},
            "empty": {k: round(v, 3) for k, v in sorted(t["empty"].items())},
            "messages_sent": round(t["messages_sent"], 3), "messages_received": round(t["messages_received"], 3),
            "messages_peeked": round(t["messages_peeked"], 3),
            # the throttling doc's data operations: 1 credit per message sent, received or peeked
            "credits_messages": round(credits, 3)}


def _nested(flat: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for (a, b), n in sorted(flat.items()):
        out.setdefault(a, {})[b] = round(n, 3)
    return out


def subtract(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """a − b for nested dicts of numbers (what one recovery adds to an order: scenario minus happy path)."""
    out: dict[str, Any] = {}
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k, 0), b.get(k, 0)
        if isinstance(x, Mapping) or isinstance(y, Mapping):
            out[k] = subtract(x if isinstance(x, Mapping) else {}, y if isinstance(y, Mapping) else {})
        elif isinstance(x, bool | str) or isinstance(y, bool | str) or x is None or y is None:
            continue
        else:
            out[k] = round(x - y, 3)
    return out


def seconds_of(schedule: str) -> float | None:
    """The period of a `*/N * * * * *` NCRONTAB schedule, else None."""
    first = schedule.split()[0] if schedule.split() else ""
    return float(first[2:]) if first.startswith("*/") and first[2:].isdigit() else None


# --- the run -----------------------------------------------------------------------------------------------------
SEED = 7
SETTINGS = {
    # No crash here, so steps may be short (as the retry-budget drill's): a hang costs 8 s, not 20.
    "StepTimeoutSeconds": "8", "ClaimLeaseSeconds": "8",
    # 10 hung requests in 30 s would open the shared breaker (registry threshold 10) and turn recoveries into
    # deferrals; the breaker still reads its document as usual.
    "CircuitBreakerFailureThreshold": "1000",
}
HANG_SECONDS = 10.0  # the simulator holds a hung answer past the 8 s step


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    script: Callable[[list[str]], dict[str, list[str]]]  # order ids -> the simulator's fault script


def _steps() -> list[str]:
    from orderflow.messages import STEPS  # noqa: PLC0415

    return [s.value for s in STEPS]


def _key(order_id: str, step: str) -> str:
    from orderflow.messages import idempotency_key  # noqa: PLC0415

    return idempotency_key(order_id, step)


SCENARIOS = (
    Scenario("happy", "every step succeeds at the first call", lambda ids: {}),
    Scenario("hang", "the first step's first call hangs past CompleteBy; the Supervisor recovers the record and a "
             "second attempt completes", lambda ids: {_key(o, _steps()[0]): ["hang"] for o in ids}),
    Scenario("permanent", "the last step fails permanently; the two steps before it are compensated",
             lambda ids: {_key(o, _steps()[-1]): ["permanent"] for o in ids}),
)


@dataclass
class Snapshot:
    at: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> counter


class MeteredRun:
    """The local system with the meter in devhost and the Agent, our client in this process."""

    def __init__(self, work: Path, orders: int, log: Callable[[str], None]) -> None:
        from lab.system import LocalSystem, SystemConfig  # noqa: PLC0415

        self.work, self.orders, self.log = work, orders, log
        shim = work / "shim"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.count_dir = work / "counts"
        count_dir = self.count_dir
        root = str(Path(__file__).resolve().parent.parent)

        class System(LocalSystem):
            def _process(self, name: str, argv: list[str]) -> Any:
                proc = super()._process(name, argv)
                if name in ("devhost", "agent"):
                    path = os.pathsep.join([str(shim), root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                    proc.env = {**proc.env, "PYTHONPATH": path, COUNT_DIR_VARIABLE: str(count_dir)}
                return proc

        self.config = SystemConfig(work_dir=work / "system", seed=SEED, hang_seconds=HANG_SECONDS, settings=SETTINGS)
        self.system = System(self.config)
        self.client: Any = None
        self._seq = 0

    def start(self) -> None:
        METER.install()  # this process: the client's Service Bus calls
        self.system.start()
        env = self.system.env()
        from .compare_ours import OurClient  # noqa: PLC0415

        self.client = OurClient(self.config.bus_connection, env.get("OrdersQueueName", "orders-inbound"),
                                self.config.reply_queue, timeout_s=300.0)
        assert self.system.devhost and self.system.devhost.proc and self.system.agent and self.system.agent.proc
        self.pids = {"devhost": self.system.devhost.proc.pid, "agent": self.system.agent.proc.pid}

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.system.stop()

    def snapshot(self) -> Snapshot:
        self._seq = self._seq % 255 + 1
        counts = {role: compare_counts.request_dump(self.count_dir, pid, self._seq)["counts"]
                  for role, pid in self.pids.items()}
        counts["client"] = METER.snapshot()
        return Snapshot(time.monotonic(), counts)

    def script(self, faults: dict[str, list[str]]) -> None:
        assert self.system.simulator and self.system.simulator.url
        request = urllib.request.Request(f"{self.system.simulator.url}/script", data=json.dumps(faults).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()

    def states(self, prefix: str) -> list[tuple[str, int]]:
        """(ProcessState, attempt) of the prefix's state records, read from store.db directly (not through the
        metered adapters)."""
        conn = sqlite3.connect(f"file:{self.config.work_dir / 'store.db'}?mode=ro", uri=True, timeout=30)
        try:
            return [(s, int(a or 0)) for s, a in conn.execute(
                "SELECT json_extract(doc, '$.processState'), json_extract(doc, '$.attempt') FROM order_state "
                "WHERE id LIKE ? ESCAPE '\\'", (compare_counts._like(prefix),))]
        finally:
            conn.close()

    def settle(self, prefix: str, timeout: float = 120.0) -> None:
        """Until the prefix's records are terminal and its orchestrations finished, then a quiet second (late
        replies, notifications)."""
        from orderflow.records import TERMINAL_STATES  # noqa: PLC0415

        terminal = {s.value for s in TERMINAL_STATES}
        durable_db = self.config.work_dir / "devhost" / "durable.db"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states(prefix)
            if states and all(s in terminal for s, _ in states) and not compare_counts.durable_unfinished(
                    durable_db, prefix):
                break
            time.sleep(0.1)
        time.sleep(1.0)

    def doc_sizes(self) -> dict[str, float]:
        """Mean stored JSON size (bytes) per table, to check the 1 KB items the RU figures assume."""
        conn = sqlite3.connect(f"file:{self.config.work_dir / 'store.db'}?mode=ro", uri=True, timeout=30)
        try:
            out = {}
            for table in ("orders", "order_state", "checkpoints", "documents"):
                row = conn.execute(f"SELECT AVG(LENGTH(doc)), MAX(LENGTH(doc)) FROM {table}").fetchone()
                if row and row[0] is not None:
                    out[table] = {"mean_bytes": round(row[0]), "max_bytes": row[1]}
            return out
        finally:
            conn.close()


def _delta(after: Snapshot, before: Snapshot) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for role, now in after.counts.items():
        was = before.counts.get(role, {})
        out[role] = {k: v - was.get(k, 0) for k, v in now.items() if v - was.get(k, 0)}
    return out


def _ticks(delta: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    devhost = delta.get("devhost", {})
    return {name: float(devhost.get(key("fn", name, name, "exec"), 0)) for name in TIMER_FUNCTIONS}


def background(idle: Mapping[str, Mapping[str, int]], idle_s: float, env: Mapping[str, str]) -> dict[str, Any]:
    """The fixed cost: the timer triggers' work per tick (from the idle window) at the registry's schedules, and what
    the receivers' polling did per second (embedded broker; shown, not priced)."""
    from orderflow.settings import SETTINGS as REGISTRY  # noqa: PLC0415

    defaults = {s.name: s.default for s in REGISTRY}
    ticks = _ticks(idle)
    periods = {"starter_timer": seconds_of(defaults.get("StarterSchedule") or ""),
               "supervisor": seconds_of(defaults.get("SupervisorSchedule") or "")}
    per_tick: dict[str, dict[str, float]] = {}
    ru_per_s: Counter[str] = Counter()
    for name in TIMER_FUNCTIONS:
        if not ticks.get(name):
            continue
        counts = {k: v / ticks[name] for role in idle.values() for k, v in role.items() if split(k)[1] == name}
        ops = Counter({(split(k)[2], split(k)[3]): v for k, v in counts.items() if split(k)[0] == "cosmos"})
        items = Counter({(split(k)[2], split(k)[3]): v for k, v in counts.items() if split(k)[0] == "cosmos_items"})
        ru = cosmos_ru(ops, items)
        per_tick[name] = {"cosmos": _nested(ops), "ru": ru["total"],
                          "servicebus_operations": round(sum(v for k, v in counts.items() if split(k)[0] == "sb"), 3),
                          "period_s_registry": periods[name]}
        if periods[name]:
            for container, value in ru.items():
                if container != "total":
                    ru_per_s[database_of(container)] += value / periods[name]
    polling = {role: round(sum(v for k, v in counts.items() if split(k)[0] == "sb" and split(k)[1] not in
                               TIMER_FUNCTIONS) / idle_s, 3) for role, counts in idle.items()}
    return {
        "idle_window_s": round(idle_s, 1),
        "ticks_in_idle_window": ticks,
        "per_tick": per_tick,
        "cosmos_ru_per_s_by_database": {k: round(v, 4) for k, v in sorted(ru_per_s.items())},
        "executions_per_s": sum(1 / p for p in periods.values() if p),
        "servicebus_polling_ops_per_s_embedded": polling,
        "schedules": {"StarterSchedule": defaults.get("StarterSchedule"),
                      "SupervisorSchedule": defaults.get("SupervisorSchedule")},
    }


def run(orders: int, idle_s: float, keep: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    work = keep or Path(tempfile.mkdtemp(prefix="azure-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    measured = MeteredRun(work, orders, log)
    results: dict[str, Any] = {}
    windows: dict[str, tuple[dict[str, dict[str, int]], float, dict[str, Any]]] = {}
    started = time.monotonic()
    try:
        measured.start()
        log(f"system up in {time.monotonic() - started:.0f} s ({work})")
        measured.client.handle({"cmd": "sequential", "prefix": "warm", "n": 3})
        measured.settle("warm")
        before = measured.snapshot()
        time.sleep(idle_s)
        after = measured.snapshot()
        idle, idle_span = _delta(after, before), after.at - before.at
        for scenario in SCENARIOS:
            prefix = f"ac-{scenario.name}"
            from .compare_proto import orders_for  # noqa: PLC0415

            ids = [o.order_id for o in orders_for(prefix, orders, measured.config.reply_queue)]
            faults = scenario.script(ids)
            if faults:
                measured.script(faults)
            before = measured.snapshot()
            answer = measured.client.handle({"cmd": "burst", "prefix": prefix, "n": orders})
            measured.settle(prefix)
            after = measured.snapshot()
            states = measured.states(prefix)
            windows[scenario.name] = (_delta(after, before), after.at - before.at, {
                "answer": answer, "states": dict(Counter(s for s, _ in states)),
                "attempts_per_order": round(sum(a for _, a in states) / max(1, len(states)), 3)})
            log(f"{scenario.name}: {answer['terminal']}/{orders} terminal {answer['outcomes']}, "
                f"{after.at - before.at:.1f} s")
        sizes = measured.doc_sizes()
        env = measured.system.env()
    finally:
        measured.stop()
    durable_db = measured.config.work_dir / "devhost" / "durable.db"
    idle_ticks = _ticks(idle)
    for name, (delta, span, facts) in windows.items():
        ticks = _ticks(delta)
        per_role = {role: per_order(counts, idle.get(role, {}), idle_span, idle_ticks, span, ticks, orders)
                    for role, counts in delta.items()}
        durable = compare_counts.durable_counts(durable_db, f"ac-{name}")
        each = {k: round(v / orders, 3) for k, v in durable.items() if isinstance(v, int | float)}
        each["history_events_by_type"] = {k: round(v / orders, 3) for k, v in durable["history_events_by_type"].items()}
        results[name] = {"orders": orders, "window_s": round(span, 1), "timer_ticks_in_window": ticks,
                         "outcomes": facts["answer"]["outcomes"], "terminal": facts["answer"]["terminal"],
                         "states": facts["states"], "attempts_per_order": facts["attempts_per_order"],
                         **summarize(per_role, each)}
    fixed = background(idle, idle_span, env)
    happy = results["happy"]
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "azure_cost",
        "params": {"orders_per_scenario": orders, "idle_window_s": idle_s, "settings": SETTINGS,
                   "hang_seconds": HANG_SECONDS, "seed": SEED, "month_s": MONTH_S, "rates": list(RATES)},
        "scenarios": {s.name: s.what for s in SCENARIOS},
        "per_order": results,
        "per_recovery": {name: subtract(_numbers(results[name]), _numbers(happy)) for name in results
                         if name != "happy"},
        "background": fixed,
        "doc_sizes": sizes,
        "monthly": [monthly(happy, fixed, rate) for rate in RATES],
        "servicebus_namespace": {name: namespace_capacity(r) for name, r in results.items()},
        "dts_consumption_max_orders_per_s": round(DTS_CONSUMPTION_MAX_ACTIONS_S / happy["durable"]["dts_actions"], 1),
        "ru_rules": RU_RULES, "ru_per_item_returned": RU_PER_ITEM_RETURNED,
        "prices": {k: vars(p) for k, p in PRICES.items()},
        "sources": {k: {**vars(s), "read_on": READ_ON} for k, s in SOURCES.items()},
        "run_s": round(time.monotonic() - started, 1),
    }


def _numbers(result: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("cosmos", "servicebus", "functions", "durable", "attempts_per_order")
    return {k: result[k] for k in keep if k in result}


# --- output ------------------------------------------------------------------------------------------------------
def _n(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "not found"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"


def per_order_table(doc: Mapping[str, Any]) -> str:
    rows = [("Cosmos DB operations", lambda r: _n(r["cosmos"]["operations"])),
            ("  point reads", lambda r: _n(_sum_op(r, "point_read"))),
            ("  creates", lambda r: _n(_sum_op(r, "create"))),
            ("  replaces (If-Match)", lambda r: _n(_sum_op(r, "replace"))),
            ("  upserts / deletes (recovery index)", lambda r: f"{_n(_sum_op(r, 'upsert'))} / "
                                                               f"{_n(_sum_op(r, 'delete'))}"),
            ("  queries (1 partition / cross-partition / counts)",
             lambda r: " / ".join(_n(_sum_op(r, k)) for k in QUERY_KINDS)),
            ("Cosmos DB RU (estimate)", lambda r: _n(r["cosmos"]["ru"], 1)),
            ("Service Bus operations (devhost + Agent)", lambda r: _n(r["servicebus"]["operations"])),
            ("  of which found nothing", lambda r: _n(sum(r["servicebus"]["empty"].values()))),
            ("  messages sent / received", lambda r: f"{_n(r['servicebus']['messages_sent'])} / "
                                                    f"{_n(r['servicebus']['messages_received'])}"),
            ("Service Bus operations of the client app", lambda r: _n(r["servicebus"]["client"]["operations"])),
            ("Function executions (triggers + episodes + activities)", lambda r: _n(r["functions"]["executions"])),
            ("Durable instances / activities / episodes / history events",
             lambda r: " / ".join(_n(r["durable"][k]) for k in ("instances", "activities", "episodes",
                                                               "history_events"))),
            ("Durable Task Scheduler actions", lambda r: _n(r["durable"]["dts_actions"])),
            ("Azure Storage transactions (Durable Azure Storage backend, our model)",
             lambda r: _n(r["durable"]["azure_storage_transactions_model"]))]
    names = list(doc["per_order"])
    lines = ["| per order | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, get in rows:
        lines.append(f"| {label} | " + " | ".join(get(doc["per_order"][n]) for n in names) + " |")
    return "\n".join(lines)


def recovery_table(doc: Mapping[str, Any]) -> str:
    """What one recovery adds to an order: the scenario's figures minus the happy path's."""
    rows = [("Cosmos DB operations", ("cosmos", "operations")), ("Cosmos DB RU (estimate)", ("cosmos", "ru")),
            ("Service Bus operations (devhost + Agent)", ("servicebus", "operations")),
            ("Service Bus messages sent", ("servicebus", "messages_sent")),
            ("Function executions", ("functions", "executions")), ("Durable instances", ("durable", "instances")),
            ("Durable episodes", ("durable", "episodes")), ("Durable history events", ("durable", "history_events")),
            ("Durable Task Scheduler actions", ("durable", "dts_actions")),
            ("Azure Storage transactions (model)", ("durable", "azure_storage_transactions_model"))]
    names = list(doc["per_recovery"])
    lines = ["| one recovery adds | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, (part, field_) in rows:
        lines.append(f"| {label} | " + " | ".join(_n(doc["per_recovery"][n][part][field_]) for n in names) + " |")
    return "\n".join(lines)


def namespace_table(doc: Mapping[str, Any]) -> str:
    lines = ["| one Standard namespace (1,000 credits/s) | credits per order | most orders/s |", "|---|---|---|"]
    cap = doc["servicebus_namespace"]["happy"]
    for label, k in (("data operations only (1 credit per message)", "messages_only"),
                     ("calls that moved or settled a message", "calls_without_empty"), ("every API call", "all_calls")):
        lines.append(f"| {label} | {_n(cap['credits_per_order'][k])} | {_n(cap['max_orders_per_s'][k], 1)} |")
    return "\n".join(lines)


def _sum_op(result: Mapping[str, Any], op: str) -> float:
    return sum(ops.get(op, 0) for ops in result["cosmos"]["by_container"].values())


def monthly_table(doc: Mapping[str, Any]) -> str:
    lines = ["| orders/s | Cosmos RU/month | Cosmos serverless | Cosmos manual (RU/s) | Cosmos autoscale (Tmax) | "
             "Service Bus ops/month | SB credits/s (messages / all calls) | fits 1 namespace | SB (Azure China, CNY) | "
             "Durable episodes/month (Azure Storage tx, model) | DTS actions/s (Dedicated CUs; Consumption fits) | "
             "Function executions/month |",
             "|---" * 12 + "|"]
    for m in doc["monthly"]:
        c, s, d = m["cosmos"], m["servicebus"], m["durable"]
        manual = " + ".join(f"{p['manual_rus']:.0f}" for p in c["provisioned_by_database"].values())
        tmax = " + ".join(f"{p['autoscale_tmax']:.0f}" for p in c["provisioned_by_database"].values())
        lines.append(
            f"| {m['orders_per_s']} | {c['ru_per_month'] / 1e6:,.1f} M | ${c['serverless_usd']:,.2f}"
            f"{'' if c['serverless_fits_one_partition'] else ' (over 5,000 RU/s in a container)'} | "
            f"${c['manual_usd']:,.2f} ({manual}) | ${c['autoscale_usd']:,.2f} ({tmax}) | "
            f"{s['operations_per_month'] / 1e6:,.1f} M (+{s['client_operations_per_month'] / 1e6:,.1f} M client) | "
            f"{s['credits_per_s_messages']:,.0f} / {s['credits_per_s_all_calls']:,.0f} | "
            f"{_n(s['fits_one_namespace_messages_only'])} / {_n(s['fits_one_namespace'])} | "
            f"¥{s['cny_azure_china']:,.0f} | {d['episodes_per_month'] / 1e6:,.1f} M "
            f"({d['azure_storage_transactions_per_month_model'] / 1e6:,.0f} M) | "
            f"{d['dts_actions_per_s']:,.0f} ({d['dts_dedicated_cus']}; {_n(d['dts_consumption_fits'])}) | "
            f"{m['functions']['executions_per_month'] / 1e6:,.1f} M |")
    return "\n".join(lines)


def markdown(doc: Mapping[str, Any]) -> str:
    sources = "\n".join(f"- `{k}`: {s['url']} (read {s['read_on']}): \"{s['says']}\"" + (f" ({s['note']})"
                                                                                          if s['note'] else "")
                        for k, s in doc["sources"].items())
    return (f"# Cost per order on Azure (generated by `python -m benchmarks azure_cost`)\n\n"
            f"{doc['params']['orders_per_scenario']} orders per scenario, run {doc.get('measured_at', '')}. "
            "See docs/cost.md for how each figure is counted and priced.\n\n"
            f"## Per order\n\n{per_order_table(doc)}\n\n"
            f"## Per recovery (scenario minus happy path)\n\n{recovery_table(doc)}\n\n"
            f"## Service Bus: orders/s one Standard namespace carries (happy path, with the client app)\n\n"
            f"{namespace_table(doc)}\n\n"
            f"## Monthly, happy path (USD unless marked; 'not found' = no price in the stored docs)\n\n"
            f"{monthly_table(doc)}\n\n"
            "Service Bus, Durable Task Scheduler, Azure Storage and Flex Consumption prices in USD were not found in "
            "the stored docs; their quantities are above.\n\n## Sources\n\n" + sources + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks azure_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orders", type=int, default=10, help="orders per scenario (default 10)")
    p.add_argument("--idle-seconds", type=float, default=15.0, help="idle window for the background (default 15)")
    p.add_argument("--json", action="store_true", help="print the result document as the last line")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                   help="folder for azure_cost.json and azure_cost.md (default benchmarks/results)")
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (logs, stores, counts)")
    args = p.parse_args(argv)
    if args.orders < 1:
        p.error("--orders must be at least 1")
    from .common import environment  # noqa: PLC0415

    doc = run(args.orders, args.idle_seconds, args.keep, lambda line: print(line, file=sys.stderr, flush=True))
    doc["environment"] = environment()
    doc["measured_at"] = doc["environment"]["measured_at"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "azure_cost.json").write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    (args.out / "azure_cost.md").write_text(markdown(doc))
    for table in (per_order_table(doc), recovery_table(doc), namespace_table(doc), monthly_table(doc)):
        print(table)
        print()
    if args.json:
        print(json.dumps(doc, separators=(",", ":")))
    return 0


@contextmanager
def metered() -> Iterator[Meter]:
    """A fresh Meter whose patches are undone on exit (for tests)."""
    meter = Meter()
    try:
        yield meter
    finally:
        meter.restore()


if __name__ == "__main__":
    sys.exit(main())
