"""devhost as a process: indexing, HTTP triggers, Durable over HTTP, Service Bus triggers, timers, idle CPU."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import aiohttp
import psutil
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from support.hosted import HostedSample, wait_until

from lab.system import ROOT

# Every command of `python -m devhost` and the options each one documents (docs/devhost.md shows the same synopsis).
COMMANDS = {
    "start": {"--app-dir", "--port", "--state-dir", "--log-level", "--timing"},
    "servicebus": {"--host", "--port", "--state-dir", "--config", "--faults", "--infra"},
    "demo": {
        "--orders",
        "--seed",
        "--transient-failure-rate",
        "--permanent-failure-rate",
        "--hang-rate",
        "--timeout",
        "--work-dir",
        "--hosts",
        "--transport",
        "--timing",
        "--json",
    },
    "submit": {
        "--app-dir",
        "--connection",
        "--order-id",
        "--file",
        "--count",
        "--reply-to",
        "--wait",
        "--json",
        "--host-port",
    },
    "queues": {"--app-dir", "--connection", "--peek", "--json"},
    "cancel": {"--app-dir", "--connection", "--reason", "--reply-to", "--wait", "--no-check"},
    "drill": {
        "--orders",
        "--kills",
        "--min-gap",
        "--max-gap",
        "--seed",
        "--settings",
        "--servicebus-config",
        "--timeout",
        "--work-dir",
        "--json",
        "--outage-after",
        "--outage-for",
        "--set",
        "--hang-seconds",
        "--latency-ms",
        "--restart",
        "--timing",
    },
    "drills": {"--quick", "--only", "--update", "--out", "--timeout"},
    "up": {"--app-dir", "--state-dir", "--port", "--simulator-port", "--timeout"},
    "down": {"--app-dir", "--state-dir", "--timeout"},
}


def _help(*command: str) -> str:
    """`python -m devhost [COMMAND] --help`: the top level as a subprocess (the command as a user runs it), each
    command in-process from the same parser (a subprocess each cost a second of imports)."""
    if not command:
        return subprocess.run(
            [sys.executable, "-m", "devhost", "--help"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
            env={**os.environ, "COLUMNS": "200"},
        ).stdout
    from devhost.__main__ import _parser

    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            _parser().parse_args([*command, "--help"])
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def _described_options(help_text: str) -> dict[str, str]:
    """Each option of an argparse help's "options:" section with its description."""
    section = help_text.split("\noptions:\n", 1)[1]
    out: dict[str, str] = {}
    option = r"^  (?:-\w, )?(--[\w-]+)(?: [A-Z_]+| \{[\w,]+\})?(?:  +|\n +)(\S.*)$"  # a metavar or {choices}
    for match in re.finditer(option, section, re.MULTILINE):
        out[match.group(1)] = match.group(2)
    return out


def test_help_documents_every_command_and_option() -> None:
    top = _help()
    # A command's one-line description follows its name, or the next line when the name is long (argparse).
    listed = re.findall(r"^    (\w+)(?:  +\S|\n {10,}\S)", top.split("positional arguments:", 1)[1], re.MULTILINE)
    assert sorted(listed) == sorted(COMMANDS)  # every command, each with a one-line description
    docs = (ROOT / "docs" / "devhost.md").read_text()
    synopsis = docs.split("```", 2)[1]
    for command, options in COMMANDS.items():
        described = _described_options(_help(command))
        assert set(described) == options | {"--help"}, command
        assert all(text.strip() for text in described.values()), command
        documented = set(
            re.findall(
                r"--[\w-]+", synopsis.split(f"python -m devhost {command} ", 1)[1].split("python -m devhost ", 1)[0]
            )
        )
        assert documented == options, f"docs/devhost.md synopsis of {command}"


def test_prints_the_function_list_like_func_start(host: HostedSample) -> None:
    log = host.log()
    # Core Tools prints "Functions:" then one line per function, http ones with methods and URL.
    assert "Functions:" in log
    assert f"http_start: [POST] {host.url}/api/orchestrators/{{functionName}}/{{instanceId?}}" in log
    for name, trigger in (
        ("tick", "timerTrigger"),
        ("work", "serviceBusTrigger"),
        ("slow_chain", "orchestrationTrigger"),
        ("slow_step", "activityTrigger"),
    ):
        assert f"{name}: {trigger}" in log


async def test_http_trigger_routes_methods_and_auth_levels(host: HostedSample) -> None:
    # Source: HTTP trigger docs — anonymous needs no key; function level needs x-functions-key or ?code=;
    # route constraints ({id:int}) decide matching; a wrong method is not routed.
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{host.url}/api/ping?x=1") as r:
            assert r.status == 200 and (await r.json()) == {"pong": "1"}
        async with s.get(f"{host.url}/api/secret/7") as r:
            assert r.status == 401
        async with s.get(f"{host.url}/api/secret/7", headers={"x-functions-key": "wrong"}) as r:
            assert r.status == 401
        async with s.get(f"{host.url}/api/secret/7", headers={"x-functions-key": host.function_key()}) as r:
            assert r.status == 200 and await r.text() == "id=7"
        async with s.get(f"{host.url}/api/secret/7?code={host.function_key()}") as r:
            assert r.status == 200
        async with s.get(f"{host.url}/api/secret/seven?code={host.function_key()}") as r:
            assert r.status == 404
        async with s.delete(f"{host.url}/api/ping") as r:  # the host's method is a route constraint: no route, 404
            assert r.status == 404 and await r.read() == b""


async def test_orchestration_started_over_http_completes(host: HostedSample) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{host.url}/api/orchestrators/slow_chain/chain-1?code={host.function_key()}", json=0.05
        ) as r:
            assert r.status == 202
            payload = await r.json()
        assert payload["id"] == "chain-1"
        deadline = time.monotonic() + 30
        while True:
            async with s.get(payload["statusQueryGetUri"]) as r:
                status = await r.json()
            if status["runtimeStatus"] == "Completed" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert status["runtimeStatus"] == "Completed" and status["output"] == ["step0", "step1", "step2"]


def test_service_bus_trigger_passes_message_properties(host: HostedSample) -> None:
    with host.bus.get_queue_sender("work") as sender:
        sender.send_messages(
            ServiceBusMessage(
                "hello", message_id="m-1", application_properties={"k": "v"}, reply_to="replies", correlation_id="c-1"
            )
        )
    rec = wait_until(lambda: host.records("work"), what="work record")[0]
    assert rec["id"] == "m-1" and rec["body"] == "hello" and rec["delivery"] == 1
    assert rec["props"] == {"k": "v"} and rec["reply_to"] == "replies" and rec["correlation_id"] == "c-1"


def test_plain_trigger_completes_its_message_by_default(host: HostedSample) -> None:
    # Source: host.json reference for Service Bus — autoCompleteMessages defaults to true: a message whose function
    # returned is completed. Neither the `work` function nor tests/host/sample_host_app/host.json sets it, so this is
    # the host's default path. Without the completion the message would stay locked, then (LockDuration 5 s) be
    # delivered again with a higher delivery count and end in the dead-letter queue.
    with host.bus.get_queue_sender("work") as sender:
        sender.send_messages(ServiceBusMessage("hello", message_id="done-1"))
    wait_until(lambda: host.records("work"), what="work record")
    admin = host.bus.broker
    wait_until(lambda: admin.counts("work").total == 0 and admin.counts("work").locked == 0, what="message completed")
    assert [(r["id"], r["delivery"]) for r in host.records("work")] == [("done-1", 1)]


def test_run_on_startup_runs_a_timer_once_at_host_start(host: HostedSample) -> None:
    # Source: timer trigger docs and TimerListener.StartAsync (azure-webjobs-sdk-extensions) — runOnStartup schedules
    # an immediate invocation when the listener starts, not past due. `on_startup` is due once a year.
    records = wait_until(lambda: host.records("startup"), what="startup run")
    assert [r["past_due"] for r in records] == [False]


def test_failing_function_abandons_until_max_delivery_count_then_dead_letters(host: HostedSample) -> None:
    # Source: Service Bus trigger docs — on an exception the message is abandoned; the broker dead-letters it at
    # MaxDeliveryCount (3 for this queue) with reason MaxDeliveryCountExceeded.
    with host.bus.get_queue_sender("work") as sender:
        sender.send_messages(ServiceBusMessage("fail please", message_id="bad-1"))

    def dead_lettered() -> list[object]:
        with host.bus.get_queue_receiver("work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as r:
            return list(r.peek_messages(max_message_count=10))

    dlq = wait_until(dead_lettered, what="dead-lettered message")
    assert dlq[0].message_id == "bad-1" and dlq[0].dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dlq[0].delivery_count >= 3


def test_sessions_are_fifo_and_exclusive(host: HostedSample) -> None:
    with host.bus.get_queue_sender("work-sessions") as sender:
        for seq in range(10):
            sender.send_messages(
                [ServiceBusMessage(str(seq), session_id=f"s{n}", message_id=f"s{n}-{seq}") for n in range(4)]
            )
    records = wait_until(lambda: len(host.records("session")) >= 40 and host.records("session"), what="40 records")
    by_session: dict[str, list[int]] = defaultdict(list)
    for r in records:
        by_session[r["session"]].append(r["seq"])
    assert {k: v for k, v in by_session.items()} == {f"s{n}": list(range(10)) for n in range(4)}


def _peak_overlap(records: list[dict[str, object]]) -> int:
    """Most executions in flight at once, from each record's start and end ("t") times."""
    edges = sorted([(r["start"], 1) for r in records] + [(r["t"], -1) for r in records])  # type: ignore[misc]
    peak = current = 0
    for _, delta in edges:
        current += delta
        peak = max(peak, current)
    return peak


def test_concurrency_is_bounded_by_host_json(host: HostedSample) -> None:
    # Source: host.json reference for Service Bus — maxConcurrentCalls bounds concurrent messages, and
    # maxConcurrentSessions concurrent sessions (4 each in tests/host/sample_host_app/host.json).
    with host.bus.get_queue_sender("work") as sender:
        sender.send_messages([ServiceBusMessage(f"slow {i}", message_id=f"c-{i}") for i in range(16)])
    with host.bus.get_queue_sender("work-sessions") as sender:
        sender.send_messages(
            [
                ServiceBusMessage(str(seq), session_id=f"p{n}", message_id=f"p{n}-{seq}")
                for n in range(8)
                for seq in range(3)
            ]
        )
    work = wait_until(lambda: len(host.records("work")) >= 16 and host.records("work"), what="16 messages")
    sessions = wait_until(lambda: len(host.records("session")) >= 24 and host.records("session"), what="24 msgs")
    assert 2 <= _peak_overlap(work) <= 4
    in_flight_sessions = _peak_overlap(sessions)
    assert 2 <= in_flight_sessions <= 4


def test_sdk_type_binding_settles_from_the_function(host: HostedSample) -> None:
    with host.bus.get_queue_sender("sdk") as sender:
        sender.send_messages(
            [ServiceBusMessage("fine", message_id="ok-1"), ServiceBusMessage("poison!", message_id="poison-1")]
        )
    wait_until(lambda: len(host.records("sdk")) >= 2, what="two sdk records")
    with host.bus.get_queue_receiver("sdk", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as r:
        dlq = wait_until(lambda: list(r.peek_messages(max_message_count=10)), what="dlq")
    assert [m.message_id for m in dlq] == ["poison-1"]
    assert dlq[0].dead_letter_reason == "InvalidField:body"
    assert dlq[0].dead_letter_error_description == "body says poison"
    with host.bus.get_queue_receiver("sdk") as r:
        assert list(r.peek_messages(max_message_count=10)) == []  # the fine one was completed


def test_a_missed_schedule_runs_once_at_start_with_is_past_due(make_host) -> None:  # type: ignore[no-untyped-def]
    # Source: timer trigger docs and azure-webjobs-sdk-extensions TimerListener.StartAsync — with useMonitor the
    # schedule status is persisted; an occurrence that fell due while the host was down runs once when the host
    # starts again, with IsPastDue true. An every-minute schedule keeps the monitor (a sub-minute one would not).
    host = make_host(TickSchedule="0 * * * * *").start()
    status_file = host.tmp / "state" / "timers" / "tick.json"
    wait_until(status_file.exists, what="the tick's schedule status")
    host.process.stop()
    status = json.loads(status_file.read_text())
    missed = datetime.now(UTC) - timedelta(minutes=5)  # the host was down when this occurrence fell due
    status.update(Next=missed.isoformat(), LastUpdated=(missed - timedelta(minutes=1)).isoformat())
    status_file.write_text(json.dumps(status))
    host.process.env["TickSchedule"] = "0 0 0 1 1 *"  # no regular tick soon after the restart
    host.start()
    wait_until(lambda: len(host.records("tick")) >= 1, what="past-due tick")
    assert [r["past_due"] for r in host.records("tick")] == [True]


def test_a_sub_minute_schedule_runs_without_the_monitor_even_when_asked(make_host) -> None:  # type: ignore[no-untyped-def]
    # Source: azure-webjobs-sdk-extensions TimerSchedule.Create — `if (attribute.UseMonitor &&
    # ShouldDisableScheduleMonitor(schedule, now)) attribute.UseMonitor = false`: `tick` says use_monitor=True, but
    # an every-second schedule persists no status, and its runs are scheduled ones (IsPastDue false).
    host = make_host(TickSchedule="*/1 * * * * *").start()
    wait_until(lambda: len(host.records("tick")) >= 2, what="two ticks")
    assert not (host.tmp / "state" / "timers" / "tick.json").exists()
    assert {r["past_due"] for r in host.records("tick")} == {False}


def test_idle_devhost_uses_almost_no_cpu(host: HostedSample) -> None:
    proc = psutil.Process(host.process.proc.pid)  # type: ignore[union-attr]
    time.sleep(1.0)  # let start-up settle
    before = proc.cpu_times()
    time.sleep(3.0)  # the measurement window
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    assert used / 3.0 < 0.03, f"idle devhost used {used / 3.0:.1%} of a core"


def test_demo_refuses_fewer_than_one_host_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devhost", "demo", "--hosts", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "devhost demo: --hosts must be at least 1"
