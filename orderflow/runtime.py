"""Process-wide services for the Functions entry points: stores, the bus client, the clock and the tunables.

Built lazily from app settings on first use in the running event loop (aio clients are bound to a loop) and
replaceable in tests with `use_services`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from orderflow import settings
from orderflow.apps import SubmittingApps
from orderflow.clock import Clock, SystemClock
from orderflow.ports import BusClient, DocumentStore, OrdersDb, RecoveryIndex, StateStore
from orderflow.retry_budget import RetryBudget
from orderflow.state_machine import Backoff, exponential_backoff

if TYPE_CHECKING:
    from orderflow.azure.queue_counts import ArmQueueCounts

SCAN_MODES = ("query", "index")


def scan_mode(value: str) -> str:
    if value not in SCAN_MODES:
        raise ValueError(f"app setting SupervisorScanMode must be one of {', '.join(SCAN_MODES)}, got {value!r}")
    return value


def submitting_apps(env: Mapping[str, str] | None = None) -> SubmittingApps:
    """SubmittingApps, LegacyOrdersApp, MaxPendingOrders and MaxPendingOrdersPerApp (orderflow/apps.py)."""
    bound = settings.get_int("MaxPendingOrders", env)
    if bound <= 0:
        raise ValueError(f"app setting MaxPendingOrders must be positive, got {bound}")
    return SubmittingApps.parse(
        settings.get("SubmittingApps", env) or "",
        settings.get("LegacyOrdersApp", env) or "",
        bound,
        settings.get("MaxPendingOrdersPerApp", env) or "",
    )


def _finished_ttl(env: Mapping[str, str] | None) -> int | None:
    value = settings.get_int("FinishedOrderRetentionSeconds", env)
    if value < 0:
        raise ValueError(f"app setting FinishedOrderRetentionSeconds must be 0 (forever) or more, got {value}")
    return value or None


@dataclass(frozen=True)
class Tunables:
    """Every tunable, from app settings (defaults documented in orderflow.settings)."""

    orders_queue: str
    agent_requests_queue: str
    agent_replies_queue: str
    alerts_queue: str
    apps: SubmittingApps  # SubmittingApps, LegacyOrdersApp and each app's MaxPendingOrders (orderflow/apps.py)
    step_timeout: timedelta
    claim_lease: timedelta
    starter_batch: int
    scan_window: timedelta
    page_size: int
    max_results: int
    failure_threshold: int
    agent_retries: int  # per request, fitted to the retry budget (orderflow/retry_budget.py)
    max_in_processing: int  # admission: the Starter claims no order while this many are Processing
    remote_service: str  # the id of the remote service's circuit-breaker document
    scan_mode: str  # the Supervisor's: "query" or "index" (the recovery index, orderflow/recovery_index.py)
    backoff: Backoff = field(compare=False)
    # FinishedOrderRetentionSeconds: the TTL a finished order's documents get (orderflow/retention.py); None: forever.
    finished_ttl: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tunables:
        def s(name: str) -> str:
            value = settings.get(name, env)
            assert value is not None, name
            return value

        def i(name: str) -> int:
            value = settings.get_int(name, env)
            if value <= 0:
                raise ValueError(f"app setting {name} must be positive, got {value}")
            return value

        return cls(
            orders_queue=s("OrdersQueueName"),
            agent_requests_queue=s("AgentRequestsQueueName"),
            agent_replies_queue=s("AgentRepliesQueueName"),
            alerts_queue=s("OperatorAlertsQueueName"),
            apps=submitting_apps(env),
            step_timeout=timedelta(seconds=i("StepTimeoutSeconds")),
            claim_lease=timedelta(seconds=i("ClaimLeaseSeconds")),
            starter_batch=i("StarterBatchSize"),
            scan_window=timedelta(seconds=i("SupervisorScanWindowSeconds")),
            page_size=i("SupervisorPageSize"),
            max_results=i("SupervisorMaxResults"),
            failure_threshold=i("FailureThreshold"),
            agent_retries=RetryBudget.from_env(env).request_retries(),
            max_in_processing=i("MaxOrdersInProcessing"),
            remote_service=s("RemoteServiceName"),
            scan_mode=scan_mode(s("SupervisorScanMode")),
            backoff=exponential_backoff(float(i("RetryBackoffBaseSeconds")), float(i("RetryBackoffMaxSeconds"))),
            finished_ttl=_finished_ttl(env),
        )

    def internal_queues(self) -> frozenset[str]:
        """The pipeline's own queues, every app's inbound queue among them: never a reply queue."""
        shared = frozenset({self.orders_queue, self.agent_requests_queue, self.agent_replies_queue, self.alerts_queue})
        return shared | self.apps.inbound_queues()

    @property
    def allowed_reply_queues(self) -> frozenset[str]:
        """Every app's status queue (an order may name only its own app's: orderflow/submission.py)."""
        return self.apps.status_queues()


@dataclass
class Services:
    orders: OrdersDb
    state: StateStore
    bus: BusClient  # azure.servicebus.aio.ServiceBusClient or the embedded broker's aio client
    tunables: Tunables
    clock: Clock = field(default_factory=SystemClock)
    # The circuit-breaker documents (read by the Starter); None: no breaker (tests that do not need one).
    breakers: DocumentStore | None = None
    # Admission: this process's acceptances since the backlog figure it last read (orderflow/admission.py).
    backlog: Any = None
    # One admission-document write at a time in this process (orderflow/admission.py).
    admission_lock: asyncio.Lock | None = None
    admission_waiting: list[Any] | None = None  # orderflow/admission.py: requests for the next write
    # The recovery index, in SupervisorScanMode `index` only: written with every CompleteBy change, read by the
    # Supervisor (after a switch from `query`, once it covers every order in flight: supervisor.reads_index). None:
    # not written (query mode: no write that the scan does not read).
    index: RecoveryIndex | None = None
    # Queue runtime counts from Azure Resource Manager (orderflow/azure/queue_counts.py, ServiceBusNamespaceResourceId):
    # the ops summary's dead-letter depths. None: the summary peeks them on the bus.
    queue_counts: ArmQueueCounts | None = None


_services: dict[int, Services] = {}
_lock = asyncio.Lock()


async def get_services() -> Services:
    """The services of the running event loop, built from app settings on first use."""
    loop_id = id(asyncio.get_running_loop())
    if loop_id not in _services:
        from orderflow.adapters import (
            aio_bus_from_settings,
            open_breaker_documents,
            open_recovery_index,
            open_stores,
        )
        from orderflow.azure import queue_counts

        orders, state = open_stores(os.environ)
        tunables = Tunables.from_env()
        _services[loop_id] = Services(
            orders=orders,
            state=state,
            bus=aio_bus_from_settings(os.environ),
            tunables=tunables,
            breakers=open_breaker_documents(os.environ),
            index=open_recovery_index(os.environ) if tunables.scan_mode == "index" else None,
            queue_counts=queue_counts.from_settings(os.environ),
        )
    return _services[loop_id]


def use_services(services: Services) -> None:
    """Install services for the running loop (tests, the demo)."""
    _services[id(asyncio.get_running_loop())] = services


def reset_services() -> None:
    _services.clear()
