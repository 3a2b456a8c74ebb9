"""What the lifecycle drills (lab/lifecycle_drills.py, which re-exports it) share: their options and settings
(`LifecycleOptions`, `LIFECYCLE_SETTINGS`), their system (`lifecycle_config`), the steps they script by name, and
two readings of an order's statuses (its first final status, when it got a given status)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orderflow.messages import STEPS, TERMINAL_STATUSES, OrderStatus, StatusMessage, StepName
from orderflow.workflow import WORKFLOW_V1, WORKFLOW_V2

from .drill_common import LIFECYCLE_DRILLS, SETTINGS_CHOICES, base_settings
from .lifecycle_lab import Lab
from .system import SystemConfig, with_bus_config

DEFAULT_ORDERS = {"compensation": 8, "upgrade-in-flight": 8}  # upgrade: the orders before the restart
FIXED_ORDERS = {"cancel-in-flight": 5, "poison-in-session": 4}  # one order per stage / per case
DEFAULT_VERSION_SETTING = "AzureFunctionsJobHost__extensions__durableTask__defaultVersion"
_EVERY_SECOND = "*/1 * * * * *"
# Over the chosen base (LOCAL_DEFAULTS or the sample's) and under `--set`. The Starter runs every second so that a
# compensation (claimed by the Starter) or a held order starts at once; the crash budget's settings stay the base's.
LIFECYCLE_SETTINGS: dict[str, dict[str, str]] = {
    "compensation": {"StarterSchedule": _EVERY_SECOND},
    # Three slots, for the three orders cancelled in flight: the order cancelled before its claim waits for one.
    "cancel-in-flight": {"StarterSchedule": _EVERY_SECOND, "MaxOrdersInProcessing": str(len(STEPS))},
    "poison-in-session": {"StarterSchedule": _EVERY_SECOND},
    "upgrade-in-flight": {"StarterSchedule": _EVERY_SECOND},
}


@dataclass(frozen=True)
class LifecycleOptions:
    drill: str
    orders: int | None = None  # compensation: all its orders; upgrade-in-flight: the orders before the restart
    seed: int = 1
    settings: str = "local"
    overrides: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0  # the longest the drill waits for every final status
    hang_seconds: float = 8.0  # cancel-in-flight, poison-in-session: how long a scripted hang holds the answer
    latency_ms: float = 800.0  # upgrade-in-flight: the simulator's mean latency per call
    restart: str = "kill"  # upgrade-in-flight: kill (SIGKILL) or stop (SIGTERM) devhost
    from_version: str = WORKFLOW_V1  # upgrade-in-flight: the version devhost runs before the restart

    def __post_init__(self) -> None:
        if self.drill not in LIFECYCLE_DRILLS:
            raise ValueError(f"drill must be one of {LIFECYCLE_DRILLS}")
        if self.settings not in SETTINGS_CHOICES:
            raise ValueError(f"settings must be one of {SETTINGS_CHOICES}")
        if self.drill in FIXED_ORDERS and self.orders is not None and self.orders != FIXED_ORDERS[self.drill]:
            raise ValueError(
                f"{self.drill} runs {FIXED_ORDERS[self.drill]} orders (one per stage); --orders does not apply"
            )
        if self.drill == "compensation" and self.order_count < 3:
            raise ValueError("compensation needs at least 3 orders (compensated, compensation-failed, control)")
        if self.from_version not in (WORKFLOW_V1, WORKFLOW_V2):
            raise ValueError(f"from_version must be {WORKFLOW_V1} or {WORKFLOW_V2}")
        if self.order_count < 1 or self.hang_seconds <= 0 or self.latency_ms < 0:
            raise ValueError("need at least one order, hang_seconds > 0 and latency_ms >= 0")
        if self.restart not in ("kill", "stop"):
            raise ValueError("restart must be kill or stop")

    @property
    def order_count(self) -> int:
        if self.orders is not None:
            return self.orders
        return FIXED_ORDERS.get(self.drill) or DEFAULT_ORDERS[self.drill]

    def settings_values(self) -> dict[str, str]:
        return {**base_settings(self.settings), **LIFECYCLE_SETTINGS[self.drill], **dict(self.overrides)}


def lifecycle_config(work_dir: Path, options: LifecycleOptions, servicebus_config: Path | None = None) -> SystemConfig:
    """The drill's system: a simulator that fails only where the drill scripts it; upgrade-in-flight's is slow (so
    orders are in flight at the restart) and its devhost starts as version 1.0 (the app setting over host.json)."""
    settings = options.settings_values()
    if options.drill == "upgrade-in-flight":
        settings.setdefault(DEFAULT_VERSION_SETTING, options.from_version)
    config = SystemConfig(
        work_dir=work_dir.resolve(),
        seed=options.seed,
        transient_failure_rate=0.0,
        permanent_failure_rate=0.0,
        hang_rate=0.0,
        hang_seconds=options.hang_seconds,
        settings=settings,
    )
    if options.drill == "upgrade-in-flight":
        config.latency_ms_mean = options.latency_ms
    return with_bus_config(config, servicebus_config)


SHIP, CHARGE, RESERVE = StepName.ARRANGE_SHIPPING, StepName.CHARGE_PAYMENT, StepName.RESERVE_INVENTORY


def _final(lab: Lab, order_id: str) -> StatusMessage | None:
    """The order's first terminal status."""
    return next((s for s in lab.statuses(order_id) if s.state in TERMINAL_STATUSES), None)


def _status_at(lab: Lab, order_id: str, state: OrderStatus) -> float | None:
    status = lab.status(order_id, state)
    return None if status is None else status.timestamp.timestamp()
