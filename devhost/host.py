"""The host process: index the app, then run the Durable backend, the HTTP server and every trigger on one loop."""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .app_loader import FunctionSpec, describe, index, load_app
from .config import HostConfig, resolve
from .durable.http_api import add_routes as add_durable_routes
from .extensions import check_app
from .http_trigger import HttpTriggers, KeyStore
from .servicebus_trigger import Delivery, ServiceBusTriggerRunner, function_message
from .singleton import ListenerLock
from .timers import TimerRunner, default_use_monitor

log = logging.getLogger("devhost")


class PortInUse(Exception):
    """The HTTP port is taken: an expected mistake, reported in one line by `devhost start`."""


DURABLE_TRIGGERS = {"orchestrationTrigger", "activityTrigger", "entityTrigger"}


def _type_hints(fn: Any) -> dict[str, Any]:
    """Resolved parameter annotations (`from __future__ import annotations` makes them strings)."""
    target = inspect.unwrap(fn)
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable names: fall back to the raw annotations
        return dict(getattr(target, "__annotations__", {}))


async def _close_durable_client_session() -> None:
    """The Durable client keeps one module-level aiohttp session for the worker's lifetime
    (azure/durable_functions/models/utils/http_utils.py); close it on the worker loop before that loop stops."""
    from azure.durable_functions.models.utils import http_utils

    session = getattr(http_utils, "_client_session", None)
    if session is not None and not session.closed:
        await session.close()


@dataclass
class HostOptions:
    app_dir: Path
    port: int = 7071
    state_dir: Path | None = None
    bind: str = "127.0.0.1"
    print_functions: bool = True
    timing: str = "local"  # the Durable engine's: local, or azure-storage (devhost/durable/timing.py)

    @property
    def resolved_state_dir(self) -> Path:
        return (self.state_dir or self.app_dir / ".devhost").resolve()


@dataclass
class Host:
    options: HostOptions
    functions: list[FunctionSpec] = field(default_factory=list)
    base_url: str = ""

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        self._clients: dict[str, Any] = {}
        self._deliveries: dict[str, Delivery] = {}
        self.engine: Any = None
        self.invoker: Any = None
        self.timers: dict[str, TimerRunner] = {}
        self.service_bus: dict[str, ServiceBusTriggerRunner] = {}
        self._settlement: Any = None
        self._worker: Any = None

    # ---- start-up ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        from .durable import DurableEngine, versioning_policy  # (heavy import only when hosting)
        from .durable.timing import timing_for
        from .invoke import Invoker

        opts = self.options
        state_dir = opts.resolved_state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        config = HostConfig.load(opts.app_dir)
        config.apply_environment()
        os.chdir(opts.app_dir)  # relative paths in settings resolve against the app dir, as under `func start`
        app = load_app(opts.app_dir)
        self.functions = index(app)
        check_app(config, self.functions)  # what the real host would refuse: devhost/extensions.py
        durable = config.durable_options()
        timing = timing_for(opts.timing, config.extension("durableTask"))
        if timing.polls:
            log.info("Durable timing %s: %s", timing.name, getattr(timing, "settings", ""))

        web_app = web.Application(client_max_size=64 * 1024 * 1024)
        durable_fns = [s.function for s in self.functions if s.trigger_type in DURABLE_TRIGGERS]
        from .sdk_servicebus import WorkerLoop

        self._worker = WorkerLoop()
        self._worker.start()
        self.invoker = Invoker(client_binding_json=lambda: self.engine.client_binding_json(), worker_loop=self._worker)
        self.engine = DurableEngine(
            db_path=state_dir / "durable.db",
            functions=durable_fns,
            invoke=self.invoker,
            max_concurrent_activities=durable.max_concurrent_activities,
            task_hub=durable.hub_name,
            versioning=versioning_policy(durable),
            partition_count=durable.partition_count,
            timing=timing,
        )
        add_durable_routes(web_app, self.engine)
        http = HttpTriggers(KeyStore(state_dir))
        http.attach(web_app)
        for spec in self.functions:
            if spec.trigger_type == "httpTrigger":
                http.add(spec.name, spec.trigger, self._caller(spec))

        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, opts.bind, opts.port)
        try:
            await site.start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {opts.port} on {opts.bind} is in use (another devhost or func start?)") from exc
            raise
        port = self._runner.addresses[0][1]
        self.base_url = f"http://{opts.bind}:{port}"
        self.engine.set_base_url(self.base_url)
        await self.engine.start()

        for spec in self.functions:
            if spec.trigger_type == "timerTrigger":
                self._start_timer(spec, config, state_dir)
            elif spec.trigger_type == "serviceBusTrigger":
                self._start_service_bus(spec, config)
            elif spec.trigger_type not in DURABLE_TRIGGERS | {"httpTrigger"}:
                log.warning(
                    "function %s: trigger %s is not supported by devhost; skipped", spec.name, spec.trigger_type
                )
        if opts.print_functions:
            print(self.function_list(), flush=True)

    def function_list(self) -> str:
        lines = ["Functions:", ""] + [f"        {describe(s, self.base_url)}" for s in self.functions]
        return "\n".join(lines) + "\n"

    def _caller(self, spec: FunctionSpec):  # type: ignore[no-untyped-def]
        async def call(kwargs: dict[str, Any]) -> Any:
            return await self.invoker.call(spec.function, kwargs)

        return call

    def _start_timer(self, spec: FunctionSpec, config: HostConfig, state_dir: Path) -> None:
        import json

        import azure.functions as func
        from azure.functions.meta import Datum
        from azure.functions.timer import TimerRequestConverter

        call = self._caller(spec)

        async def invoke(payload: dict[str, Any]) -> None:
            timer: func.TimerRequest = TimerRequestConverter.decode(
                Datum(json.dumps(payload), "json"), trigger_metadata={}
            )
            await call({spec.trigger_param: timer})

        schedule = resolve(str(spec.trigger["schedule"]))
        # TimerTriggerAttribute.UseMonitor defaults to true, and TimerSchedule.Create turns it off for a sub-minute
        # schedule even when the function asks for it (azure-webjobs-sdk-extensions, `if (attribute.UseMonitor &&
        # ShouldDisableScheduleMonitor(...)) attribute.UseMonitor = false`).
        use_monitor = spec.trigger.get("useMonitor")
        runner = TimerRunner(
            spec.name,
            schedule,
            run_on_startup=bool(spec.trigger.get("runOnStartup")),
            use_monitor=(use_monitor is None or bool(use_monitor)) and default_use_monitor(schedule),
            state_dir=state_dir,
            invoke=invoke,
            lock=ListenerLock(state_dir, spec.name),
            recovery_poll=config.listener_lock_recovery_seconds(),
        )
        self.timers[spec.name] = runner
        self._tasks.append(asyncio.create_task(runner.run(self._stop), name=f"timer:{spec.name}"))

    def _service_bus_client(self, connection: str) -> Any:
        if connection not in self._clients:
            from orderflow.adapters import aio_bus_from_settings

            self._clients[connection] = aio_bus_from_settings(os.environ, connection=connection)
        return self._clients[connection]

    def _start_service_bus(self, spec: FunctionSpec, config: HostConfig) -> None:
        from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions

        from . import sdk_servicebus

        trigger = spec.trigger
        queue = resolve(str(trigger["queueName"]))
        hints = _type_hints(spec.function.get_user_function())
        sdk_type = sdk_servicebus.is_sdk_message_type(hints.get(spec.trigger_param))
        actions_params = [n for n, a in hints.items() if sdk_servicebus.is_message_actions_type(a)]
        call = self._caller(spec)
        if sdk_type or actions_params:
            self._ensure_settlement()

        async def invoke(delivery: Delivery) -> None:
            message = (
                sdk_servicebus.to_sdk_message(delivery.message) if sdk_type else function_message(delivery.message)
            )
            kwargs: dict[str, Any] = {spec.trigger_param: message}
            for name in actions_params:
                kwargs[name] = ServiceBusMessageActions.get_instance()
            await call(kwargs)

        runner = ServiceBusTriggerRunner(
            spec.name,
            queue,
            client=self._service_bus_client(str(trigger.get("connection") or "ServiceBusConnection")),
            sessions=bool(trigger.get("isSessionsEnabled")),
            # The trigger's own setting, else host.json's extensions.serviceBus.autoCompleteMessages, else true.
            auto_complete=bool(
                trigger.get("autoCompleteMessages", config.extension("serviceBus").get("autoCompleteMessages", True))
            ),
            options=config.service_bus_options(),
            invoke=invoke,
            on_delivery=self._track,
            on_done=self._untrack,
        )
        self.service_bus[spec.name] = runner
        self._tasks.append(asyncio.create_task(runner.run(self._stop), name=f"servicebus:{spec.name}"))

    def _track(self, delivery: Delivery) -> None:
        self._deliveries[str(delivery.message.lock_token)] = delivery

    def _untrack(self, delivery: Delivery) -> None:
        self._deliveries.pop(str(delivery.message.lock_token), None)

    def _ensure_settlement(self) -> None:
        if self._settlement is None:
            from . import sdk_servicebus

            self._settlement = sdk_servicebus.SettlementServer(self._deliveries.get, asyncio.get_running_loop())
            sdk_servicebus.configure_message_actions(self._settlement.start())

    # ---- run / stop -------------------------------------------------------------------------------------------
    async def wait_stopped(self) -> None:
        await self._stop.wait()

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.engine is not None:
            await self.engine.stop()
        if self._settlement is not None:
            self._settlement.stop()
        if self._worker is not None:
            await self._worker.call(_close_durable_client_session)
            self._worker.stop()
        for client in self._clients.values():
            await client.close()
        if self._runner is not None:
            await self._runner.cleanup()
