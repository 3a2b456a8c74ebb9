"""The two systems that benchmarks/compare.py measures, ours and the DBOS peer, each started with the counting shim
and strace of its round (`Instrument`) when the round is counted."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from . import compare_counts as counts
from . import compare_peer as peer
from .common import ROOT, python
from .compare_proto import SEED, Driver

STRACE_USABLE = [True]  # checked once by main()

# Our SQLite settings, on each of our three stores: the broker (orderflow/embedded/broker/_base.py), the state store
# and orders DB (orderflow/embedded/store/_file.py) and devhost's Durable store (devhost/durable/store.py).
OUR_SQLITE = {"journal_mode": "WAL", "synchronous": "NORMAL"}


@dataclass
class Options:
    latency_ms: float = 0.0
    peer_mode: str = peer.DEFAULT_MODE  # start: DBOS.start_workflow, at most peer_concurrency in flight
    peer_concurrency: int = peer.DEFAULT_CONCURRENCY
    peer_polling_interval: float = peer.DEFAULT_POLLING_INTERVAL  # queue mode only
    peer_synchronous: str = peer.DEFAULT_SYNCHRONOUS  # as ours
    count: bool = True  # the counting shim and strace
    keep: Path | None = None
    hosts: int = 1  # our devhost hosts on one task hub (scale-out, docs/devhost.md)

    def as_dict(self) -> dict[str, Any]:
        return {
            "remote_latency_ms_mean": self.latency_ms,
            "peer_mode": self.peer_mode,
            "peer_concurrency": self.peer_concurrency,
            "peer_polling_interval_s": self.peer_polling_interval if self.peer_mode == "queue" else None,
            "peer_synchronous": self.peer_synchronous,
            "counted": self.count,
            "our_hosts": self.hosts,
        }

    def peer_synchronous_level(self) -> str:
        return "FULL (DBOS's default)" if self.peer_synchronous == "default" else self.peer_synchronous

    def peer_mode_label(self) -> str:
        """How the peer starts its workflows, in words (the headline and the plots name it)."""
        if self.peer_mode == "start":
            return f"start_workflow, at most {self.peer_concurrency} in flight"
        return f"queue, {self.peer_concurrency} workers, polled every {self.peer_polling_interval * 1000:g} ms"

    def sqlite_label(self) -> str:
        mine = f"WAL, synchronous={self.peer_synchronous_level()}"
        ours = f"WAL, synchronous={OUR_SQLITE['synchronous']}"
        return f"SQLite {ours} on both" if mine == ours else f"SQLite: ours {ours}, DBOS {mine}"


# --- instrumentation ---------------------------------------------------------------------------------------------
class Instrument:
    """The counting shim (PYTHONPATH + its variable) and strace, for the processes of one round."""

    def __init__(self, round_dir: Path, enabled: bool) -> None:
        self.enabled = enabled and STRACE_USABLE[0]
        self.shim = enabled
        self.count_dir = round_dir / "counts"
        self.strace_dir = round_dir / "strace"
        self.count_dir.mkdir(parents=True, exist_ok=True)
        self.strace_dir.mkdir(parents=True, exist_ok=True)
        self._seq = 0

    def env(self) -> dict[str, str]:
        if not self.shim:
            return {}
        path = os.pathsep.join([str(counts.SHIM_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return {"PYTHONPATH": path, counts.COUNT_DIR_VARIABLE: str(self.count_dir)}

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        return [*counts.strace_prefix(self.strace_dir / f"{name}.strace"), *argv] if self.enabled else argv

    def strace_logs(self) -> list[Path]:
        return sorted(self.strace_dir.glob("*.strace"))

    def dumps(self, pids: dict[str, int]) -> dict[str, dict[str, Any]]:
        if not self.shim:
            return {}
        self._seq = self._seq % 255 + 1
        return {role: counts.request_dump(self.count_dir, pid, self._seq) for role, pid in pids.items()}


def python_pid(pid: int, timeout: float = 30.0) -> int:
    """The interpreter's pid: `pid` itself, or its child when `pid` is strace."""
    proc = psutil.Process(pid)
    if proc.name() != "strace":
        return pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = proc.children()
        if children:
            return children[0].pid
        time.sleep(0.02)
    raise RuntimeError(f"strace {pid} started no process")


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


# --- the two systems ---------------------------------------------------------------------------------------------
class OurSystem:
    """devhost + the Agent + the simulator (lab/system.py LocalSystem) and our client app."""

    name = "ours"

    def __init__(self, round_dir: Path, instrument: Instrument, options: Options) -> None:
        from lab.system import LocalSystem, SystemConfig

        class InstrumentedSystem(LocalSystem):
            """LocalSystem whose processes start under strace and with the counting shim's environment. `_process`
            is LocalSystem's one place that builds a process; nothing else changes."""

            def env(self, identity: str | None = None) -> dict[str, str]:
                return {**super().env(identity), **instrument.env()}

            def _process(self, name: str, argv: list[str]) -> Any:
                proc = super()._process(name, argv)
                proc.argv = instrument.wrap(name, proc.argv)
                return proc

        self.dir, self.instrument = round_dir, instrument
        self.config = SystemConfig(
            work_dir=round_dir / "system", seed=SEED, latency_ms_mean=options.latency_ms, hosts=options.hosts
        )
        self.system = InstrumentedSystem(self.config)
        self.driver: Driver | None = None
        self.pids: dict[str, int] = {}

    @property
    def sqlite_settings(self) -> dict[str, dict[str, str]]:
        """As our code sets them (OUR_SQLITE), per store."""
        return {name: dict(OUR_SQLITE) for name in ("broker", "store", "durable")}

    def start(self) -> None:
        self.system.start()
        env = self.system.env()
        argv = [
            python(),
            "-m",
            "benchmarks.compare_ours",
            "--connection",
            self.config.bus_connection,
            "--orders-queue",
            env.get("OrdersQueueName", "orders-inbound"),
            "--reply-queue",
            self.config.reply_queue,
        ]
        self.driver = Driver("our client", self.instrument.wrap("client", argv), env, self.dir / "client.log", ROOT)
        self.driver.wait_ready(120)
        procs = {"agent": self.system.agent, "simulator": self.system.simulator}
        procs.update(
            {("devhost" if n == 0 else f"devhost-{n + 1}"): host for n, host in enumerate(self.system.devhosts)}
        )
        self.pids = {role: python_pid(p.proc.pid) for role, p in procs.items() if p is not None and p.proc}
        self.pids["client"] = python_pid(self.driver.proc.pid)

    @property
    def durable_db(self) -> Path:
        return self.config.work_dir / "devhost" / "durable.db"

    def unfinished(self, prefix: str) -> int:
        return counts.durable_unfinished(self.durable_db, prefix)

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.stop()
        self.system.stop()

    def store_counts(self, prefix: str) -> dict[str, Any]:
        return {"durable": counts.durable_counts(self.durable_db, prefix)}


class PeerSystem:
    """The DBOS peer process and its own simulator (the same program and settings as ours)."""

    name = "peer"

    def __init__(self, round_dir: Path, instrument: Instrument, options: Options) -> None:
        self.dir, self.instrument, self.options = round_dir, instrument, options
        self.driver: Driver | None = None
        self.simulator: Any = None
        self.pids: dict[str, int] = {}
        self.ready: dict[str, Any] = {}

    @property
    def sqlite_settings(self) -> dict[str, dict[str, str]]:
        """As the peer read them back from its connections (compare_peer.Peer._note_settings), per database file."""
        return dict(self.ready.get("sqlite") or {})

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        return {**env, "PYTHONUNBUFFERED": "1", **self.instrument.env()}

    def start(self) -> None:
        from lab.system import Process, simulator_args

        o = self.options
        sim = [
            python(),
            *simulator_args(
                0,
                self.dir / "simulator.db",
                "--seed",
                str(SEED),
                "--transient-failure-rate",
                "0.0",
                "--permanent-failure-rate",
                "0.0",
                "--hang-rate",
                "0.0",
                "--latency-ms-mean",
                str(o.latency_ms),
            ),
        ]
        self.simulator = Process(
            "simulator", self.instrument.wrap("simulator", sim), self._env(), self.dir / "simulator.log"
        ).start()
        argv = [
            python(),
            "-m",
            "benchmarks.compare_peer",
            "--work-dir",
            str(self.dir / "peer"),
            "--simulator-url",
            str(self.simulator.url),
            "--mode",
            o.peer_mode,
            "--concurrency",
            str(o.peer_concurrency),
            "--polling-interval",
            str(o.peer_polling_interval),
            "--synchronous",
            o.peer_synchronous,
        ]
        self.driver = Driver("peer", self.instrument.wrap("peer", argv), self._env(), self.dir / "peer.log", ROOT)
        self.ready = self.driver.wait_ready(120)
        self.pids = {"peer": python_pid(self.driver.proc.pid), "simulator": python_pid(self.simulator.proc.pid)}

    def unfinished(self, prefix: str) -> int:
        return counts.dbos_unfinished(self.dir / "peer" / "dbos-system.sqlite", prefix)

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.stop()
        if self.simulator is not None:
            self.simulator.stop()

    def store_counts(self, prefix: str) -> dict[str, Any]:
        return {"dbos": counts.dbos_counts(self.dir / "peer" / "dbos-system.sqlite", prefix)}


SYSTEMS = {"ours": OurSystem, "peer": PeerSystem}
