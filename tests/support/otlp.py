"""A local OTLP/HTTP trace receiver: ``POST /v1/traces`` with protobuf bodies, decoded with
opentelemetry-proto's ``ExportTraceServiceRequest``, as a collector would. Tests wait on its
condition for the spans they expect (no sleeps), and read the raw bytes it got (to check that no
key or prompt text was exported)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, \
    ExportTraceServiceResponse


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    service: str


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class OtlpReceiver:
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                spans += [ReceivedSpan(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                                       s.start_time_unix_nano, s.end_time_unix_nano, _attributes(s.attributes),
                                       [(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events],
                                       s.status.code, service) for s in scope_spans.spans]
        with self.arrived:
            self.bodies.append(body)
            self.spans += spans
            self.arrived.notify_all()

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30) -> list[ReceivedSpan]:
        """The spans received so far, once ``predicate`` holds of them (AssertionError after ``timeout``)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: predicate(self.spans), timeout), \
                f"the expected spans did not arrive; got {[s.name for s in self.spans]}"
            return list(self.spans)

    def named(self, prefix: str) -> list[ReceivedSpan]:
        with self.arrived:
            return [s for s in self.spans if s.name.startswith(prefix)]


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver on a free loopback port, for the ``with`` block."""
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
