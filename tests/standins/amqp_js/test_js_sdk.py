"""The unmodified @azure/service-bus JavaScript SDK (rhea, a second AMQP 1.0 implementation) against the embedded
broker's AMQP endpoint: every scenario of conformance.mjs passes, and a message the JS SDK sends reads back the same
through azure-servicebus over AMQP and through the embedded client from the same broker file.

The scenarios are the Service Bus behaviours of issue 23, point 3, each in conformance.mjs with the SDK calls it
makes; error codes are the SDK's (`ServiceBusError.code`, @azure/service-bus serviceBusError.ts). One node run serves
the module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.amqp_endpoint import ROOT, Served, served_subprocess

SCRIPT = Path(__file__).with_name("conformance.mjs")
PACKAGE = ROOT / "node_modules" / "@azure" / "service-bus" / "package.json"
NODE_TIMEOUT_SECONDS = 120.0
# The scenarios conformance.mjs runs (its --list must name exactly these).
SCENARIOS = (
    "send_receive_complete",
    "batch_send_in_order",
    "abandon_counts_a_delivery",
    "defer_and_receive_deferred",
    "dead_letter_with_reason",
    "receive_and_delete",
    "peek_does_not_lock",
    "duplicate_detection",
    "scheduled_and_cancelled",
    "renew_message_lock",
    "message_lock_expiry",
    "size_limit",
    "entity_not_found",
    "session_fifo_and_state",
    "session_exclusive_lock",
    "next_available_session",
    "session_lock_expiry",
    "interop_left_for_python",
)


JsRun = tuple[Served, dict[str, dict[str, Any]]]  # the endpoint, and each scenario's result by name


def _node() -> str:
    node = shutil.which("node")
    assert node is not None and PACKAGE.exists(), "needs node and node_modules/@azure/service-bus (run `make setup`)"
    return node


def _listed() -> list[dict[str, Any]]:
    out = subprocess.run([_node(), str(SCRIPT), "--list"], capture_output=True, text=True, check=True, timeout=30)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def js_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JsRun]:
    work = tmp_path_factory.mktemp("amqp-js")
    queues = {
        entry["queue"]: {
            "RequiresSession": entry["session"],
            "RequiresDuplicateDetection": True,
            "DuplicateDetectionHistoryTimeWindow": "PT10M",
            "LockDuration": "PT5S",
            "MaxDeliveryCount": 5,
        }
        for entry in _listed()
    }
    config = work / "servicebus.config.json"
    declared = [{"Name": name, "Properties": props} for name, props in queues.items()]
    config.write_text(json.dumps({"UserConfig": {"Namespaces": [{"Name": "js", "Queues": declared}]}}))
    (work / "state").mkdir()
    with served_subprocess(work / "state", config) as endpoint:
        proc = subprocess.run(
            [_node(), str(SCRIPT)],
            env={"PATH": str(Path(_node()).parent), "SB_CONNECTION": endpoint.connection_string},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT_SECONDS,
        )
        assert proc.returncode == 0, f"conformance.mjs failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        results = {r["scenario"]: r for r in map(json.loads, proc.stdout.splitlines()) if r}
        yield endpoint, results


def test_the_script_lists_exactly_these_scenarios() -> None:
    assert [entry["name"] for entry in _listed()] == list(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_passes_on_the_javascript_sdk(js_run: JsRun, scenario: str) -> None:
    _, results = js_run
    assert scenario in results, f"{scenario} reported nothing"
    assert results[scenario]["ok"], results[scenario].get("error")


def test_a_message_from_the_javascript_sdk_reads_the_same_on_both_python_paths(js_run: JsRun) -> None:
    from azure.servicebus import ServiceBusClient as SdkClient

    from orderflow.embedded.client import ServiceBusClient as EmbeddedClient

    endpoint, _ = js_run
    queue = "js-interop-left-for-python"
    with SdkClient.from_connection_string(endpoint.connection_string) as sdk:
        with sdk.get_queue_receiver(queue) as receiver:
            (peeked,) = receiver.peek_messages(max_message_count=5)
    with EmbeddedClient.from_connection_string(f"Endpoint=embedded://{endpoint.db_path}") as embedded:
        with embedded.get_queue_receiver(queue, max_wait_time=5) as receiver:
            (received,) = receiver.receive_messages(max_message_count=5, max_wait_time=5)
            receiver.complete_message(received)
    for message in (peeked, received):
        assert b"".join(message.body) == b"from-js"
        assert (message.message_id, message.subject) == ("js-1", "interop")
        props = {(k.decode() if isinstance(k, bytes) else k): v for k, v in message.application_properties.items()}
        assert {k: (v.decode() if isinstance(v, bytes) else v) for k, v in props.items()} == {
            "origin": "javascript",
            "count": 3,
        }
