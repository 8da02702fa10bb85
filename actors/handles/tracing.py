"""Request spans exported over OTLP/HTTP (docs/operations.md, *Traces*): the OpenTelemetry side.

Off and free unless configured: ``configure`` asks ``llamactor.base.trace_spans.trace_settings``
first and imports the OpenTelemetry SDK only when tracing is on, so a process without it never
loads the SDK; configured without the SDK installed, it raises ``TracingUnavailableError`` at
start. One ``RequestTracer`` per process, with its own ``TracerProvider`` (an application's global
provider is left alone); the caller's current OpenTelemetry context is the parent of its spans.

Threads:
- ``configure``: whichever thread starts a tree (``start_tree``) or the daemon.
- ``RequestTracer.watch``: the caller's thread, right after it sent a request: notes the wall
  clock, the dialect and the current context, and adds one done-callback per future.
- ``_finished`` (that callback): the thread that resolved the future -- the batcher's, mostly. It
  only stamps the time and puts the request on a queue: no SDK call ever runs on the batcher.
- ``_record_forever``: the ``trace-recorder`` thread builds each span from what the request
  carried when it finished (``trace_spans.generation_span``), with explicit start and end times,
  events and child spans, and hands it to the ``BatchSpanProcessor``, whose own thread exports.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.base.messages import Embed, Generate
from llamactor.base.trace_spans import DIALECT, SpanData, Submitted, TraceSettings, embedding_span, \
    generation_span, trace_settings

log = get_logger("llamactor.tracing")
SpanBuilder = Callable[[Any, Submitted, Any, float], SpanData]
_configured: RequestTracer | None = None
_configure_lock = threading.Lock()


class TracingUnavailableError(LlamactorError):
    """Tracing is configured but the OpenTelemetry packages are not installed."""


def configure(endpoint: str | None, environ: Mapping[str, str] = os.environ) -> RequestTracer | None:
    """The process's tracer, started on the first call that finds tracing on (``endpoint``:
    ``Config.otlp_endpoint``; the ``OTEL_*`` variables); None while it is off."""
    global _configured
    settings = trace_settings(endpoint, environ)
    if settings is None:
        return _configured
    with _configure_lock:
        if _configured is None:
            _configured = RequestTracer(settings)
            log.info("tracing_started", endpoint=settings.endpoint, service=settings.service_name)
        return _configured


def active() -> RequestTracer | None:
    """The process's tracer, None when tracing is off (any thread)."""
    return _configured


def stop() -> None:
    """Export what is recorded and turn tracing off for the process (a later ``configure`` may start it again)."""
    global _configured
    with _configure_lock:
        tracer, _configured = _configured, None
    if tracer is not None:
        tracer.close()


class RequestTracer:
    """Turns finished requests into spans, off the batcher thread (see the module's docstring)."""

    def __init__(self, settings: TraceSettings) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as e:
            raise TracingUnavailableError(
                f"tracing is on ({settings.source} is set) but the OpenTelemetry packages are missing ({e.name}): "
                "pip install 'llamactor[otel]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http), "
                "or turn tracing off (no endpoint, or OTEL_TRACES_EXPORTER=none)") from None
        self.settings = settings
        self.provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint)))
        self.tracer = self.provider.get_tracer("llamactor")
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._record_forever, name="trace-recorder", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- the caller's thread ----------------------------------------------------------------

    def watch(self, msgs: Sequence[Generate | Embed], futures: Iterable[concurrent.futures.Future[Any]],
              model: str) -> None:
        """Record a span for each message once its future is done; its parent: the current context."""
        from opentelemetry import context

        noted = Submitted(time.time_ns(), time.perf_counter(), model, DIALECT.get())
        parent = context.get_current()
        for msg, future in zip(msgs, futures):
            build: SpanBuilder = generation_span if isinstance(msg, Generate) else embedding_span
            future.add_done_callback(functools.partial(self._finished, build, msg, noted, parent))

    # -- the thread that resolves the future (the batcher's) ---------------------------------

    def _finished(self, build: SpanBuilder, msg: Any, noted: Submitted, parent: Any,
                  future: concurrent.futures.Future[Any]) -> None:
        self._queue.put((build, msg, noted, parent, future, time.perf_counter()))

    # -- the recorder thread -----------------------------------------------------------------

    def _record_forever(self) -> None:
        while (item := self._queue.get()) is not None:
            build, msg, noted, parent, future, ended_at = item
            try:
                self.emit(build(msg, noted, _outcome(future), ended_at), parent)
            except Exception as e:  # noqa: BLE001 - a span that cannot be built must not stop the others
                log.warning("trace_span_failed", request_id=msg.request_id, error=repr(e))

    def emit(self, data: SpanData, parent: Any, kind: Any = None) -> None:
        """Start and end ``data``'s span (and its phases' child spans) at their recorded times."""
        from opentelemetry import trace

        span = self.tracer.start_span(data.name, context=parent, kind=kind or trace.SpanKind.INTERNAL,
                                      attributes=data.attributes, start_time=data.start_ns)
        for event in data.events:
            span.add_event(event.name, event.attributes, timestamp=event.at_ns)
        inside = trace.set_span_in_context(span, parent)
        for name, start_ns, end_ns in data.phases:
            self.tracer.start_span(name, context=inside, start_time=start_ns).end(end_time=end_ns)
        if data.error is not None:
            span.set_attribute("error.type", data.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, data.error))
        span.end(end_time=data.end_ns)

    def close(self) -> None:
        """Record what is queued, then export every span still buffered (at exit; any thread)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=5)
            self.provider.shutdown()


def _outcome(future: concurrent.futures.Future[Any]) -> Any:
    """What a done future holds: its result, or the exception it failed or was cancelled with."""
    if future.cancelled():
        return concurrent.futures.CancelledError()
    return future.exception() or future.result()
