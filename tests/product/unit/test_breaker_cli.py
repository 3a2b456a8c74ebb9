"""`python -m orderflow.cli.breaker show|open|close` (also `orderflow breaker`), with app settings in its environment,
against an embedded store and the embedded broker (the repo's servicebus.config.json queues). Its `main` runs
in-process with the environment passed in (each run as a subprocess cost 2 s of imports); one test runs it as the
operator does, `python -m`, in a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orderflow.adapters import bus_from_connection_string
from orderflow.breaker import BreakerDoc, BreakerState
from orderflow.cli import breaker as breaker_cli
from orderflow.embedded._retry import Timer
from orderflow.embedded.store import open_sqlite_documents
from orderflow.messages import AlertKind, OperatorAlert
from orderflow.records import format_utc

REPO = Path(__file__).resolve().parents[3]
PROG = "python -m orderflow.cli.breaker"
ALERTS = "operator-alerts"
COLLECTION = "circuitBreakers"


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.store = tmp_path / "store.db"
        self.bus = f"Endpoint=embedded://{tmp_path / 'bus.db'};ConfigFile={REPO / 'servicebus.config.json'}"
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CosmosDb__", "ServiceBusConnection", "CircuitBreaker"))
            and k not in ("RemoteServiceName", "OperatorAlertsQueueName", "USER", "USERNAME")
        }
        self.vars = {
            **inherited,
            "CosmosDb__accountEndpoint": f"embedded://{self.store}",
            "ServiceBusConnection": self.bus,
            "CircuitBreakerFailureThreshold": "3",
            "USER": "carol",
        }

    def environment(self, **changes: str | None) -> dict[str, str]:
        env = dict(self.vars)
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(self, *args: str, **changes: str | None) -> subprocess.CompletedProcess[str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = breaker_cli.main(list(args), env=self.environment(**changes))
            except SystemExit as exited:  # argparse's usage errors
                code = int(exited.code or 0)
        return subprocess.CompletedProcess(["orderflow.cli.breaker", *args], code, out.getvalue(), err.getvalue())

    def run_as_a_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orderflow.cli.breaker", *args],
            cwd=REPO,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ok(self, *args: str, **changes: str | None) -> str:
        done = self.run(*args, **changes)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        return done.stdout

    def put(self, doc: BreakerDoc) -> None:
        async def write() -> None:
            docs = open_sqlite_documents(self.store, COLLECTION)
            try:
                found = await docs.get(doc.service)
                await docs.put(doc.service, doc.to_data(), None if found is None else found[1])
            finally:
                await docs.aclose()

        asyncio.run(write())

    def get(self, service: str = "fulfilment") -> BreakerDoc | None:
        async def read() -> tuple[dict[str, Any], str] | None:
            docs = open_sqlite_documents(self.store, COLLECTION)
            try:
                return await docs.get(service)
            finally:
                await docs.aclose()

        found = asyncio.run(read())
        return None if found is None else BreakerDoc.model_validate(found[0])

    def alerts(self) -> list[tuple[str, str, OperatorAlert]]:
        """(MessageId, Subject, alert) of every message on operator-alerts (received and completed)."""
        out = []
        with bus_from_connection_string(self.bus) as client, client.get_queue_receiver(ALERTS) as receiver:
            while messages := receiver.receive_messages(10, max_wait_time=0.5):
                for message in messages:
                    alert = OperatorAlert.model_validate_json(b"".join(message.body))
                    out.append((str(message.message_id), str(message.subject), alert))
                    receiver.complete_message(message)
        return out


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _recording(slept: list[float]) -> Any:
    async def sleep_async(self: Timer, seconds: float) -> None:
        slept.append(seconds)

    return sleep_async


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- show -----------------------------------------------------------------------------------------


def test_show_a_breaker_never_written_is_closed(env: Env) -> None:
    rows = json.loads(env.ok("show", "--json"))
    assert rows == [
        {
            "service": "fulfilment",
            "state": "closed",
            "effectiveState": "closed",
            "failuresInWindow": 0,
            "failureThreshold": 3,
            "windowSeconds": 30.0,
            "openUntil": None,
            "probesLeft": 0,
            "forced": False,
            "cooldownSeconds": 0.0,
            "changedAt": None,
            "reason": None,
            "enabled": True,
        }
    ]
    assert env.get() is None  # show writes nothing


def test_show_counts_only_the_failures_in_the_window(env: Env) -> None:
    now = datetime.now(UTC)
    env.put(BreakerDoc(service="fulfilment", failures=(now - timedelta(minutes=5), now - timedelta(seconds=1), now)))
    [row] = json.loads(env.ok("show", "--json"))
    assert row["state"] == "closed" and row["failuresInWindow"] == 2


def test_show_an_open_breaker_whose_cooldown_is_over_as_half_open(env: Env) -> None:
    now = datetime.now(UTC)
    opened = now - timedelta(seconds=20)
    env.put(
        BreakerDoc(
            service="fulfilment",
            state=BreakerState.OPEN,
            opened_at=opened,
            open_until=opened + timedelta(seconds=15),
            cooldown_seconds=15,
            changed_at=opened,
            reason="3 failed requests within 30 s",
        )
    )
    [row] = json.loads(env.ok("show", "--json"))
    assert row["state"] == "open" and row["effectiveState"] == "half-open"
    assert row["openUntil"] == format_utc(opened + timedelta(seconds=15))
    assert row["probesLeft"] == 2 and row["reason"] == "3 failed requests within 30 s"
    assert row["changedAt"] == format_utc(opened)


def test_show_several_services_as_a_table(env: Env) -> None:
    now = datetime.now(UTC)
    env.put(
        BreakerDoc(
            service="billing",
            state=BreakerState.OPEN,
            opened_at=now,
            open_until=now + timedelta(minutes=10),
            cooldown_seconds=600,
            changed_at=now,
            reason="a probe failed",
        )
    )
    out = env.ok("show", "--service", "fulfilment", "--service", "billing")
    header, fulfilment, billing = out.splitlines()
    for title in ("SERVICE", "STATE", "NOW", "FAILURES IN WINDOW", "OPEN UNTIL", "PROBES LEFT", "REASON"):
        assert title in header
    assert fulfilment.split()[:3] == ["fulfilment", "closed", "closed"]
    assert billing.split()[:3] == ["billing", "open", "open"]
    assert "a probe failed" in billing and format_utc(now + timedelta(minutes=10)) in billing


def test_show_says_when_the_breaker_is_off(env: Env) -> None:
    out = env.ok("show", CircuitBreakerFailureThreshold="0")
    assert "the breaker is off" in out


# --- open / close ---------------------------------------------------------------------------------


def test_open_holds_the_breaker_open_and_alerts_the_operators(env: Env) -> None:
    result = json.loads(env.ok("open", "--by", "alice", "--json"))
    doc = env.get()
    assert doc is not None and doc.state is BreakerState.OPEN and doc.forced and doc.open_until is None
    assert doc.reason == "forced open by alice" and doc.changed_at is not None
    assert result["breaker"]["state"] == "open" and result["breaker"]["forced"] is True

    [(message_id, subject, alert)] = env.alerts()
    assert alert.kind is AlertKind.CIRCUIT_OPENED and alert.order_id is None
    assert alert.reason == "forced open by alice"
    assert alert.details == {
        "service": "fulfilment",
        "before": "closed",
        "after": "open",
        "changedAt": format_utc(doc.changed_at),
        "source": "operator",
        "by": "alice",
    }
    assert subject == "OperatorAlert" and message_id == alert.message_id() == result["alert"]["messageId"]

    # Held: a later show, long after any cool-down, still says open.
    [row] = json.loads(env.ok("show", "--json"))
    assert row["effectiveState"] == "open" and row["probesLeft"] == 0


def test_close_resets_the_counts_and_alerts_with_the_user_as_operator(env: Env) -> None:
    now = datetime.now(UTC)
    env.put(
        BreakerDoc(
            service="fulfilment",
            state=BreakerState.OPEN,
            opened_at=now,
            open_until=now + timedelta(seconds=15),
            cooldown_seconds=15,
            changed_at=now,
            reason="x",
        )
    )
    out = env.ok("close")
    assert "alert CircuitClosed sent to operator-alerts" in out
    doc = env.get()
    assert doc is not None and doc.state is BreakerState.CLOSED and doc.failures == () and not doc.forced
    assert doc.reason == "forced closed by carol"  # $USER
    [(_, _, alert)] = env.alerts()
    assert alert.kind is AlertKind.CIRCUIT_CLOSED
    assert alert.details["before"] == "open" and alert.details["after"] == "closed"
    assert alert.details["source"] == "operator" and alert.details["by"] == "carol"


def test_a_service_that_is_not_configured_and_has_no_breaker_is_refused(env: Env) -> None:
    """A typo must not show a breaker nobody uses as closed, nor hold one open that no Agent reads."""
    for args in (("show", "--service", "fulfilmnet"), ("open", "--service", "fulfilmnet")):
        assert_one_line_error(env.run(*args), "no breaker for service 'fulfilmnet' (RemoteServiceName is 'fulfilment')")
    assert env.get("fulfilmnet") is None and env.alerts() == []


def test_open_then_close_of_another_service(env: Env) -> None:
    env.ok("open", "--service", "billing", "--by", "dave", "--new")
    env.ok("close", "--service", "billing", "--by", "dave")
    assert env.get() is None  # the default service was not touched
    doc = env.get("billing")
    assert doc is not None and doc.state is BreakerState.CLOSED and doc.reason == "forced closed by dave"
    alerts = env.alerts()
    assert [a.kind for _, _, a in alerts] == [AlertKind.CIRCUIT_OPENED, AlertKind.CIRCUIT_CLOSED]
    assert {a.details["service"] for _, _, a in alerts} == {"billing"}
    assert len({m for m, _, _ in alerts}) == 2


def test_the_alert_queue_setting_is_honoured(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # A missing queue is retried as the SDK retries it (_base_handler.py `_open_with_retry`): recorded, not slept.
    slept: list[float] = []
    monkeypatch.setattr(Timer, "sleep_async", _recording(slept))
    done = env.run("open", OperatorAlertsQueueName="no-such-queue")
    assert_one_line_error(done, "no-such-queue", "could not be sent")
    assert slept == [1.6, 3.2, 6.4]
    doc = env.get()  # the breaker was forced; the line says so
    assert doc is not None and doc.state is BreakerState.OPEN
    assert "forced open by carol" in done.stderr


# --- errors: one line, exit 1 ---------------------------------------------------------------------


def test_missing_store_setting(env: Env) -> None:
    assert_one_line_error(env.run("show", CosmosDb__accountEndpoint=None), "CosmosDb__accountEndpoint")


def test_unreachable_store(env: Env, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = env.run("show", CosmosDb__accountEndpoint=f"embedded://{blocker / 'store.db'}")
    assert_one_line_error(done, "cannot open the breaker store", str(blocker))


def test_missing_bus_setting_changes_nothing(env: Env) -> None:
    done = env.run("open", ServiceBusConnection=None)
    assert_one_line_error(done, "ServiceBusConnection")
    assert env.get() is None


def test_invalid_breaker_setting(env: Env) -> None:
    assert_one_line_error(env.run("show", CircuitBreakerProbes="two"), "CircuitBreakerProbes")


def test_usage_error_is_argparse_exit_2(env: Env) -> None:
    done = env.run("half-open")
    assert done.returncode == 2 and "invalid choice" in done.stderr and "Traceback" not in done.stderr


def test_python_dash_m_runs_the_command(env: Env) -> None:
    done = env.run_as_a_command("show", "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["service"] == "fulfilment" and row["state"] == "closed"
