"""`python -m devhost up` / `down`: start the whole local system in the background with one command, stop it with
another. `up` starts the remote-service simulator, the Agent (pointed at the simulator's real URL) and devhost with
the app in `--app-dir`, each detached in its own session with its log under STATE/logs, waits until each is ready,
records the processes in STATE/up.json and exits. `down` stops exactly the recorded processes (a pid that now
belongs to another process is left alone) and removes the file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from devhost.config import ConfigError, HostConfig
from orderflow.embedded.connection import settings_as
from orderflow.embedded.rights import AGENT

from .system import READY, ROOT, agent_args, devhost_args, simulator_args, terminate_group

PID_FILE = "up.json"
NAMES = ("simulator", "agent", "devhost")  # start order; `down` stops in the reverse order


def add_commands(sub: Any) -> None:
    u = sub.add_parser(
        "up",
        help="start devhost, the Agent and the simulator in the background (stop: down)",
        description="Start the remote-service simulator, the Agent (AGENT_REMOTE_URL = the "
        "simulator's URL) and devhost with DIR/function_app.py, detached, with their logs "
        "under STATE/logs; wait until each is ready, record them in STATE/up.json and "
        "exit. Creates DIR/local.settings.json from local.settings.sample.json if missing. "
        "Refuses to start twice.",
    )
    _state_options(u)
    u.add_argument(
        "--port",
        type=int,
        default=7071,
        help="devhost's HTTP port (default 7071, as `func start` and `submit --host-port`; 0 = any)",
    )
    u.add_argument(
        "--simulator-port",
        type=int,
        default=8765,
        help="the simulator's port (default 8765, the Agent's default AGENT_REMOTE_URL; 0 = any); the "
        "Agent is given its URL",
    )
    u.add_argument("--timeout", type=float, default=60.0, help="seconds each process gets to become ready (default 60)")

    d = sub.add_parser(
        "down",
        help="stop what `up` started",
        description="Stop the processes recorded in STATE/up.json (SIGTERM, then SIGKILL after "
        "--timeout seconds), skipping any pid that now belongs to another process, and "
        "remove the file. Says so when nothing is running.",
    )
    _state_options(d)
    d.add_argument("--timeout", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL (default 20)")


def _state_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app-dir", type=Path, default=Path("."), help="folder holding function_app.py (default: .)")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state, logs and up.json (default DIR/.devhost, where local.settings.sample.json puts the "
        "embedded broker and store)",
    )


@dataclass
class Recorded:
    name: str
    pid: int
    create_time: float
    started: str
    argv: list[str]
    log: str
    url: str | None = None


def _state_dir(args: argparse.Namespace) -> Path:
    state: Path = args.state_dir if args.state_dir is not None else args.app_dir / ".devhost"
    return state


def _show(path: Path) -> str:
    """`path` relative to the working directory when it is below it (as the user typed it), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _python() -> str:
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def read_pid_file(path: Path) -> list[Recorded]:
    try:
        data = json.loads(path.read_text())
        return [Recorded(**p) for p in data["processes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _write_pid_file(path: Path, processes: list[Recorded]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"processes": [asdict(p) for p in processes]}, indent=2) + "\n")
    tmp.replace(path)


def is_same_process(rec: Recorded) -> bool:
    """True while `rec.pid` is still the process `up` started (same creation time), not a reused pid."""
    try:
        proc = psutil.Process(rec.pid)
        same: bool = abs(proc.create_time() - rec.create_time) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
        return same
    except psutil.Error:
        return False


def _stop(records: list[Recorded], timeout: float) -> list[tuple[Recorded, str]]:
    """Stop the recorded processes that are still theirs (SIGTERM to each group at once, SIGKILL after timeout)."""
    outcome: list[tuple[Recorded, str]] = []
    for rec in reversed(records):
        if not is_same_process(rec):
            gone = psutil.pid_exists(rec.pid)
            outcome.append((rec, "pid now belongs to another process; left alone" if gone else "was not running"))
            continue
        stopped = terminate_group(rec.pid, partial(is_same_process, rec), timeout)
        outcome.append((rec, "stopped" if stopped else f"killed (no exit {timeout:g} s after SIGTERM)"))
    return outcome


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        match = pattern.search(text)
        if match:
            return match
        if proc.poll() is not None or time.monotonic() > deadline:
            lines = [line for line in text.splitlines() if line.strip()]
            why = (
                f"exited with code {proc.returncode}" if proc.returncode is not None else f"not ready in {timeout:g} s"
            )
            last = f": {lines[-1].strip()}" if lines else ""
            raise RuntimeError(f"{log.stem} {why}; see {_show(log)}{last}")
        time.sleep(0.05)


def _spawn(
    name: str, args: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float
) -> tuple[Recorded, str | None]:
    argv = [sys.executable, *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    rec = Recorded(
        name,
        proc.pid,
        psutil.Process(proc.pid).create_time(),
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        argv,
        str(log.resolve()),
    )
    try:
        match = _wait_ready(proc, log, READY[name], timeout)
    except RuntimeError:
        _stop([rec], 5.0)
        raise
    rec.url = match.group(1) if match.groups() else None
    return rec, rec.url


def _settings(app_dir: Path) -> dict[str, str]:
    settings = app_dir / "local.settings.json"
    sample = app_dir / "local.settings.sample.json"
    if not settings.exists():
        if not sample.exists():
            raise ConfigError(f"{_show(settings)} is missing (and there is no local.settings.sample.json to copy)")
        shutil.copyfile(sample, settings)
        print(f"created {_show(settings)} from {sample.name}", flush=True)
    return dict(HostConfig.load(app_dir).values)


def up(args: argparse.Namespace) -> int:
    app_dir: Path = args.app_dir
    state = _state_dir(args)
    pid_file = state / PID_FILE
    running = [r for r in read_pid_file(pid_file) if is_same_process(r)]
    if running:
        pids = ", ".join(f"{r.name} {r.pid}" for r in running)
        print(f"devhost up: already up ({pids}); stop it with `{_python()} -m devhost down`", file=sys.stderr)
        return 1
    if not (app_dir / "function_app.py").exists():
        print(f"devhost up: no function_app.py in {_show(app_dir)}", file=sys.stderr)
        return 1
    try:
        values = _settings(app_dir)
    except ConfigError as exc:
        print(f"devhost up: {exc}", file=sys.stderr)
        return 1
    if pid_file.exists():
        pid_file.unlink()
        print(f"removed the stale {_show(pid_file)} (none of its processes was running)", flush=True)
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # Settings as devhost applies them (variables already set win); the repo on PYTHONPATH for the Agent and the
    # simulator when DIR is another folder.
    env = {**values, **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    records: list[Recorded] = []
    try:
        sim, sim_url = _spawn(
            "simulator",
            simulator_args(args.simulator_port, state.resolve() / "simulator.db"),
            env,
            app_dir,
            logs / "simulator.log",
            args.timeout,
        )
        records.append(sim)
        _write_pid_file(pid_file, records)
        # devhost keeps the app's connections (the function app's identity in local.settings.sample.json); the Agent
        # acts as its own.
        agent_env = {**settings_as(env, AGENT), "AGENT_REMOTE_URL": str(sim_url)}
        agent, _ = _spawn("agent", agent_args(), agent_env, app_dir, logs / "agent.log", args.timeout)
        records.append(agent)
        _write_pid_file(pid_file, records)
        host, _ = _spawn(
            "devhost",
            devhost_args(Path("."), args.port, state.resolve()),
            env,
            app_dir,
            logs / "devhost.log",
            args.timeout,
        )
        records.append(host)
        _write_pid_file(pid_file, records)
    except RuntimeError as exc:
        _stop(records, 10.0)
        pid_file.unlink(missing_ok=True)
        print(f"devhost up: {exc}", file=sys.stderr)
        return 1
    py = _python()
    print(f"up: simulator {sim.url} (pid {sim.pid}), Agent (pid {agent.pid}), devhost {host.url} (pid {host.pid})")
    print("logs:")
    for rec in records:
        print(f"  {rec.name:<10} {_show(Path(rec.log))}")
    print(f"pids: {_show(pid_file)}")
    print(f"submit an order: {py} -m devhost submit      queues: {py} -m devhost queues")
    print(f"stop:            {py} -m devhost down  (or make down)", flush=True)
    return 0


def down(args: argparse.Namespace) -> int:
    pid_file = _state_dir(args) / PID_FILE
    if not pid_file.exists():
        print(f"down: nothing is running (no {_show(pid_file)})")
        return 0
    records = read_pid_file(pid_file)
    outcome = _stop(records, args.timeout)
    pid_file.unlink(missing_ok=True)
    for rec, what in outcome:
        print(f"  {rec.name:<10} pid {rec.pid}: {what}")
    if not any(what.startswith(("stopped", "killed")) for _, what in outcome):
        print(f"down: nothing was running; removed the stale {_show(pid_file)}")
    else:
        print("down: stopped")
    return 0
