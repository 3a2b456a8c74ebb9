"""The Agent worker: its own process (`python -m agent`), the SAS pattern's Agent for the order steps.

It receives `AgentRequest`s from the session-enabled `agent-requests` queue, calls the remote service with
retries inside each request's deadline (same idempotency key on every retry), and sends an `AgentReply` to
`agent-replies`. Modules: `config` (settings and flags), `worker` (session receive loop), `handler`
(one request, receipt to settlement), `request_parsing` (edge validation), `retry` (deadline-bounded
backoff), `remote` (the HTTP call; circuit-breaker hook point), `errors` (the transient/permanent
classifier), `simulator` (the remote service stand-in, `python -m agent.simulator`).

On Azure, raise AGENT_RECEIVE_WAIT_MS (e.g. 5000-30000): each wait for a session opens an AMQP link, and
the wait also bounds how long a stop request waits for an idle slot.

App settings (environment variables; every one can be overridden by the flag in `python -m agent --help`):

| setting | default | meaning |
|---|---|---|
| ServiceBusConnection | — | connection string; `Endpoint=embedded://<sqlite>;ConfigFile=<json>` = embedded |
| ServiceBusConnection__fullyQualifiedNamespace | — | Azure, identity-based (AZURE_CLIENT_ID = the identity) |
| AgentRequestsQueueName | agent-requests | session queue the Agent receives from |
| AgentRepliesQueueName | agent-replies | session queue the Agent replies on (a request's replyTo names it) |
| OperatorAlertsQueueName | operator-alerts | queue of `OperatorAlert`s (poison requests) |
| AGENT_REMOTE_URL | http://127.0.0.1:8765 | base URL of the remote service (`POST /steps/{step}`) |
| AGENT_MAX_CONCURRENT_SESSIONS | 8 | sessions (orders) handled at once; FIFO within each |
| AGENT_MAX_RETRIES | 4 | retries after the first call, all inside the deadline |
| AGENT_BACKOFF_BASE_MS | 100 | base of the exponential backoff (equal jitter, seeded) |
| AGENT_BACKOFF_MAX_MS | 5000 | cap of one backoff delay |
| AGENT_CALL_TIMEOUT_MS | 30000 | cap of one call's timeout (also bounded by the time left to the deadline) |
| AGENT_JITTER_SEED | 0 | seed of the jitter (reproducible runs) |
| AGENT_RECEIVE_WAIT_MS | 1000 | wait for a session / message before an idle session is released |
| AGENT_SHUTDOWN_GRACE_MS | 10000 | on SIGTERM/SIGINT, time in-flight requests get to finish |

The `AGENT_*` settings are declared in `agent.config.AGENT_SETTINGS` (same `Setting` form as the registry).
"""
