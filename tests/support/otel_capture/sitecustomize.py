"""Span capture for the end-to-end trace test (a test harness, not product code).

tests/product/e2e/test_trace_e2e.py puts this folder first on PYTHONPATH of every process of the local system (devhost,
the Agent, the simulator) and sets ORDERFLOW_OTEL_CAPTURE_DIR; Python then imports this module at start-up (the `site`
module's sitecustomize hook), before the product configures anything. Without that variable it does nothing.

It installs the global TracerProvider of the OpenTelemetry SDK with a SimpleSpanProcessor, so each span is exported as
it ends, to an exporter that appends it as one JSON line to `<dir>/<pid>.jsonl` (flushed at once: a process stopped by
SIGTERM or killed loses nothing already ended). The product's `telemetry.configure_from_env` leaves a provider alone
when no exporter is configured, so the product's spans land here.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

_DIR = os.environ.get("ORDERFLOW_OTEL_CAPTURE_DIR")


def _install(directory: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        def __init__(self, path: str) -> None:
            self._path = path
            self._lock = threading.Lock()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            lines = []
            for span in spans:
                context, parent = span.get_span_context(), span.parent
                lines.append(
                    json.dumps(
                        {
                            "name": span.name,
                            "trace_id": f"{context.trace_id:032x}",
                            "span_id": f"{context.span_id:016x}",
                            "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
                            "parent_remote": None if parent is None else parent.is_remote,
                            "kind": span.kind.name,
                            "attributes": dict(span.attributes or {}),
                            "status": span.status.status_code.name,
                            "start": span.start_time,
                            "end": span.end_time,
                            "pid": os.getpid(),
                        },
                        default=str,
                    )
                )
            with self._lock, open(self._path, "a", encoding="utf-8") as out:
                out.write("".join(line + "\n" for line in lines))
                out.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.path.join(directory, f"{os.getpid()}.jsonl"))))
    trace.set_tracer_provider(provider)


if _DIR:
    _install(_DIR)
