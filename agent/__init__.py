"""The Agent worker: its own process (`python -m agent`), the SAS pattern's Agent for the order steps.

It receives `AgentRequest`s from the session-enabled `agent-requests` queue, calls the remote service with retries
inside each request's deadline (one idempotency key for every retry), each call through the circuit breaker every
Agent instance shares (`orderflow.breaker`), and sends an `AgentReply` to `agent-replies`. Modules: `config`
(settings and flags), `worker` (the session receive loop), `handler` (one request, receipt to settlement),
`request_parsing` (edge validation), `retry` (deadline-bounded backoff), `remote` (the HTTP call), `errors` (the
transient/permanent classifier). Settings: README "Configuration" (generated from `config.AGENT_SETTINGS` and the
registry); the breaker's replies and alerts: README "Circuit breaker". No simulator and no fault switch: the lab's.
"""
