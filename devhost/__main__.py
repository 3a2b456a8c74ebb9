"""`python -m devhost`: the command line of the local Functions host (see `python -m devhost --help`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from .timing_option import add_timing_argument

LAB_COMMANDS = ("demo", "drill", "drills", "up", "down")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m devhost",
        description="Run an Azure Functions Python (v2 model) app locally, unchanged and durably, with no Azure and "
        "no Core Tools: Durable Functions (SQLite history + the extension's HTTP API), timer, Service Bus "
        "(embedded broker) and HTTP triggers.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "start",
        help="host DIR/function_app.py (the counterpart of `func start`)",
        description="Index DIR/function_app.py, read host.json and local.settings.json, print the "
        "function list, and serve until SIGINT/SIGTERM.",
    )
    s.add_argument("--app-dir", type=Path, default=Path("."), help="folder holding function_app.py (default: .)")
    s.add_argument(
        "--port",
        type=int,
        default=7071,
        help="HTTP port on 127.0.0.1 for /api and /runtime/webhooks/durabletask (default 7071; 0 = any)",
    )
    s.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where durable history, timer status and function keys live (default DIR/.devhost)",
    )
    s.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    add_timing_argument(s)

    b = sub.add_parser(
        "servicebus",
        help="serve the embedded broker's queues over AMQP 1.0 (Service Bus's dialect, for the unmodified SDKs)",
        description="Open STATE_DIR/servicebus.db (the embedded client's broker file), declare the queues of "
        "--config and serve them over AMQP 1.0 on a plain TCP port until SIGINT/SIGTERM. Clients connect with the "
        "emulator's connection string: Endpoint=sb://HOST:PORT;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true; (docs/devhost.md, 'The AMQP endpoint').",
    )
    from orderflow.embedded.amqp import add_arguments as add_servicebus_arguments

    add_servicebus_arguments(b)

    # submit, cancel and queues: aliases of the operator CLI's client commands (orderflow/cli/client.py), one
    # implementation. `cancel` here is the client app's (no state-store check), as before the CLI existed.
    from orderflow.cli.client import add_commands

    add_commands(sub, "devhost", ("submit", "cancel", "queues"))
    # demo, drill, drills, up and down: aliases of `python -m lab`'s commands (the lab's, loaded only here).
    from lab.__main__ import add_commands as add_lab_commands

    add_lab_commands(sub)
    return p


async def _serve(args: argparse.Namespace) -> int:
    from .app_loader import IndexError_
    from .config import ConfigError
    from .host import Host, HostOptions, PortInUse
    from .worker_rules import WorkerRefusal

    host = Host(
        HostOptions(app_dir=args.app_dir.resolve(), port=args.port, state_dir=args.state_dir, timing=args.timing)
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, host.request_stop)
    try:
        await host.start()
    except (IndexError_, WorkerRefusal) as exc:  # the worker's own message; the real host would load no function
        print(f"devhost: the app cannot be indexed: {exc}", file=sys.stderr, flush=True)
        await host.stop()
        return 1
    except (PortInUse, ConfigError) as exc:  # expected mistakes: one line, no traceback
        print(f"devhost: {exc}", file=sys.stderr, flush=True)
        await host.stop()
        return 1
    print(f"devhost listening on {host.base_url}", flush=True)
    await host.wait_stopped()
    await host.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "start":
        from orderflow.telemetry import configure_logging

        configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
        return asyncio.run(_serve(args))
    if args.command == "servicebus":
        from orderflow.embedded.amqp import serve

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return serve(args.host, args.port, args.state_dir, args.config, args.faults, args.infra)
    if args.command in LAB_COMMANDS:
        from lab.__main__ import run

        return run(args)
    if args.command in ("submit", "cancel", "queues"):
        from orderflow.cli.common import CliError

        try:
            code: int = args.handler(args)
        except CliError as exc:
            print(f"{args.prog}: error: {exc}", file=sys.stderr)
            return 1
        return code
    return 2


if __name__ == "__main__":
    sys.exit(main())
