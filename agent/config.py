"""The Agent's configuration: app settings (environment) first, command-line flags over them.

Shared settings come from the registry in `orderflow.settings`; the Agent's own settings (`AGENT_*`) are
declared here in `AGENT_SETTINGS` with their defaults, in the registry's `Setting` form, and documented in
the `agent` package docstring.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.retry import RetryPolicy
from orderflow import settings
from orderflow.settings import Setting

AGENT_SETTINGS: tuple[Setting, ...] = (
    Setting("AGENT_REMOTE_URL", "http://127.0.0.1:8765", "Base URL of the remote service (POST /steps/{step})."),
    Setting("AGENT_MAX_CONCURRENT_SESSIONS", "8", "Sessions (orders) the Agent processes at once."),
    Setting("AGENT_MAX_RETRIES", "4", "Retries after the first call, all inside the request's deadline."),
    Setting("AGENT_BACKOFF_BASE_MS", "100", "Base of the exponential backoff between retries (ms)."),
    Setting("AGENT_BACKOFF_MAX_MS", "5000", "Cap of one backoff delay (ms)."),
    Setting("AGENT_CALL_TIMEOUT_MS", "30000", "Upper bound of one call, further bounded by the deadline (ms)."),
    Setting("AGENT_JITTER_SEED", "0", "Seed of the backoff jitter (reproducible runs)."),
    Setting("AGENT_RECEIVE_WAIT_MS", "1000", "Wait for a session / a message before releasing the session (ms)."),
    Setting("AGENT_SHUTDOWN_GRACE_MS", "10000", "On SIGTERM, time in-flight requests get to finish (ms)."),
)
_AGENT_DEFAULTS = {s.name: s.default for s in AGENT_SETTINGS}


@dataclass(frozen=True)
class AgentConfig:
    requests_queue: str
    replies_queue: str
    alerts_queue: str
    remote_url: str
    max_concurrent_sessions: int
    max_retries: int
    backoff_base_ms: int
    backoff_max_ms: int
    call_timeout_ms: int
    jitter_seed: int
    receive_wait_ms: int
    shutdown_grace_ms: int

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_retries,
            backoff_base=self.backoff_base_ms / 1000,
            backoff_max=self.backoff_max_ms / 1000,
            call_timeout=self.call_timeout_ms / 1000,
            jitter_seed=self.jitter_seed,
        )

    def __post_init__(self) -> None:
        if self.max_concurrent_sessions < 1:
            raise ValueError("max_concurrent_sessions must be at least 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        for name in ("backoff_base_ms", "backoff_max_ms", "call_timeout_ms", "receive_wait_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def _agent_int(name: str, env: Mapping[str, str]) -> int:
    value = env.get(name) or _AGENT_DEFAULTS[name]
    try:
        return int(str(value))
    except ValueError as exc:
        raise ValueError(f"app setting {name!r} must be an integer, got {value!r}") from exc


def _queue(name: str, env: Mapping[str, str]) -> str:
    value = settings.get(name, env)
    if not value:
        raise ValueError(f"app setting {name!r} is empty")
    return value


def config_from_env(env: Mapping[str, str] | None = None) -> AgentConfig:
    source = os.environ if env is None else env
    return AgentConfig(
        requests_queue=_queue("AgentRequestsQueueName", source),
        replies_queue=_queue("AgentRepliesQueueName", source),
        alerts_queue=_queue("OperatorAlertsQueueName", source),
        remote_url=source.get("AGENT_REMOTE_URL") or str(_AGENT_DEFAULTS["AGENT_REMOTE_URL"]),
        max_concurrent_sessions=_agent_int("AGENT_MAX_CONCURRENT_SESSIONS", source),
        max_retries=_agent_int("AGENT_MAX_RETRIES", source),
        backoff_base_ms=_agent_int("AGENT_BACKOFF_BASE_MS", source),
        backoff_max_ms=_agent_int("AGENT_BACKOFF_MAX_MS", source),
        call_timeout_ms=_agent_int("AGENT_CALL_TIMEOUT_MS", source),
        jitter_seed=_agent_int("AGENT_JITTER_SEED", source),
        receive_wait_ms=_agent_int("AGENT_RECEIVE_WAIT_MS", source),
        shutdown_grace_ms=_agent_int("AGENT_SHUTDOWN_GRACE_MS", source),
    )


# CLI flag → AgentConfig field; every flag defaults to the app setting.
_FLAGS: dict[str, tuple[str, type, str]] = {
    "--requests-queue": ("requests_queue", str, "AgentRequestsQueueName"),
    "--replies-queue": ("replies_queue", str, "AgentRepliesQueueName"),
    "--alerts-queue": ("alerts_queue", str, "OperatorAlertsQueueName"),
    "--remote-url": ("remote_url", str, "AGENT_REMOTE_URL"),
    "--max-concurrent-sessions": ("max_concurrent_sessions", int, "AGENT_MAX_CONCURRENT_SESSIONS"),
    "--max-retries": ("max_retries", int, "AGENT_MAX_RETRIES"),
    "--backoff-base-ms": ("backoff_base_ms", int, "AGENT_BACKOFF_BASE_MS"),
    "--backoff-max-ms": ("backoff_max_ms", int, "AGENT_BACKOFF_MAX_MS"),
    "--call-timeout-ms": ("call_timeout_ms", int, "AGENT_CALL_TIMEOUT_MS"),
    "--jitter-seed": ("jitter_seed", int, "AGENT_JITTER_SEED"),
    "--receive-wait-ms": ("receive_wait_ms", int, "AGENT_RECEIVE_WAIT_MS"),
    "--shutdown-grace-ms": ("shutdown_grace_ms", int, "AGENT_SHUTDOWN_GRACE_MS"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="The Agent worker: receives AgentRequests from the session queue, calls the remote "
        "service "
        "with retries inside each request's deadline, replies on the replies queue. Each flag overrides the "
        "app setting (environment variable) it names; without either, the default shown applies.",
        epilog="The remote service's address must match AGENT_REMOTE_URL (or --remote-url): locally, the "
        f"simulator started with `python -m lab.simulator --port 8765` serves the default "
        f"{_AGENT_DEFAULTS['AGENT_REMOTE_URL']}; with another --port, set AGENT_REMOTE_URL=http://127.0.0.1:<port>. "
        "A mismatch shows in the Agent's log as `Cannot connect to host`, and orders end in Error.",
    )
    parser.add_argument(
        "--connection",
        help="Service Bus connection string (default: app setting "
        "ServiceBusConnection; `Endpoint=embedded://...` = embedded broker)",
    )
    for flag, (dest, kind, setting) in _FLAGS.items():
        default = _AGENT_DEFAULTS[setting] if setting in _AGENT_DEFAULTS else settings.get(setting, {})
        parser.add_argument(
            flag, dest=dest, type=kind, default=None, help=f"default: app setting {setting}, else {default}"
        )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    return parser


def config_from_args(
    argv: Sequence[str] | None, env: Mapping[str, str] | None = None
) -> tuple[AgentConfig, argparse.Namespace]:
    """Parse flags; each one given overrides the app setting of the same meaning."""
    args = build_parser().parse_args(argv)
    base = config_from_env(env)
    overrides = {dest: getattr(args, dest) for dest, _, _ in _FLAGS.values() if getattr(args, dest) is not None}
    return AgentConfig(**{**base.__dict__, **overrides}), args
