"""The whole local system as OS processes: devhost with function_app.py, the Agent worker and the remote-service
simulator, sharing one embedded broker and one embedded store under a work folder. Used by `demo` and the
end-to-end tests; every process can be killed (-9) and restarted to prove recovery.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orderflow.embedded.connection import bus_connection_as, store_endpoint_as
from orderflow.embedded.rights import AGENT, FUNCTION_APP, submitting_app
from orderflow.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on ((?:http|amqp)://\S+)")
# What each process prints when it is ready (shared with `python -m devhost up`, lab/up.py): devhost, the simulator and
# the AMQP endpoint print "... listening on URL"; the Agent logs "agent serving QUEUE ..." once its senders are open.
READY = {
    "devhost": _LISTENING,
    "simulator": _LISTENING,
    "servicebus": _LISTENING,
    "agent": re.compile(r"agent serving \S+"),
}
# The transports of the local system's Service Bus: the embedded client on the broker file, or the real azure-servicebus
# SDK over AMQP 1.0 to `python -m devhost servicebus` on the same file (docs/devhost.md, "The AMQP endpoint").
TRANSPORTS = ("embedded", "amqp")


def simulator_args(port: int, db: Path, *extra: str) -> list[str]:
    """`python -m lab.simulator` arguments (after the interpreter)."""
    return ["-m", "lab.simulator", "--port", str(port), *extra, "--db", str(db)]


def devhost_args(app_dir: Path, port: int, state_dir: Path, timing: str = "local") -> list[str]:
    """`python -m devhost start` arguments (after the interpreter); `timing`: the Durable engine's (`--timing`)."""
    argv = ["-m", "devhost", "start", "--app-dir", str(app_dir), "--port", str(port), "--state-dir", str(state_dir)]
    return argv if timing == "local" else [*argv, "--timing", timing]


def servicebus_args(state_dir: Path, config: Path) -> list[str]:
    """`python -m devhost servicebus` arguments (after the interpreter), on a free port."""
    return ["-m", "devhost", "servicebus", "--port", "0", "--state-dir", str(state_dir), "--config", str(config)]


def emulator_connection_string(amqp_url: str) -> str:
    """The Service Bus emulator's connection string form for the endpoint at `amqp://HOST:PORT`."""
    address = amqp_url.removeprefix("amqp://").rstrip("/")
    return (
        f"Endpoint=sb://{address};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;"
        "UseDevelopmentEmulator=true;"
    )


def agent_args(*extra: str) -> list[str]:
    """`python -m lab agent` arguments (after the interpreter): the real Agent, fault switches from the env."""
    return ["-m", "lab", "agent", *extra]


def terminate_group(pid: int, alive: Callable[[], bool], timeout: float) -> bool:
    """SIGTERM the process group led by `pid`, wait up to `timeout` s for `alive()` to turn false, then SIGKILL.
    True when it stopped on SIGTERM. Every process here runs in its own session (start_new_session)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while alive():
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return False
        time.sleep(0.05)
    return True


def process_identity(name: str) -> str | None:
    """The identity of infra/ a process of the system acts as, by its name: an Agent (agent, agent-2, ...) the
    Agent's, the simulator none (it uses neither the bus nor the store), everything else the function app's
    (devhost and its hosts, a racing Starter or Supervisor)."""
    if name == "simulator":
        return None
    return AGENT if name.startswith("agent") else FUNCTION_APP


def _inherited_env() -> dict[str, str]:
    """This process's environment, less pytest's own variables, for a child process of the system."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}


def host_json_settings() -> dict[str, str]:
    """The app settings host.json names (`%TaskHubName%`), as local.settings.sample.json sets them: the host, and
    devhost, refuse a task hub name whose setting is missing (devhost/extensions.py)."""
    import json

    names = re.findall(r"%([A-Za-z0-9_]+)%", (ROOT / "host.json").read_text())
    values = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    return {name: str(values[name]) for name in names if name in values}


@dataclass
class SystemConfig:
    work_dir: Path
    seed: int = 1
    transient_failure_rate: float = 0.0
    permanent_failure_rate: float = 0.0
    hang_rate: float = 0.0
    hang_seconds: float = 30.0
    latency_ms_mean: float = 5.0
    settings: dict[str, str] = field(default_factory=dict)
    app_dir: Path = ROOT
    reply_queue: str = "app-status"
    servicebus_config: Path = ROOT / "servicebus.config.json"
    # devhost processes sharing one task hub, state folder, broker and store (scale-out: devhost/durable/hub.py).
    hosts: int = 1
    # "embedded" (the embedded client in every process) or "amqp" (the real SDK over the AMQP endpoint): TRANSPORTS.
    transport: str = "embedded"
    # The Durable engine's timing in every devhost: "local", or "azure-storage" (devhost/durable/timing.py).
    timing: str = "local"
    # Every process acts as the identity infra/ gives it (orderflow/embedded/rights); off: every one is the owner.
    rights: bool = True

    @property
    def bus_connection(self) -> str:
        """The embedded client's connection string of the broker file, as the namespace owner (every right): what
        the lab's own checks read every queue with, whatever the processes' transport and identities."""
        return f"Endpoint=embedded://{self.work_dir / 'servicebus.db'};ConfigFile={self.servicebus_config}"

    @property
    def store_endpoint(self) -> str:
        return f"embedded://{self.work_dir / 'store.db'}"


# Settings the local system runs with: short timeouts and schedules so that recovery shows within seconds. The step
# timeout keeps the crash budget (orderflow/session_locks.py): a step outlasts the 5 s session locks a dead Agent and
# a dead devhost can leave on agent-requests and agent-replies plus 5 s of headroom (20 s > 5 s + 5 s + 5 s), so
# killing either never costs an order an attempt; checked by tests/product/infra/test_crash_budget.py.
LOCAL_DEFAULTS = {
    "StepTimeoutSeconds": "20",
    "ClaimLeaseSeconds": "10",
    "StarterSchedule": "*/5 * * * * *",
    "SupervisorSchedule": "*/2 * * * * *",
    "SupervisorScanWindowSeconds": "600",
    "RetryBackoffBaseSeconds": "1",
    "RetryBackoffMaxSeconds": "5",
    "FailureThreshold": "3",
    "AGENT_MAX_CONCURRENT_SESSIONS": "32",
    "AGENT_RECEIVE_WAIT_MS": "300",
}


def with_bus_config(config: SystemConfig, servicebus_config: Path | None) -> SystemConfig:
    """`config` with the broker configuration a drill was given (`--servicebus-config`, resolved), else as it is."""
    if servicebus_config is not None:
        config.servicebus_config = servicebus_config.resolve()
    return config


class Process:
    """A child process whose output goes to a log file; `url` is what it printed after 'listening on'."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.url: str | None = None
        self._ready = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_for_url: bool = True, timeout: float = 60.0) -> Process:
        self._ready.clear()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while wait_for_url and not self._ready.wait(0.1):  # bounded start-up wait, also watching for an early exit
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start (exit code {self.proc.returncode}); see {self.log_path}")
        return self

    def _pump(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        with open(self.log_path, "ab") as log:
            for line in iter(stream.readline, b""):
                log.write(line)
                log.flush()
                match = _LISTENING.search(line.decode(errors="replace"))
                if match and not self._ready.is_set():
                    self.url = match.group(1)
                    self._ready.set()

    def kill(self) -> None:
        """kill -9: no cleanup, as a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        proc = self.proc
        if proc and proc.poll() is None and not terminate_group(proc.pid, lambda: proc.poll() is None, timeout):
            proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalSystem:
    def __init__(self, config: SystemConfig) -> None:
        self.config = config
        config.work_dir.mkdir(parents=True, exist_ok=True)
        if config.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {config.transport!r}")
        self.simulator: Process | None = None
        self.servicebus: Process | None = None  # the AMQP endpoint, with transport "amqp"
        self.agent: Process | None = None
        self.devhost: Process | None = None  # the first host
        self.devhosts: list[Process | None] = [None] * config.hosts

    @property
    def app_bus_connection(self) -> str:
        """The system's transport as the owner: the embedded broker's connection string, or with transport "amqp"
        the emulator form pointing at the running endpoint (RootManageSharedAccessKey), so each uses the real SDK.
        A process gets it with its own identity (`bus_connection_for`)."""
        if self.config.transport == "embedded":
            return self.config.bus_connection
        if self.servicebus is None or self.servicebus.url is None:
            raise RuntimeError("transport amqp: start the AMQP endpoint first (LocalSystem.start_servicebus)")
        return emulator_connection_string(self.servicebus.url)

    def bus_connection_for(self, identity: str | None) -> str:
        """The system's transport acting as `identity` (an identity of infra/; None: the owner)."""
        return bus_connection_as(self.app_bus_connection, identity if self.config.rights else None)

    @property
    def submitter(self) -> str:
        """The identity of the submitting application whose reply queue the system answers on."""
        return submitting_app(self.config.reply_queue)

    def env(self, identity: str | None = None) -> dict[str, str]:
        """The app settings of the system: with `identity`, what a process acting as it gets (its Service Bus
        connection and store endpoint name it); without, the owner's, what the lab's own checks read with."""
        c = self.config
        env = _inherited_env()
        # Every registered app setting with its documented default, as local.settings.sample.json lists them.
        env.update({s.name: s.default for s in SETTINGS if s.default is not None and s.name not in env})
        env.update({k: v for k, v in host_json_settings().items() if k not in env})
        env.update(
            {
                "ServiceBusConnection": self.app_bus_connection,
                "CosmosDb__accountEndpoint": c.store_endpoint,
                "PYTHONUNBUFFERED": "1",
                **LOCAL_DEFAULTS,
                **c.settings,
            }
        )
        if self.simulator and self.simulator.url:
            env["AGENT_REMOTE_URL"] = self.simulator.url
        if identity is not None and c.rights:
            env["ServiceBusConnection"] = self.bus_connection_for(identity)
            env["CosmosDb__accountEndpoint"] = store_endpoint_as(c.store_endpoint, identity)
        return env

    def _process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """A child process; without `env`, the settings of the identity its name says (`process_identity`)."""
        return Process(
            name, [sys.executable, *argv], env or self.env(process_identity(name)), self.config.work_dir / f"{name}.log"
        )

    def start_simulator(self) -> Process:
        c = self.config
        self.simulator = self._process(
            "simulator",
            simulator_args(
                0,
                c.work_dir / "simulator.db",
                "--seed",
                str(c.seed),
                "--transient-failure-rate",
                str(c.transient_failure_rate),
                "--permanent-failure-rate",
                str(c.permanent_failure_rate),
                "--hang-rate",
                str(c.hang_rate),
                "--hang-seconds",
                str(c.hang_seconds),
                "--latency-ms-mean",
                str(c.latency_ms_mean),
            ),
        ).start()
        return self.simulator

    def start_servicebus(self) -> Process:
        """`python -m devhost servicebus` on the system's broker file and queue config (transport "amqp")."""
        c = self.config
        # The endpoint itself reads the broker file from its arguments; it gets no ServiceBusConnection of its own.
        env = _inherited_env() | {"PYTHONUNBUFFERED": "1"}
        self.servicebus = self._process("servicebus", servicebus_args(c.work_dir, c.servicebus_config), env).start()
        return self.servicebus

    def start_agent(self) -> Process:
        self.agent = self._process("agent", agent_args("--jitter-seed", str(self.config.seed)))
        self.agent.start(wait_for_url=False)
        return self.agent

    def start_devhost(self, index: int = 0) -> Process:
        """Start host `index` (0: `devhost`, then `devhost-2`, ...); every host shares the state folder, so they
        run one task hub together, as the instances of a scaled-out app do."""
        name = "devhost" if index == 0 else f"devhost-{index + 1}"
        c = self.config
        host = self._process(name, devhost_args(c.app_dir, 0, c.work_dir / "devhost", c.timing)).start()
        self.devhosts[index] = host
        if index == 0:
            self.devhost = host
        return host

    def start(self) -> LocalSystem:
        if self.config.transport == "amqp":
            self.start_servicebus()
        self.start_simulator()
        self.start_agent()
        for index in range(self.config.hosts):
            self.start_devhost(index)
        return self

    def stop(self) -> None:
        for p in (*self.devhosts, self.agent, self.simulator, self.servicebus):
            if p is not None:
                p.stop()

    def __enter__(self) -> LocalSystem:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
