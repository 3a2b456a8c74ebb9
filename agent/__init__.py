"""The Agent worker: its own process (`python -m agent`), the SAS pattern's Agent for the order steps.

It receives `AgentRequest`s from the session-enabled `agent-requests` queue, calls the remote service with
retries inside each request's deadline (same idempotency key on every retry), each call through the circuit
breaker shared by every Agent instance (`orderflow.breaker`), and sends an `AgentReply` to `agent-replies`.
Modules: `config` (settings and flags), `worker` (session receive loop; opens the breaker), `handler`
(one request, receipt to settlement; breaker alerts), `request_parsing` (edge validation), `retry`
(deadline-bounded backoff, asking the breaker before each call), `remote` (the HTTP call), `errors` (the
transient/permanent classifier). The remote-service simulator and the drills' fault switches are the lab's
(`lab/simulator.py`, `lab/agent_faults.py`: `python -m lab agent`); the deployed Agent has neither.

Circuit breaker: a request the breaker refuses before any call is answered at once, without calling: failed,
permanent false, errorCode `CircuitOpen`, result `{"retryAfterSeconds": ...}` (the Scheduler defers the order, its
FailureCount untouched). Once a call was made, a refusal only stops the retries: an ordinary transient failure
(`RetriesExhausted`, last error). Calls the remote answered (success or permanent failure) count as healthy;
transient ones (5xx, 408, 429, timeouts, connection errors) count towards opening it. Opening and closing raise
`CircuitOpened` / `CircuitClosed` alerts on operator-alerts. If the breaker's store cannot be reached, calls go
through (logged).

On Azure, raise AGENT_RECEIVE_WAIT_MS (e.g. 5000-30000): a held session is released after that idle wait, and each
session taken anew opens an AMQP link (one wait for a session at a time, however many slots are free: `worker`).

App settings (environment variables; every one can be overridden by the flag in `python -m agent --help`):

| setting | default | meaning |
|---|---|---|
| ServiceBusConnection | — | connection string; `Endpoint=embedded://<sqlite>;ConfigFile=<json>` = embedded |
| ServiceBusConnection__fullyQualifiedNamespace | — | Azure, identity-based (AZURE_CLIENT_ID = the identity) |
| AgentRequestsQueueName | agent-requests | session queue the Agent receives from |
| AgentRepliesQueueName | agent-replies | session queue the Agent replies on (a request's replyTo names it) |
| OperatorAlertsQueueName | operator-alerts | queue of `OperatorAlert`s (poison requests, breaker open/closed) |
| CosmosDb__accountEndpoint | — | store of the breaker documents (`embedded://PATH`); needed unless the breaker is off |
| CosmosDb__clientId | — | Azure: client id of the identity used for Cosmos (else AZURE_CLIENT_ID) |
| StateDatabaseName | state | Cosmos database of the breaker documents' container |
| CircuitBreakerContainerName | circuitBreakers | container of the breaker documents (one per remote service) |
| RemoteServiceName | fulfilment | the remote service's name = its breaker document's id |
| CircuitBreakerFailureThreshold | 10 | failed requests in the window (all Agents) that open it; `0` = off, no store |
| CircuitBreakerWindowSeconds | 30 | rolling window of that count |
| CircuitBreakerCooldownSeconds | 15 | open → half-open after this; doubled after each failed probe |
| CircuitBreakerMaxCooldownSeconds | 300 | cap of the cool-down |
| CircuitBreakerProbes | 2 | calls let through while half-open |
| AGENT_REMOTE_URL | http://127.0.0.1:8765 | base URL of the remote service (`POST /steps/{step}`) |
| AGENT_MAX_CONCURRENT_SESSIONS | 8 | sessions (orders) handled at once; FIFO within each |
| AGENT_MAX_RETRIES | 4 | retries after the first call, all inside the deadline |
| AGENT_BACKOFF_BASE_MS | 100 | base of the exponential backoff (equal jitter, seeded) |
| AGENT_BACKOFF_MAX_MS | 5000 | cap of one backoff delay |
| AGENT_CALL_TIMEOUT_MS | 30000 | cap of one call's timeout (also bounded by the time left to the deadline) |
| AGENT_JITTER_SEED | 0 | seed of the jitter (reproducible runs) |
| AGENT_RECEIVE_WAIT_MS | 1000 | wait for a session / message before an idle session is released |
| AGENT_SHUTDOWN_GRACE_MS | 10000 | on SIGTERM/SIGINT, time in-flight requests get to finish |

The `AGENT_*` settings are declared in `agent.config.AGENT_SETTINGS` (same `Setting` form as the registry); the
others come from the registry in `orderflow.settings` (the breaker's have no command-line flags). With the breaker on
and no `CosmosDb__accountEndpoint`, the Agent refuses to start: a breaker each instance kept to itself would not be
the shared one.
"""
