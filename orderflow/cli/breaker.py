"""Operator command of the shared circuit breakers (orderflow/breaker.py).

    python -m orderflow.cli.breaker show  [--service NAME]... [--json]
    python -m orderflow.cli.breaker open  [--service NAME] [--by WHO] [--json]
    python -m orderflow.cli.breaker close [--service NAME] [--by WHO] [--json]

`show` prints each breaker's stored and current state; `open` holds it open until an operator closes it; `close`
closes it and resets its counts. Both write through `SharedBreaker.force` and raise `CircuitOpened` / `CircuitClosed`
on the operator-alerts queue. App settings come from the environment under the Functions app's names. A failure is
one line on stderr and exit status 1. Output fields and settings: docs/modules-product.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from orderflow import settings
from orderflow.breaker import (
    BreakerConfig,
    BreakerState,
    SharedBreaker,
    Transition,
    breaker_row,
    show_breakers,
)
from orderflow.cli.common import CliError, one_line, operator_name
from orderflow.clock import Clock, SystemClock
from orderflow.embedded.connection import settings_as
from orderflow.embedded.rights import OPERATORS
from orderflow.messages import AlertKind
from orderflow.ports import BusClient
from orderflow.records import format_utc

PROG = "python -m orderflow.cli.breaker"
DEFAULT_TIMEOUT_SECONDS = 60.0
COLUMNS = (
    ("service", "SERVICE"),
    ("state", "STATE"),
    ("effectiveState", "NOW"),
    ("failures", "FAILURES IN WINDOW"),
    ("openUntil", "OPEN UNTIL"),
    ("probesLeft", "PROBES LEFT"),
    ("reason", "REASON"),
)


def add_commands(sub: Any) -> list[argparse.ArgumentParser]:
    """show, open and close under `sub` (this module's parser, and `orderflow breaker`); the parsers made."""
    show = sub.add_parser("show", help="print the breaker(s)")
    show.add_argument(
        "--service",
        action="append",
        default=None,
        metavar="NAME",
        help="remote service (repeatable; default: RemoteServiceName)",
    )
    made = [show]
    for name, text in (
        ("open", "hold the breaker open until an operator closes it"),
        ("close", "close the breaker and reset its counts"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--service", default=None, metavar="NAME", help="remote service (default: RemoteServiceName)")
        cmd.add_argument("--by", default=None, metavar="WHO", help="operator named in the reason (default: $USER)")
        cmd.add_argument(
            "--new", action="store_true", help="allow a service that is not RemoteServiceName and has no breaker yet"
        )
        made.append(cmd)
    for cmd in made:
        cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return made


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Show, force open or force closed the shared circuit breaker of a remote service."
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"give up after this many seconds (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the store and bus clients do")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{show,open,close}")
    add_commands(sub)
    return parser


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    def cell(row: Mapping[str, Any], key: str) -> str:
        if key == "failures":
            return f"{row['failuresInWindow']}/{row['failureThreshold']} in {row['windowSeconds']:g} s"
        if key == "state" and row["forced"]:
            return f"{row['state']} (forced)"
        value = row[key]
        return "-" if value is None else str(value)

    table = [[title for _, title in COLUMNS]] + [[cell(row, key) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() for line in table]
    if any(not row["enabled"] for row in rows):
        lines.append("(the breaker is off: CircuitBreakerFailureThreshold is 0)")
    return "\n".join(lines)


def _setting(name: str, env: Mapping[str, str]) -> str:
    value = settings.get(name, env)
    if not value:
        raise CliError(f"app setting {name} is not set")
    return value


def _open_documents(env: Mapping[str, str]) -> Any:
    from orderflow.adapters import open_breaker_documents  # lazily: the store SDKs are heavy

    endpoint = _setting("CosmosDb__accountEndpoint", env)
    try:
        return open_breaker_documents(env)
    except Exception as exc:
        raise CliError(f"cannot open the breaker store {endpoint}: {one_line(exc)}") from exc


def _open_bus(env: Mapping[str, str]) -> BusClient:
    from orderflow.adapters import aio_bus_from_settings

    try:
        return aio_bus_from_settings(env)
    except Exception as exc:
        raise CliError(f"cannot open the Service Bus client: {one_line(exc)}") from exc


async def force(
    service: str,
    state: BreakerState,
    by: str,
    documents: Any,
    bus: BusClient,
    alerts_queue: str,
    config: BreakerConfig,
    clock: Clock,
) -> dict[str, Any]:
    """Force the breaker, then raise the operator alert; the breaker's row and the alert sent."""
    from orderflow.outbound import raise_alert

    seen: list[Transition] = []

    async def remember(transition: Transition) -> None:
        seen.append(transition)

    breaker = SharedBreaker(documents, service, config, clock, remember)
    try:
        written = await breaker.force(state, by)
    except Exception as exc:
        raise CliError(f"cannot force breaker {service!r} {state.value}: {one_line(exc)}") from exc
    before = seen[0].before if seen else written.state  # no transition: it already was in that state
    changed_at = written.changed_at or clock.now()
    kind = AlertKind.CIRCUIT_OPENED if state is BreakerState.OPEN else AlertKind.CIRCUIT_CLOSED
    details = {
        "service": service,
        "before": before.value,
        "after": written.state.value,
        "changedAt": format_utc(changed_at),
        "source": "operator",
        "by": by,
    }
    try:
        alert = await raise_alert(
            bus, alerts_queue, kind=kind, order_id=None, reason=written.reason or "", now=clock.now(), details=details
        )
    except Exception as exc:
        raise CliError(
            f"breaker {service!r} is {written.state.value} ({written.reason}) but the operator alert "
            f"could not be sent to {alerts_queue}: {one_line(exc)}"
        ) from exc
    return {
        "breaker": breaker_row(service, written, config, clock.now()),
        "alert": {"kind": kind.value, "queue": alerts_queue, "messageId": alert.message_id(), "details": details},
    }


async def _known(services: Sequence[str], configured: str, documents: Any, new: bool) -> None:
    """Refuse a service that is neither `RemoteServiceName` nor already has a breaker document (a typo would
    otherwise show a breaker nobody uses as closed, or hold one open that no Agent reads); `--new` allows it for
    open and close (a service whose Agents are configured but have not written yet)."""
    unknown = [s for s in services if s != configured and await documents.get(s) is None]
    if unknown and not new:
        raise CliError(
            f"no breaker for service {unknown[0]!r} (RemoteServiceName is {configured!r}); "
            "check the name, or pass --new to open or close a breaker that does not exist yet"
        )


async def run(args: argparse.Namespace, env: Mapping[str, str], clock: Clock) -> str:
    """The command's output (raises CliError, or another exception, on failure)."""
    try:
        config = BreakerConfig.from_env(env)
    except (ValueError, KeyError) as exc:
        raise CliError(f"invalid circuit-breaker settings: {one_line(exc)}") from exc
    default_service = settings.get("RemoteServiceName", env) or "fulfilment"
    if args.command == "show":
        documents = _open_documents(env)
        try:
            wanted = args.service or [default_service]
            await _known(wanted, default_service, documents, new=False)
            rows = await show_breakers(wanted, documents, config, clock)
        finally:
            await documents.aclose()
        return json.dumps(rows, indent=2) if args.json else render_table(rows)

    state = BreakerState.OPEN if args.command == "open" else BreakerState.CLOSED
    alerts_queue = _setting("OperatorAlertsQueueName", env)
    bus = _open_bus(env)  # before anything is written: a missing bus setting changes nothing
    try:
        documents = _open_documents(env)
        try:
            service = args.service or default_service
            await _known([service], default_service, documents, new=getattr(args, "new", False))
            result = await force(
                service, state, operator_name(args.by, env), documents, bus, alerts_queue, config, clock
            )
        finally:
            await documents.aclose()
    finally:
        await bus.close()
    if args.json:
        return json.dumps(result, indent=2)
    alert = result["alert"]
    return f"{render_table([result['breaker']])}\nalert {alert['kind']} sent to {alert['queue']}"


async def _run_with_timeout(args: argparse.Namespace, env: Mapping[str, str], clock: Clock) -> str:
    try:
        async with asyncio.timeout(args.timeout):
            return await run(args, env, clock)
    except TimeoutError as exc:
        raise CliError(f"gave up after {args.timeout:g} s: the store or the bus did not answer") from exc


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, clock: Clock | None = None) -> int:
    args = build_parser().parse_args(argv)
    source = settings_as(os.environ if env is None else env, OPERATORS)  # locally the operators' identity of infra/
    # Quiet unless asked: the alert and the transition are logged by the library (at ERROR/WARNING) and printed here.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.CRITICAL + 1, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        output = asyncio.run(_run_with_timeout(args, source, clock or SystemClock()))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
