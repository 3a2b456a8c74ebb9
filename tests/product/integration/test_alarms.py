"""The alarms (issue 26, "Alarms before stuck"): first their evaluation, pure (orderflow/alarms.py: the thresholds
follow the settings by their documented formulas, each alarm fires when its condition holds and is quiet on a healthy
state, the samples stay bounded, a timer's period is read from its NCRONTAB schedule as the host runs it); then the
alarm timer (triggers/alarms.py) and the ops summary in one process, on the embedded store and broker with a
FakeClock: each alarm forced through the pipeline's own moves (orders left in Pending, a claim left in Processing,
orders submitted faster than they drain, messages dead-lettered) fires, with the metrics the Bicep alerts read
(`orderflow.alarm.firing`, `orderflow.orders.oldest_age`, `orderflow.backlog.growth`) and one alert event when it
starts firing; a healthy system fires none; the summary shows what the timer computes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from croniter import croniter
from opentelemetry.instrumentation.logging.handler import LoggingHandler
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from support.integration_support import MetricPoints, Pipeline, claim_orders, submit_orders, tunables
from support.ops_support import in_state

from orderflow import alarms, telemetry
from orderflow import state_machine as sm
from orderflow.alarms import AlarmConfig, Snapshot
from orderflow.messages import STEPS
from orderflow.operations import Operations
from orderflow.records import OrderStateRecord, ProcessState
from orderflow.runtime import Services
from triggers import alarms as alarm_trigger

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
TUNABLES = tunables()  # ClaimLeaseSeconds 30, StepTimeoutSeconds 10, RetryBackoffMaxSeconds 60
CONFIG = AlarmConfig.from_env(TUNABLES, {})


def test_the_thresholds_are_the_documented_formulas_of_the_settings() -> None:
    # StarterSchedule */15 s, SupervisorSchedule */10 s, CircuitBreakerMaxCooldownSeconds 300 (the defaults).
    assert CONFIG.pending_threshold == timedelta(seconds=15 + max(60, 300) + 30)
    assert CONFIG.processing_threshold == timedelta(seconds=30 + len(STEPS) * 10 + 10 + 60)
    assert (CONFIG.growth_orders, CONFIG.growth_window, CONFIG.sender_dead_letters) == (100, timedelta(minutes=15), 20)
    assert CONFIG.system_queues == {"agent-requests", "agent-replies", "operator-alerts"}
    assert CONFIG.queues == CONFIG.system_queues | {"orders-inbound", "app-orders", "app-status"}


@pytest.mark.parametrize(
    ("env", "tunable", "pending", "processing"),
    [
        ({"StarterSchedule": "0 * * * * *"}, {}, 45, 0),  # a Starter every minute instead of every 15 s
        ({"SupervisorSchedule": "0 */5 * * * *"}, {}, 0, 290),  # a Supervisor every 5 minutes instead of 10 s
        ({"CircuitBreakerMaxCooldownSeconds": "900"}, {}, 600, 0),  # the longest deferral is now the cool-down
        ({}, {"claim_lease": timedelta(seconds=90)}, 60, 60),
        ({}, {"step_timeout": timedelta(seconds=20)}, 0, len(STEPS) * 10),
    ],
)
def test_each_threshold_moves_with_its_settings(
    env: dict[str, str], tunable: dict[str, timedelta], pending: int, processing: int
) -> None:
    config = AlarmConfig.from_env(replace(TUNABLES, **tunable), env)
    assert (config.pending_threshold - CONFIG.pending_threshold).total_seconds() == pending
    assert (config.processing_threshold - CONFIG.processing_threshold).total_seconds() == processing


def test_the_backoff_term_is_the_retry_backoff_cap() -> None:
    longer = AlarmConfig.from_env(tunables(), {"CircuitBreakerMaxCooldownSeconds": "30"})
    assert longer.backoff_max == timedelta(seconds=60)  # RetryBackoffMaxSeconds of the test tunables
    assert longer.pending_threshold == timedelta(seconds=15 + 60 + 30)  # the backoff now outlasts the cool-down


def test_growth_and_dead_letter_settings_are_read() -> None:
    config = AlarmConfig.from_env(
        TUNABLES,
        {"BacklogGrowthAlarmOrders": "7", "BacklogGrowthWindowSeconds": "60", "SenderDeadLetterAlarmDepth": "3"},
    )
    assert (config.growth_orders, config.growth_window, config.sender_dead_letters) == (7, timedelta(minutes=1), 3)
    assert config.dead_letter_threshold("app-orders") == 3 and config.dead_letter_threshold("agent-replies") == 0


@pytest.mark.parametrize(
    "expression",
    [
        "*/15 * * * * *",
        "*/10 * * * * *",
        "0 * * * * *",
        "10,20,45 * * * * *",
        "0 */5 * * * *",
        "5-10/2 3 * * * *",
        "0 30 9 * * Mon-Fri",
        "0 0 0 1 1 *",
        "0 0 12 * Feb,Aug Sun",
    ],
)
def test_a_schedules_period_is_the_longest_gap_between_its_runs(expression: str) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    runs = croniter(expression, start, second_at_beginning=True)
    times = [runs.get_next(datetime) for _ in range(400)]
    within = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert alarms.schedule_period(expression) >= within
    if within < timedelta(days=1):  # sub-day schedules repeat daily: 400 runs see every gap
        assert alarms.schedule_period(expression) == within


def test_a_bad_schedule_is_refused() -> None:
    for expression in ("* * * * *", "61 * * * * *", "*/0 * * * * *"):
        with pytest.raises(ValueError, match="NCRONTAB"):
            alarms.schedule_period(expression)


# --- the evaluation -----------------------------------------------------------------------------------------------


def _record(state: ProcessState, age: timedelta, **changes: object) -> OrderStateRecord:
    return in_state("o-1", state, NOW - age).model_copy(update=changes)


def _by_key(found: list[alarms.Alarm]) -> dict[str, alarms.Alarm]:
    return {a.key: a for a in found}


HEALTHY = Snapshot(
    NOW,
    pending=5,
    oldest_due_pending=_record(ProcessState.PENDING, timedelta(seconds=20)),
    oldest_processing=_record(ProcessState.PROCESSING, timedelta(seconds=40)),
    dead_letters={"agent-requests": {"count": 0, "capped": False}, "app-orders": {"count": 20, "capped": False}},
)
STEADY = [(NOW - timedelta(minutes=16), 5), (NOW - timedelta(minutes=1), 6)]


def test_a_healthy_state_fires_nothing_and_each_alarm_names_its_runbook_row() -> None:
    found = alarms.evaluate(CONFIG, HEALTHY, STEADY)
    assert [(a.key, a.firing) for a in found] == [
        ("oldest-pending", False),
        ("oldest-processing", False),
        ("backlog-growth", False),
        ("dead-letters:agent-requests", False),
        ("dead-letters:app-orders", False),  # 20 is the sender threshold, not over it
    ]
    assert {a.name: a.runbook for a in found} == {
        "oldest-pending": "Orders wait too long in Pending",
        "oldest-processing": "Orders stay too long in Processing",
        "backlog-growth": "The backlog grows faster than it drains",
        "dead-letters": "A dead-letter queue grows",
    }
    assert _by_key(found)["backlog-growth"].value == 0  # 5 now, 5 a window ago
    assert _by_key(found)["oldest-pending"].to_json() == {
        "name": "oldest-pending",
        "queue": None,
        "value": 20.0,
        "threshold": CONFIG.pending_threshold.total_seconds(),
        "firing": False,
        "runbook": "Orders wait too long in Pending",
        "orderId": "o-1",
        "detail": None,
    }


@pytest.mark.parametrize("state", [ProcessState.PENDING, ProcessState.PROCESSING])
def test_the_oldest_order_fires_only_past_its_threshold(state: ProcessState) -> None:
    field = "oldest_due_pending" if state is ProcessState.PENDING else "oldest_processing"
    name = "oldest-pending" if state is ProcessState.PENDING else "oldest-processing"
    limit = CONFIG.pending_threshold if state is ProcessState.PENDING else CONFIG.processing_threshold
    at_limit = replace(HEALTHY, **{field: _record(state, limit)})
    past = replace(HEALTHY, **{field: _record(state, limit + timedelta(seconds=1))})
    assert not _by_key(alarms.evaluate(CONFIG, at_limit, STEADY))[name].firing
    alarm = _by_key(alarms.evaluate(CONFIG, past, STEADY))[name]
    assert alarm.firing and alarm.value == limit.total_seconds() + 1 and alarm.order_id == "o-1"


def test_no_order_in_the_state_is_quiet() -> None:
    empty = replace(HEALTHY, oldest_due_pending=None, oldest_processing=None)
    found = _by_key(alarms.evaluate(CONFIG, empty, STEADY))
    assert (found["oldest-pending"].value, found["oldest-pending"].firing) == (None, False)
    assert (found["oldest-processing"].value, found["oldest-processing"].firing) == (None, False)


def test_the_backlog_fires_when_it_grew_by_more_than_the_setting_over_the_window() -> None:
    window_ago = [(NOW - timedelta(minutes=20), 0), (NOW - timedelta(minutes=15), 10), (NOW - timedelta(minutes=5), 50)]
    assert not _by_key(alarms.evaluate(CONFIG, replace(HEALTHY, pending=110), window_ago))["backlog-growth"].firing
    grown = _by_key(alarms.evaluate(CONFIG, replace(HEALTHY, pending=111), window_ago))["backlog-growth"]
    assert grown.firing and grown.value == 101  # measured from the newest sample a window old (10), not older
    assert alarms.evaluate(CONFIG, HEALTHY, [])[2].value is None  # no sample yet: no figure, quiet


def test_a_short_history_counts_from_its_first_sample_and_a_stale_one_is_ignored() -> None:
    short = [(NOW - timedelta(minutes=5), 0)]
    assert alarms.growth(short, 101, NOW, CONFIG.growth_window) == 101
    stale = [(NOW - timedelta(hours=2), 0)]  # the timer stopped two hours ago
    assert alarms.growth(stale, 500, NOW, CONFIG.growth_window) is None


def test_a_system_queue_fires_on_one_dead_letter_a_senders_past_its_depth() -> None:
    snap = replace(
        HEALTHY,
        dead_letters={
            "agent-replies": {"count": 1, "capped": False},
            "app-status": {"count": 21, "capped": False},
            "orders-inbound": {"count": 3, "capped": False},
            "operator-alerts": {"error": "not read: no Listen right"},
        },
    )
    found = _by_key(alarms.evaluate(CONFIG, snap, STEADY))
    assert [(k, a.firing, a.threshold) for k, a in found.items() if a.name == "dead-letters"] == [
        ("dead-letters:agent-replies", True, 0),
        ("dead-letters:app-status", True, 20),
        ("dead-letters:operator-alerts", False, 0),
        ("dead-letters:orders-inbound", False, 20),
    ]
    assert found["dead-letters:operator-alerts"].detail == "not read: no Listen right"


def test_the_samples_stay_bounded_and_keep_a_baseline_a_window_old() -> None:
    samples: list[alarms.Sample] = []
    at = NOW
    for n in range(1000):  # a tick every 5 s for 83 minutes, more often than the window needs
        at = NOW + timedelta(seconds=5 * n)
        samples = alarms.with_sample(samples, at, n, CONFIG.growth_window)
        assert len(samples) <= alarms.MAX_SAMPLES + 1
    assert samples[0][0] <= at - CONFIG.growth_window < samples[1][0]
    assert all(
        b[0] - a[0] >= CONFIG.growth_window / alarms.MAX_SAMPLES for a, b in zip(samples, samples[1:], strict=False)
    )
    assert alarms.growth(samples, 999, at, CONFIG.growth_window) == 999 - samples[0][1]


def test_stored_samples_read_back_and_a_malformed_one_is_skipped() -> None:
    data = {"samples": [["2026-03-02T11:50:00.000000Z", 4], ["not a time", 1], ["2026-03-02T11:40:00.000000Z", 2]]}
    assert alarms.samples_of(data) == [(NOW - timedelta(minutes=20), 2), (NOW - timedelta(minutes=10), 4)]


# --- the timer and the summary, in one process -----------------------------------------------------------------

SETTINGS = {"BacklogGrowthAlarmOrders": "3", "BacklogGrowthWindowSeconds": "600", "SenderDeadLetterAlarmDepth": "2"}


def ops(services: Services) -> Operations:
    return Operations(services, alarm_config=AlarmConfig.from_env(services.tunables, SETTINGS))


async def tick(services: Services) -> dict[str, alarms.Alarm]:
    """One run of the alarm timer's work; the alarms by key."""
    return {a.key: a for a in await ops(services).alarm_tick()}


def firing(found: dict[str, alarms.Alarm]) -> set[str]:
    return {key for key, alarm in found.items() if alarm.firing}


def gauge(points: dict[str, list[Any]], name: str, **attributes: str) -> float | None:
    found = [p for p in points.get(name, []) if dict(p.attributes or {}) == attributes]
    return found[-1].value if found else None


@pytest.fixture
def events() -> Iterator[InMemoryLogRecordExporter]:
    """The alert events, as azure-monitor-opentelemetry's handler on the `orderflow` loggers hands them on."""
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    handler = LoggingHandler(logger_provider=provider)
    logging.getLogger("orderflow").addHandler(handler)
    yield exporter
    logging.getLogger("orderflow").removeHandler(handler)
    provider.shutdown()


def alarm_events(exporter: InMemoryLogRecordExporter) -> list[dict[str, Any]]:
    return [
        dict(r.log_record.attributes or {})
        for r in exporter.get_finished_logs()
        if (r.log_record.attributes or {}).get("kind") == alarms.ALERT_KIND
    ]


async def dead_letter(services: Services, queue: str, count: int, session: bool = True) -> None:
    for n in range(count):
        async with services.bus.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("{}", session_id=f"s-{n}" if session else None))
        receiving = {"session_id": f"s-{n}"} if session else {}
        async with services.bus.get_queue_receiver(queue, **receiving) as receiver:
            [message] = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            await receiver.dead_letter_message(message, reason="Test", error_description="forced by the test")


async def test_a_healthy_system_fires_no_alarm(pipeline: Pipeline, metric_points: MetricPoints) -> None:
    await claim_orders(pipeline, "o-1")
    await submit_orders(pipeline, "o-2")
    pipeline.clock.advance(30)
    found = await tick(pipeline.services)
    assert firing(found) == set()
    assert set(found) == {
        "oldest-pending",
        "oldest-processing",
        "backlog-growth",
        *(f"dead-letters:{q}" for q in sorted(AlarmConfig.from_env(pipeline.services.tunables).queues)),
    }
    points = metric_points()
    for key, alarm in found.items():
        assert (
            gauge(points, "orderflow.alarm.firing", alarm=alarm.name, **({"queue": alarm.queue} if alarm.queue else {}))
            == 0
        ), key
    assert gauge(points, "orderflow.orders.oldest_age", state="Pending") == 30
    assert gauge(points, "orderflow.orders.oldest_age", state="Processing") == 30
    assert gauge(points, "orderflow.backlog.growth") == 0  # the first sample is its own baseline


async def test_an_order_left_in_pending_fires_and_its_age_is_the_metric(
    pipeline: Pipeline, metric_points: MetricPoints
) -> None:
    config = ops(pipeline.services).alarm_settings()
    await submit_orders(pipeline, "o-wait")  # nothing claims it: the Starter is down
    pipeline.clock.advance(config.pending_threshold)
    assert "oldest-pending" not in firing(await tick(pipeline.services))
    pipeline.clock.advance(1)
    found = await tick(pipeline.services)
    assert firing(found) == {"oldest-pending"} and found["oldest-pending"].order_id == "o-wait"
    points = metric_points()
    assert gauge(points, "orderflow.alarm.firing", alarm="oldest-pending") == 1
    assert gauge(points, "orderflow.orders.oldest_age", state="Pending") == config.pending_threshold.total_seconds() + 1


async def test_an_order_waiting_for_its_retry_at_is_not_stuck_but_one_behind_it_is(pipeline: Pipeline) -> None:
    config = ops(pipeline.services).alarm_settings()
    await claim_orders(pipeline, "o-deferred")
    later = pipeline.clock.now() + 2 * config.pending_threshold  # an open breaker's long retry-after
    await pipeline.services.state.update_with_retry(
        "o-deferred", lambda r: sm.defer(r, "o-deferred:1", later, pipeline.clock.now(), "breaker open")
    )
    pipeline.clock.advance(1)
    await submit_orders(pipeline, "o-due")  # younger, due at once
    pipeline.clock.advance(config.pending_threshold + timedelta(seconds=1))
    found = await tick(pipeline.services)
    assert found["oldest-pending"].order_id == "o-due" and found["oldest-pending"].firing
    summary = await ops(pipeline.services).summary()
    assert summary["oldestPending"]["orderId"] == "o-deferred"  # the oldest Pending, deferred or not
    assert [a["orderId"] for a in summary["alarms"] if a["name"] == "oldest-pending"] == ["o-due"]
    await pipeline.services.state.update_with_retry(
        "o-due", lambda r: sm.claim(r, "o-due:1", later, pipeline.clock.now())
    )
    assert not (await tick(pipeline.services))["oldest-pending"].firing  # only the deferred one is left
    pipeline.clock.set(later + timedelta(seconds=1))
    assert (await tick(pipeline.services))["oldest-pending"].order_id == "o-deferred"  # due now, and old


async def test_a_claim_left_in_processing_fires(pipeline: Pipeline, metric_points: MetricPoints) -> None:
    config = ops(pipeline.services).alarm_settings()
    await claim_orders(pipeline, "o-run")  # no Scheduler, and no Supervisor to recover it
    pipeline.clock.advance(config.processing_threshold)
    assert not (await tick(pipeline.services))["oldest-processing"].firing
    pipeline.clock.advance(1)
    found = await tick(pipeline.services)
    assert "oldest-processing" in firing(found) and found["oldest-processing"].order_id == "o-run"
    points = metric_points()
    assert gauge(points, "orderflow.alarm.firing", alarm="oldest-processing") == 1
    assert gauge(points, "orderflow.orders.oldest_age", state="Processing") == (
        config.processing_threshold.total_seconds() + 1
    )


async def test_the_backlog_growth_survives_a_restart_and_counts_across_instances(
    pipeline: Pipeline, metric_points: MetricPoints
) -> None:
    await tick(pipeline.services)  # the baseline: no order
    pipeline.clock.advance(300)
    await submit_orders(pipeline, "o-1", "o-2", "o-3")
    other = await pipeline.peer()  # another instance (or this one restarted): only the stored samples carry over
    assert not (await tick(other))["backlog-growth"].firing  # grew by 3: not more than 3
    pipeline.clock.advance(300)
    await submit_orders(pipeline, "o-4")
    found = await tick(other)
    assert found["backlog-growth"].firing and found["backlog-growth"].value == 4
    assert gauge(metric_points(), "orderflow.backlog.growth") == 4
    assert gauge(metric_points(), "orderflow.alarm.firing", alarm="backlog-growth") == 1
    pipeline.clock.advance(301)  # a window after the 3rd order: the baseline is now the sample with 3
    assert not (await tick(pipeline.services))["backlog-growth"].firing
    data, _ = await alarms.read_document(pipeline.services.state)
    assert [n for _, n in data["samples"]] == [3, 4, 4]


async def test_dead_letters_fire_on_any_system_queue_and_past_the_depth_on_a_senders(
    pipeline: Pipeline, metric_points: MetricPoints
) -> None:
    await dead_letter(pipeline.services, "app-orders", 2)
    await dead_letter(pipeline.services, "operator-alerts", 1, session=False)
    found = await tick(pipeline.services)
    assert firing(found) == {"dead-letters:operator-alerts"}
    assert (found["dead-letters:app-orders"].value, found["dead-letters:app-orders"].threshold) == (2, 2)
    await dead_letter(pipeline.services, "agent-requests", 1)
    await dead_letter(pipeline.services, "app-orders", 1)
    found = await tick(pipeline.services)
    assert firing(found) == {"dead-letters:operator-alerts", "dead-letters:agent-requests", "dead-letters:app-orders"}
    points = metric_points()
    assert gauge(points, "orderflow.alarm.firing", alarm="dead-letters", queue="app-orders") == 1
    assert gauge(points, "orderflow.alarm.firing", alarm="dead-letters", queue="agent-replies") == 0


async def test_an_alarm_raises_its_event_once_when_it_starts_firing(
    pipeline: Pipeline, events: InMemoryLogRecordExporter
) -> None:
    await dead_letter(pipeline.services, "agent-replies", 1)
    for _ in range(3):  # still firing: no second event
        await tick(pipeline.services)
        pipeline.clock.advance(60)
    [event] = alarm_events(events)
    assert {k: event[k] for k in ("microsoft.custom_event.name", "alarm", "queue", "runbook")} == {
        "microsoft.custom_event.name": telemetry.ALERT_EVENT_NAME,
        "alarm": "dead-letters",
        "queue": "agent-replies",
        "runbook": "A dead-letter queue grows",
    }
    assert "runbook: README, Operating it, 'A dead-letter queue grows'" in event["reason"]
    other = await pipeline.peer()  # another instance sees the same firing set: no event either
    await tick(other)
    assert len(alarm_events(events)) == 1
    async with pipeline.services.bus.get_queue_receiver(
        "agent-replies", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as receiver:
        for message in await receiver.receive_messages(max_message_count=5, max_wait_time=5):
            await receiver.complete_message(message)
    assert not firing(await tick(pipeline.services))  # quiet again: no event
    await dead_letter(pipeline.services, "agent-replies", 1)
    await tick(pipeline.services)  # fires again: a new event
    assert [e["queue"] for e in alarm_events(events)] == ["agent-replies", "agent-replies"]


async def test_the_summary_shows_the_alarms_the_timer_computes(pipeline: Pipeline) -> None:
    config = ops(pipeline.services).alarm_settings()
    await claim_orders(pipeline, "o-run")
    await submit_orders(pipeline, "o-wait")
    await dead_letter(pipeline.services, "agent-requests", 1)
    pipeline.clock.advance(max(config.pending_threshold, config.processing_threshold) + timedelta(seconds=1))
    timer = [a.to_json() for a in (await tick(pipeline.services)).values()]
    summary = await ops(pipeline.services).summary()
    assert summary["alarms"] == timer
    assert {a["name"] for a in summary["alarms"] if a["firing"]} == {
        "oldest-pending",
        "oldest-processing",
        "dead-letters",
    }
    assert summary["oldestProcessing"]["orderId"] == "o-run"
    assert summary["oldestProcessing"]["ageSeconds"] > config.processing_threshold.total_seconds()


async def test_the_timer_trigger_runs_the_alarms_on_the_apps_services(replies: Pipeline) -> None:
    await submit_orders(replies, "o-wait")
    replies.clock.advance(AlarmConfig.from_env(replies.services.tunables).pending_threshold + timedelta(seconds=1))
    await alarm_trigger.alarms(None)  # type: ignore[arg-type]  # the timer's TimerRequest is not read
    data, _ = await alarms.read_document(replies.services.state)
    assert data["firing"] == ["oldest-pending"] and [n for _, n in data["samples"]] == [1]
