"""`python -m devhost up` / `down` bookkeeping (lab/up.py): refusing to start twice, a stale PID file, a pid
reused by another process, and the folders each process creates for itself. The full `up` … `down` run is in
test_readme_local.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from devhost.__main__ import main
from lab.simulator_ledger import EffectStore
from orderflow.embedded.broker import EmbeddedBroker
from orderflow.embedded.store import SqliteFile


@pytest.fixture()
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _record(state: Path, *procs: tuple[str, int, float]) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    pid_file = state / "up.json"
    pid_file.write_text(
        json.dumps(
            {
                "processes": [
                    {
                        "name": name,
                        "pid": pid,
                        "create_time": created,
                        "started": "2026-01-01T00:00:00+0000",
                        "argv": ["python", "-m", name],
                        "log": str(state / "logs" / f"{name}.log"),
                        "url": None,
                    }
                    for name, pid, created in procs
                ]
            }
        )
    )
    return pid_file


def test_up_refuses_to_start_twice(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    pid_file = _record(state, ("simulator", sleeper.pid, psutil.Process(sleeper.pid).create_time()))
    assert main(["up", "--app-dir", str(tmp_path), "--state-dir", str(state)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "already up" in err and f"simulator {sleeper.pid}" in err and "-m devhost down" in err
    assert pid_file.exists() and not (state / "logs").exists()  # nothing started, nothing forgotten
    assert not (tmp_path / "local.settings.json").exists()
    assert sleeper.poll() is None


def test_down_with_a_stale_pid_file_cleans_up_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(gone.pid).create_time()
    gone.wait()
    pid_file = _record(tmp_path, ("agent", gone.pid, created))
    assert main(["down", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"pid {gone.pid}: was not running" in out
    assert "nothing was running" in out and "stale" in out
    assert not pid_file.exists()
    assert main(["down", "--state-dir", str(tmp_path)]) == 0  # idempotent
    assert "nothing is running" in capsys.readouterr().out


def test_down_leaves_a_reused_pid_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    # The recorded process had this pid but started earlier: the pid now belongs to another process.
    pid_file = _record(tmp_path, ("devhost", sleeper.pid, psutil.Process(sleeper.pid).create_time() - 100))
    assert main(["down", "--state-dir", str(tmp_path), "--timeout", "2"]) == 0
    out = capsys.readouterr().out
    assert "another process; left alone" in out and "nothing was running" in out
    assert sleeper.poll() is None
    assert not pid_file.exists()


def test_down_stops_a_recorded_process_group(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    _record(tmp_path, ("simulator", sleeper.pid, psutil.Process(sleeper.pid).create_time()))
    assert main(["down", "--state-dir", str(tmp_path), "--timeout", "5"]) == 0
    assert f"pid {sleeper.pid}: stopped" in capsys.readouterr().out
    assert sleeper.wait(5) is not None


def test_each_process_creates_the_folder_of_its_sqlite_file(tmp_path: Path) -> None:
    # A fresh clone has no .devhost/: the simulator (--db), the embedded broker and the embedded store create it.
    EffectStore(tmp_path / "sim" / "a" / "simulator.db").close()
    EmbeddedBroker(tmp_path / "bus" / "a" / "servicebus.db").close()
    asyncio.run(SqliteFile(tmp_path / "store" / "a" / "store.db").aclose())
    for name in ("sim/a/simulator.db", "bus/a/servicebus.db", "store/a/store.db"):
        assert (tmp_path / name).is_file(), name
