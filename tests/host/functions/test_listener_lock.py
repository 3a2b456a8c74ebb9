"""The timer trigger's listener lock across hosts that share a state folder (devhost/singleton.py), and the
scale-out settings devhost reads from host.json."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from devhost.config import ConfigError, HostConfig
from devhost.processes import process_running, process_start
from devhost.singleton import ListenerLock
from devhost.timers import TimerRunner


def other_live_process() -> tuple[int, float]:
    parent = psutil.Process().parent()
    assert parent is not None
    return parent.pid, process_start(parent.pid)


def a_dead_process() -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = process_start(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, started


def test_one_holder_at_a_time_and_a_dead_holders_lock_is_taken(tmp_path: Path) -> None:
    mine = ListenerLock(tmp_path, "Starter")
    theirs = ListenerLock(tmp_path, "Starter", process=other_live_process())
    assert theirs.try_acquire() is True
    assert mine.try_acquire() is False  # held by a live process
    assert mine.holder() == other_live_process()[0]
    theirs.release()
    assert mine.try_acquire() is True and mine.try_acquire() is True  # free, then already ours
    assert ListenerLock(tmp_path, "Supervisor", process=other_live_process()).try_acquire() is True  # one per function

    crashed = ListenerLock(tmp_path, "Cleanup", process=a_dead_process())
    assert crashed.try_acquire() is True  # the holder then dies without releasing
    assert ListenerLock(tmp_path, "Cleanup").try_acquire() is True


async def test_a_timer_whose_lock_another_host_holds_does_not_run_until_it_gets_the_lock(tmp_path: Path) -> None:
    runs: list[dict] = []

    async def invoke(payload: dict) -> None:
        runs.append(payload)

    holder = ListenerLock(tmp_path, "Starter", process=other_live_process())
    assert holder.try_acquire()
    runner = TimerRunner(
        "Starter",
        "*/1 * * * * *",
        run_on_startup=True,
        use_monitor=False,
        state_dir=tmp_path,
        invoke=invoke,
        lock=ListenerLock(tmp_path, "Starter"),
        recovery_poll=0.2,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(0.5)
    assert runs == []  # the other host runs the schedule
    holder.release()
    await asyncio.wait_for(_until(lambda: bool(runs)), 5)  # taken at the next recovery poll
    stop.set()
    await asyncio.wait_for(task, 5)
    assert ListenerLock(tmp_path, "Starter", process=other_live_process()).try_acquire()  # released on stop


async def _until(condition) -> None:  # type: ignore[no-untyped-def]
    while not condition():
        await asyncio.sleep(0.02)


def _config(tmp_path: Path, host_json: str) -> HostConfig:
    (tmp_path / "host.json").write_text(host_json)
    return HostConfig.load(tmp_path)


def test_partition_count_and_the_recovery_poll_come_from_host_json(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        '{"version": "2.0", "singleton": {"listenerLockRecoveryPollingInterval": "00:00:02"},'
        ' "extensions": {"durableTask": {"storageProvider": {"partitionCount": 8}}}}',
    )
    assert config.durable_options().partition_count == 8
    assert config.listener_lock_recovery_seconds() == 2.0
    defaults = _config(tmp_path, '{"version": "2.0"}')
    assert defaults.durable_options().partition_count == 4  # DurableTask.AzureStorage DefaultPartitionCount
    assert defaults.listener_lock_recovery_seconds() == 60.0  # SingletonOptions: TimeSpan.FromMinutes(1)


@pytest.mark.parametrize("count", [0, 17, "many"])
def test_a_partition_count_outside_1_to_16_stops_the_host(tmp_path: Path, count: object) -> None:
    # AzureStorageOrchestrationService: "The number of partitions must be a positive integer and no greater than 16."
    config = _config(
        tmp_path,
        '{"version": "2.0", "extensions": {"durableTask": {"storageProvider": '
        f'{{"partitionCount": {count!r}}}}}}}}}'.replace("'", '"'),
    )
    with pytest.raises(ConfigError, match="no greater than 16"):
        config.durable_options()


def test_a_live_process_stays_alive_when_the_wall_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # psutil's create_time() adds /proc/stat's btime, read afresh each call in whole seconds, which moves when the
    # wall clock is stepped (giampaolo/psutil #1724, #2526): a live host must not be judged dead for that.
    import psutil._pslinux as pslinux

    started = process_start()
    real = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real() + 1.0)
    assert process_running(os.getpid(), started)
    assert not process_running(os.getpid(), started + 5)  # another start: another process
