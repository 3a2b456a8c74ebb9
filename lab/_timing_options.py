"""The timing drills' options and system (lab/timing_drills.py, which re-exports them): each drill's settings
(`TIMING_SETTINGS`, over `--settings` and under `--set`), the held replies and hangs sized on the step timeout,
`TimingOptions` and `timing_config`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.config import config_from_env as agent_config_from_env
from orderflow import settings as app_settings
from orderflow.embedded.config import load_config_file

from .agent_faults import faults_from_env
from .drill_common import SETTINGS_CHOICES, base_settings
from .system import ROOT, SystemConfig, with_bus_config

TIMING_DRILLS = ("remote-hang", "late-replies", "reply-reordering", "clock-skew")
DEFAULT_ORDERS = {"remote-hang": 12, "late-replies": 12, "reply-reordering": 12, "clock-skew": 10}
_EVERY_SECOND = "*/1 * * * * *"
# Each drill's settings, over the chosen base and under `--set`. Short steps (no process is killed here, so the crash
# budget of orderflow/session_locks.py does not bind them; cf. retry-budget's 8 s), the Starter and the Supervisor
# every second so that a timed-out attempt is recovered at once. FailureThreshold leaves room for the attempts the
# drill costs: remote-hang at most 2 hangs per order (+1 spare); the held replies of late-replies and reply-reordering
# are drawn per reply, so an order may lose several attempts (8: an order reaches Error with odds below 1e-4). The
# retry budget is the default (RemoteCallBudgetPerStep 75): the Starter lowers the Agent's retries to fit.
TIMING_SETTINGS: dict[str, dict[str, str]] = {
    # The breaker off: a hang is a timeout, which the breaker counts; this drill measures the Supervisor's recovery
    # alone (the breaker has its own drill, remote-outage).
    "remote-hang": {
        "StepTimeoutSeconds": "5",
        "ClaimLeaseSeconds": "5",
        "FailureThreshold": "4",
        "CircuitBreakerFailureThreshold": "0",
    },
    "late-replies": {"StepTimeoutSeconds": "5", "ClaimLeaseSeconds": "5", "FailureThreshold": "8"},
    "reply-reordering": {"StepTimeoutSeconds": "5", "ClaimLeaseSeconds": "5", "FailureThreshold": "8"},
    # Steps of 10 s: the Agent ahead by 4 s (the 5 s lock less a second) still has 6 s per request. Four sessions per
    # Agent, so that the orders are shared between the two Agents (one with 32 slots would take them all).
    "clock-skew": {
        "StepTimeoutSeconds": "10",
        "ClaimLeaseSeconds": "10",
        "FailureThreshold": "6",
        "AGENT_MAX_CONCURRENT_SESSIONS": "4",
    },
}
_COMMON = {"StarterSchedule": _EVERY_SECOND, "SupervisorSchedule": _EVERY_SECOND}
# Held replies (AGENT_REPLY_DELAY_*), in seconds past the step timeout T, and the share held. late-replies: held
# T+2..T+5 s, so each held reply is late by at least 2 s (it was handled after its request was sent, at most T before
# CompleteBy). reply-reordering: T+3..T+7 s, so the next attempt (the Supervisor, the backoff and the Starter take
# about 3 s) usually answers first.
HOLD: dict[str, tuple[float, float, float]] = {"late-replies": (2, 5, 0.2), "reply-reordering": (3, 7, 0.3)}
LATE_MARGIN_S = 2.0  # a reply this late was certainly after its timer fired (devhost fires timers within ~0.1 s)
HANG_SHARE = {"remote-hang": (0.2, 0.6), "clock-skew": (0.0, 0.5)}  # (two hangs below, one hang below) per order
CLOCK_SKEW_LATENCY_MS, CLOCK_SKEW_TRANSIENT = 300.0, 0.1
CLOCK_SKEW_LOCK_MARGIN_S = 1.0  # clock-skew's default skew: agent-requests' LockDuration less this
SETTLE_S = 30.0  # the longest the drill waits, after the last final status and any held reply, for queues to drain


@dataclass(frozen=True)
class TimingOptions:
    drill: str
    orders: int | None = None
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()
    timeout: float = 900.0
    hang_seconds: float = 8.0  # remote-hang: how long a hang holds the answer (must exceed the step's deadline)
    servicebus_config: Path | None = None  # the broker's queues (clock-skew's default skew comes from LockDuration)

    def __post_init__(self) -> None:
        if self.drill not in TIMING_DRILLS:
            raise ValueError(f"drill must be one of {TIMING_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.order_count < 1:
            raise ValueError("need at least one order")
        values = self.settings_values()
        agent_config_from_env(values)  # the Agent's settings and its fault switches must be valid
        faults_from_env(values)
        step = self.step_timeout_s
        if self.drill == "remote-hang" and self.hang_s <= step:
            raise ValueError(
                f"--hang-seconds {self.hang_s:g} must exceed the step's deadline (StepTimeoutSeconds {step})"
            )
        if self.drill == "clock-skew" and not 0.5 <= self.skew_s < step - 1:
            raise ValueError(
                f"the clock skew ({self.skew_s:g} s) must be at least 0.5 s and more than a second "
                f"below StepTimeoutSeconds {step} (else the Agent ahead never has time to call)"
            )

    @property
    def order_count(self) -> int:
        return DEFAULT_ORDERS[self.drill] if self.orders is None else self.orders

    @property
    def step_timeout_s(self) -> int:
        return app_settings.get_int("StepTimeoutSeconds", {**_REGISTRY, **self._base()})

    @property
    def hang_s(self) -> float:
        """How long a hang holds the remote's answer: `--hang-seconds` (remote-hang), T + 2 s (clock-skew: the Agent
        behind is still waiting when the answer comes, after the step's CompleteBy)."""
        return self.step_timeout_s + 2.0 if self.drill == "clock-skew" else self.hang_seconds

    @property
    def skew_s(self) -> float:
        """clock-skew: the Agents run at +skew and -skew (default: the LockDuration of agent-requests less a second,
        the most an Agent ahead can be off and still use a session: its bus client judges the lock on its clock)."""
        given = dict(self.overrides).get("AGENT_CLOCK_SKEW_SECONDS")
        if given:
            return abs(float(given))
        return max(0.5, lock_duration_s("agent-requests", self.servicebus_config) - CLOCK_SKEW_LOCK_MARGIN_S)

    def _base(self) -> dict[str, str]:
        return {**base_settings(self.settings), **_COMMON, **TIMING_SETTINGS[self.drill], **dict(self.overrides)}

    def settings_values(self) -> dict[str, str]:
        """Over LOCAL_DEFAULTS: the base, the drill's settings, `--set`; the held replies are sized on the step timeout
        (unless set), and clock-skew's Agent runs ahead (the second Agent, started by the drill, behind)."""
        if self.drill == "clock-skew":
            return {**self._base(), "AGENT_CLOCK_SKEW_SECONDS": str(self.skew_s)}
        derived: dict[str, str] = {}
        if self.drill in HOLD:
            step, (low, high, share) = self.step_timeout_s, HOLD[self.drill]
            derived = {
                "AGENT_REPLY_DELAY_MS": str(int((step + high) * 1000)),
                "AGENT_REPLY_DELAY_MIN_MS": str(int((step + low) * 1000)),
                "AGENT_REPLY_DELAY_SHARE": str(share),
            }
        return {**derived, **self._base()}


_REGISTRY = {s.name: s.default for s in app_settings.SETTINGS if s.default is not None}


def lock_duration_s(queue: str, config: Path | None = None) -> float:
    """A queue's LockDuration in the broker's configuration (servicebus.config.json), in seconds."""
    return load_config_file(config or ROOT / "servicebus.config.json")[queue].lock_duration.total_seconds()


def timing_config(work_dir: Path, options: TimingOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: a remote that fails only where the drill scripts it (clock-skew's is also slow and fails
    now and then), hangs that outlast the step."""
    clock_skew = options.drill == "clock-skew"
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=CLOCK_SKEW_TRANSIENT if clock_skew else 0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        hang_seconds=options.hang_s,
        settings=options.settings_values(),
    )
    if clock_skew:
        config.latency_ms_mean = CLOCK_SKEW_LATENCY_MS
    return with_bus_config(config, servicebus_config)
