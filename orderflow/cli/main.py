"""`orderflow` (also `python -m orderflow`): the operator's command line, against the local system and Azure from
the same app settings.

Commands: `submit`, `watch`, `order`, `orders`, `resubmit`, `keep`, `cancel`, `dlq list|show|replay`,
`breaker show|open|close`, `summary`, `top`, `queues` (`orderflow --help`; each one in docs/modules-product.md).
Every read command but `top` takes --json. A failure (an unknown order, a refused move, a missing setting or
permission, an unreachable store) is one line on stderr and exit status 1; bad usage or a bad value exits 2. Never a
traceback."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from orderflow.cli import client, ops
from orderflow.cli.common import CliError, load_settings, one_line
from orderflow.clock import Clock
from orderflow.embedded.connection import settings_as
from orderflow.embedded.rights import OPERATORS
from orderflow.operations import OpsError

PROG = "orderflow"
DEFAULT_TIMEOUT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate orderflow: find, inspect and repair orders, dead letters and the circuit breaker.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"give up after this many seconds (default {DEFAULT_TIMEOUT_SECONDS:g}; not for "
        "submit, watch, cancel and top, which have their own waits)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the SDK clients do")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client.add_commands(sub, PROG)
    ops.add_commands(sub)
    return parser


async def _with_timeout(args: argparse.Namespace, env: Mapping[str, str], clock: Clock | None) -> str:
    try:
        async with asyncio.timeout(args.timeout):
            return await ops.run(args, env, clock)
    except TimeoutError as exc:
        raise CliError(
            f"gave up after {args.timeout:g} s: the store, the bus or the Durable API did not answer"
        ) from exc


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, clock: Clock | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout:g}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.CRITICAL + 1, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if hasattr(args, "handler"):  # the client-app commands (sync azure-servicebus)
            code: int = args.handler(args)
            return code
        # The operator commands act as the operators' identity of infra/ locally (on Azure: the operator's own).
        settings = settings_as(load_settings(args.app_dir.resolve(), os.environ if env is None else env), OPERATORS)
        os.chdir(args.app_dir.resolve())  # relative embedded paths resolve against the app dir, as under devhost
        if getattr(args, "top", False):
            asyncio.run(ops.top(args, settings, clock))
            return 0
        output = asyncio.run(_with_timeout(args, settings, clock))
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    except OpsError as exc:  # bad input is a usage error (2); an unknown order or a refused move is 1
        print(f"{args.prog}: error: {exc.message}", file=sys.stderr)
        return 2 if exc.status == 400 else 1
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"{args.prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    print(output.rstrip("\n"))
    return 0
