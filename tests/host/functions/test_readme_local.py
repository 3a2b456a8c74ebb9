"""The README's "Running locally / With devhost" block, run as written (up, submit, a bad submit, queues, down) in a
fresh copy of the app folder (symlinks to the repo's files, no .devhost/, no local.settings.json), checking each
command's output: so the README and the code cannot drift apart."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.system import ROOT
from lab.up import _stop, is_same_process, read_pid_file

pytestmark = pytest.mark.slow

# What the block needs: the app (function_app.py and its packages), the Agent, devhost, and what `make up` needs to
# see `setup` as done (the venv and node_modules are the repo's own, already set up).
LINKED = (
    "function_app.py",
    "host.json",
    "servicebus.config.json",
    "local.settings.sample.json",
    "activities",
    "orchestrators",
    "triggers",
    "orderflow",
    "agent",
    "devhost",
    "lab",
    "Makefile",
    "requirements.txt",
    "requirements-dev.txt",
    "constraints.txt",
    "pyproject.toml",
    "package.json",
    ".venv",
    "node_modules",
)


def readme_local_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n### With devhost", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "no ```bash block under 'With devhost'"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _kind(command: str) -> str:
    code = command.split("#", 1)[0]
    for kind, pattern in (
        ("up", r"\bup\b"),
        ("down", r"\bdown\b"),
        ("bad submit", r"submit .*--order-id"),
        ("submit", r"\bsubmit\b"),
        ("queues", r"\bqueues\b"),
    ):
        if re.search(pattern, code):
            return kind
    return "other"


@pytest.fixture()
def app_copy(tmp_path: Path) -> Iterator[Path]:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    yield tmp_path
    _stop(read_pid_file(tmp_path / ".devhost" / "up.json"), 5.0)  # whatever a failed run left behind


def test_readme_local_section_runs_as_written(app_copy: Path) -> None:
    commands = readme_local_commands()
    kinds = [_kind(c) for c in commands]
    assert [k for k in kinds if k != "other"] == ["up", "submit", "bad submit", "queues", "down"], commands
    if subprocess.run(["make", "-q", "setup"], cwd=app_copy, capture_output=True).returncode != 0:
        pytest.fail(
            "`make setup` is not up to date in the repo (`make test` runs it first): the README's `make up` "
            "would install packages inside this test"
        )
    for port in (7071, 8765):  # `up`'s default ports (devhost, simulator), as the README runs it
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            continue
        pytest.fail(
            f"port {port} is in use (another `make up`? stop it with `make down`): the README block runs on "
            "the default ports"
        )
    env = {
        k: v
        for k, v in os.environ.items()  # a fresh shell: no connection settings, no pytest variables
        if not k.startswith(("PYTEST", "ServiceBusConnection", "CosmosDb", "MAKE", "AGENT_"))
    }
    env["COLUMNS"] = "200"
    recorded = []
    for command, kind in zip(commands, kinds, strict=True):
        if kind == "down":
            recorded = read_pid_file(app_copy / ".devhost" / "up.json")
        run = subprocess.run(["bash", "-c", command], cwd=app_copy, env=env, capture_output=True, text=True, timeout=45)
        out = " ".join((run.stdout + run.stderr).split())
        if kind == "bad submit":  # exits non-zero: the order is rejected
            assert "InvalidField:orderId" in out, out
            continue
        assert run.returncode == 0, f"{command}: {out}"
        if kind == "up":
            assert "created local.settings.json from local.settings.sample.json" in out
            for name in ("simulator", "agent", "devhost"):
                assert f".devhost/logs/{name}.log" in out
                assert (app_copy / ".devhost" / "logs" / f"{name}.log").stat().st_size > 0
            assert "-m devhost submit" in out and "-m devhost down" in out
            assert [r.name for r in read_pid_file(app_copy / ".devhost" / "up.json")] == [
                "simulator",
                "agent",
                "devhost",
            ]
        elif kind == "submit":
            assert re.search(r"\breceived\b.*\bcompleted\b", out), out
        elif kind == "queues":
            assert re.search(r"dead-lettered on app-orders: bad/id:\S+ InvalidField:orderId", out), out
            assert re.search(r"alert PoisonMessage: .*InvalidField:orderId", out), out
        elif kind == "down":
            assert "stopped" in out
            assert len(recorded) == 3
            assert not any(is_same_process(r) for r in recorded)
            assert not (app_copy / ".devhost" / "up.json").exists()
    for log in ("devhost.log", "simulator.log", "agent.log"):
        assert not (app_copy / log).exists()
