"""App settings: the one registry of every setting the code reads, with its documented default.

Every tunable is an app setting (environment variable in Azure and in devhost, `Values` in
local.settings.json). `SETTINGS` is the single source of truth: the docs, local.settings.sample.json and the
Bicep app settings are checked against it by the test suite.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    doc: str


# Connection *names* used by bindings (`connection="ServiceBusConnection"`). In Azure these are identity-based:
# ServiceBusConnection__fullyQualifiedNamespace; locally a connection string for the embedded broker.
SERVICE_BUS_CONNECTION = "ServiceBusConnection"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "ServiceBusConnection__fullyQualifiedNamespace",
        None,
        "Service Bus namespace host (identity-based connection, Azure).",
    ),
    Setting(
        "ServiceBusNamespaceResourceId",
        None,
        "Azure: ARM resource id of the Service Bus namespace; the ops summary reads each queue's exact "
        "dead-letter depth from its runtime counts (Reader on the queue). Unset: the depth is peeked.",
    ),
    Setting(
        "ServiceBusConnection",
        None,
        "Local only: connection string; `Endpoint=embedded://...` selects the embedded broker.",
    ),
    Setting(
        "CosmosDb__accountEndpoint",
        None,
        "Cosmos DB account endpoint (identity-based). `embedded://PATH` selects the embedded SQLite store.",
    ),
    Setting("CosmosDb__credential", "managedidentity", "Credential kind for the Cosmos connection."),
    Setting("CosmosDb__clientId", None, "Client id of the user-assigned identity (Azure)."),
    Setting("AZURE_CLIENT_ID", None, "Client id of the user-assigned identity for azure-identity."),
    Setting(
        "OrdersQueueName",
        "orders-inbound",
        "The shared session-enabled inbound queue of before per-app queues: read for LegacyOrdersApp only.",
    ),
    Setting("AgentRequestsQueueName", "agent-requests", "Session-enabled queue the Scheduler sends Agent requests to."),
    Setting("AgentRepliesQueueName", "agent-replies", "Session-enabled queue the Agent replies on."),
    Setting("OperatorAlertsQueueName", "operator-alerts", "Queue for operator alerts."),
    Setting(
        "SubmittingApps",
        "app",
        "Comma-separated names of the submitting apps (1-24 of a-z 0-9 -, starting with a letter). App `<name>` "
        "sends to its own inbound queue `<name>-orders` (read by the function `submission-<name>`) and receives "
        "every status of its orders on `<name>-status`; its orders are its own (orderflow/apps.py).",
    ),
    Setting(
        "LegacyOrdersApp",
        "app",
        "The app that owned every order before per-app queues: what arrives on the shared OrdersQueueName queue "
        "is its, and its order ids stay unscoped in the stores, so its existing records and in-flight orders keep "
        "matching. `none`: no legacy app, the shared queue is not read.",
    ),
    Setting("OrdersDatabaseName", "orders", "Cosmos database holding the immutable orders."),
    Setting("OrdersContainerName", "orders", "Container of orders (partition key /orderId)."),
    Setting("StateDatabaseName", "state", "Cosmos database of the state store."),
    Setting("StateContainerName", "orderState", "Container of order state records (partition key /orderId)."),
    Setting("CheckpointContainerName", "supervisorCheckpoints", "Container of the Supervisor's scan checkpoint."),
    Setting("StepTimeoutSeconds", "30", "CompleteBy for one Agent step, from when the Scheduler sends it."),
    Setting("ClaimLeaseSeconds", "60", "CompleteBy lease a Starter claim holds until the Scheduler sets its own."),
    Setting("StarterSchedule", "*/15 * * * * *", "NCRONTAB of the Starter's safety-net poll."),
    Setting("StarterBatchSize", "50", "Most Pending records one Starter run claims."),
    Setting("SupervisorSchedule", "*/10 * * * * *", "NCRONTAB of the Supervisor."),
    Setting("SupervisorScanWindowSeconds", "3600", "Width of one bounded CompleteBy window the Supervisor scans."),
    Setting("SupervisorPageSize", "100", "Page size of the Supervisor's query (continuation-token paging)."),
    Setting("SupervisorMaxResults", "500", "Most expired records one Supervisor run recovers."),
    Setting("FailureThreshold", "3", "FailureCount at which the Supervisor moves a record to Error."),
    Setting(
        "AgentRetriesPerStep",
        "4",
        "Retries the Scheduler allows the Agent per request (carried in the request; the Agent uses the lower "
        "of this and its own AGENT_MAX_RETRIES).",
    ),
    Setting("RetryBackoffBaseSeconds", "2", "Base of the exponential backoff before a recovered order is retried."),
    Setting("RetryBackoffMaxSeconds", "300", "Cap of that backoff."),
    Setting(
        "RemoteCallBudgetPerStep",
        "75",
        "Most remote calls one order step may cause over all its attempts (the retry budget the Scheduler "
        "owns): calls per Agent request x AgentRequestsMaxDeliveryCount x FailureThreshold must not exceed it.",
    ),
    Setting(
        "AgentRequestsMaxDeliveryCount",
        "5",
        "MaxDeliveryCount of the agent-requests queue (a redelivered request calls the remote again); must "
        "equal the queue's property, for the retry budget.",
    ),
    Setting(
        "CircuitBreakerFailureThreshold",
        "10",
        "Failed Agent requests (every call failed transiently) within the window, over every Agent instance, "
        "that open the circuit breaker; 0 turns the breaker off.",
    ),
    Setting("CircuitBreakerWindowSeconds", "30", "Rolling window in which the breaker counts failed requests."),
    Setting(
        "CircuitBreakerCooldownSeconds",
        "15",
        "Open time before the breaker lets probes through (half-open); doubled after each failed probe.",
    ),
    Setting("CircuitBreakerMaxCooldownSeconds", "300", "Cap of the breaker's cool-down."),
    Setting("CircuitBreakerProbes", "2", "Calls the half-open breaker lets through to test the remote service."),
    Setting(
        "CircuitBreakerContainerName",
        "circuitBreakers",
        "Container (state database, partition key /id) of the circuit-breaker documents, one per remote service.",
    ),
    Setting(
        "RemoteServiceName",
        "fulfilment",
        "Name of the remote service the Agent calls for every step: the id of its circuit-breaker document.",
    ),
    Setting(
        "MaxOrdersInProcessing", "100", "Admission bound: the Starter claims no order while this many are Processing."
    ),
    Setting(
        "SupervisorScanMode",
        "query",
        "How the Supervisor finds expired work: `query` (a cross-partition CompleteBy query of the state "
        "container) or `index` (single-partition queries of the recovery index, one per CompleteBy time bucket, "
        "each hit verified against the state record). Only `index` writes the index (every CompleteBy change); "
        "after a switch from `query` the Supervisor reads by query until the index covers every order in flight.",
    ),
    Setting(
        "RecoveryIndexContainerName",
        "recoveryIndex",
        "Container (state database, partition key /bucket) of the recovery index.",
    ),
    Setting("RecoveryIndexBucketSeconds", "300", "Width of one recovery-index partition: a CompleteBy time bucket."),
    Setting(
        "MaxPendingOrders",
        "5000",
        "Admission bound, per submitting app: past this Pending backlog of its own a new order of the app is "
        "answered `rejected` (`backlog full`) and nothing is written; another app's backlog never counts.",
    ),
    Setting(
        "WEBSITE_AUTH_ENABLED",
        None,
        "Set by App Service when authentication (Easy Auth) is on; the operator API trusts X-MS-CLIENT-PRINCIPAL "
        "only then. Locally devhost's Easy Auth stand-in reads it (`True`); leave it unset under `func start`, "
        "which has no authentication in front of the app.",
    ),
    Setting(
        "OperatorAppRole",
        "Orders.Operator",
        "The Entra ID app role every operator route requires of the signed-in caller (App Service "
        "authentication's X-MS-CLIENT-PRINCIPAL `roles` claim), on top of the function key.",
    ),
    Setting(
        "MaxPendingOrdersPerApp",
        "",
        "Per-app sizes of that bound, `<app>=<N>,...` (e.g. `app=5000,partner=200`); an app not named gets "
        "MaxPendingOrders.",
    ),
    Setting(
        "FinishedOrderRetentionSeconds",
        "7776000",
        "How long a finished order (terminal and notified) is kept: its state record and its stored order get this "
        "Cosmos DB TTL when its terminal status is sent (90 days by default; an unfinished record never has one). "
        "0 keeps finished orders forever. `orderflow keep KEY` exempts one order.",
    ),
    Setting(
        "InstanceRetentionSeconds",
        "2592000",
        "How long the Durable instances (history) of finished attempts are kept: the purge timer deletes Completed, "
        "Failed and Terminated instances created before now minus this (30 days by default). 0 never purges.",
    ),
    Setting("PurgeSchedule", "0 */5 * * * *", "NCRONTAB of the timer that purges finished Durable instances."),
    Setting(
        "PurgeWindowSeconds",
        "3600",
        "Created-time window of one purge call (`purge_instance_history_by`); it doubles over empty stretches "
        "and halves after a call that deleted more than PurgeMaxInstancesPerCall.",
    ),
    Setting("PurgeMaxInstancesPerCall", "500", "Instances one purge call should delete at most (the window adapts)."),
    Setting("PurgeMaxCallsPerRun", "8", "Most purge calls one run of the purge timer makes: the bound per run."),
    Setting("AlarmSchedule", "0 * * * * *", "NCRONTAB of the timer that computes the alarms (orderflow/alarms.py)."),
    Setting(
        "BacklogGrowthAlarmOrders",
        "100",
        "The backlog-growth alarm fires when the Pending backlog grew by more than this many orders over "
        "BacklogGrowthWindowSeconds.",
    ),
    Setting("BacklogGrowthWindowSeconds", "900", "The window over which the backlog's growth is measured."),
    Setting(
        "SenderDeadLetterAlarmDepth",
        "20",
        "Dead letters on a sender's queue (an app's inbound or status queue, orders-inbound) above which the "
        "dead-letters alarm fires; on a system queue any dead letter fires it.",
    ),
)

SETTING_NAMES = frozenset(s.name for s in SETTINGS)
_DEFAULTS = {s.name: s.default for s in SETTINGS}


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Read a registered setting (unknown names are a programming error)."""
    if name not in SETTING_NAMES:
        raise KeyError(f"unregistered app setting {name!r}; add it to orderflow.settings.SETTINGS")
    source = os.environ if env is None else env
    value = source.get(name)
    return value if value not in (None, "") else _DEFAULTS[name]


def get_int(name: str, env: Mapping[str, str] | None = None) -> int:
    value = get(name, env)
    if value is None:
        raise KeyError(f"app setting {name!r} has no value and no default")
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"app setting {name!r} must be an integer, got {value!r}") from exc
