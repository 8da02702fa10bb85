"""Traces of in-process calls on the real engine (docs/operations.md, *Traces*): the calling
thread's current OpenTelemetry context is each request span's parent; a batcher restart shows as
the span's event (a preemption's: tests/base/test_trace_spans.py); without tracing configured, an
engine never imports OpenTelemetry, nor the HTTP app its SDK. Through the daemon: tests/http/test_traces.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from llamactor.handles import tracing

from tests.support.otlp import OtlpReceiver, otlp_receiver

PROMPTS = ["Story one: the old ship", "Story two: the old ship"]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A receiver, and tracing turned off again after the test (its spans exported by then)."""
    with otlp_receiver() as got:
        try:
            yield got
        finally:
            tracing.stop()


@pytest.mark.timeout(300)
def test_in_process_requests_continue_the_callers_trace_and_show_a_batcher_restart(
        start_llm, receiver: OtlpReceiver) -> None:
    llm = start_llm(n_parallel=2, n_ctx=256, batch_timeout_ms=5, otlp_endpoint=receiver.endpoint)
    caller_tracer = TracerProvider().get_tracer("the-caller")  # the application's own tracing
    with caller_tracer.start_as_current_span("handle user request") as caller:
        futures = [llm.submit(p, max_tokens=3, temperature=0, ignore_eos=True) for p in PROMPTS]
        assert [f.result(timeout=300).usage.completion_tokens for f in futures] == [3, 3]
    stream = llm.stream("Once upon a time", max_tokens=6, temperature=0, ignore_eos=True)
    for i, _ in enumerate(stream):
        if i == 1:
            assert llm.inject_crash()
    assert stream.completion.usage.completion_tokens == 6
    tracing.stop()  # exports every span recorded
    requests = [s for s in receiver.spans if s.name.startswith("text_completion")]
    context = caller.get_span_context()
    under_caller = [s for s in requests if s.trace_id == f"{context.trace_id:032x}"]
    assert len(under_caller) == 2 and {s.parent_span_id for s in under_caller} == {f"{context.span_id:016x}"}
    assert {s.attributes["llamactor.dialect"] for s in requests} == {"python"}
    assert all(s.attributes["gen_ai.usage.output_tokens"] == 3 and s.attributes["llamactor.restarts"] == 0
               for s in under_caller)
    restarted, = (s for s in requests if s not in under_caller)
    assert restarted.attributes["llamactor.restarts"] == 1
    assert [e[0] for e in restarted.events] == ["first_token", "restarted", "finished"]


def test_without_tracing_configured_an_engine_never_imports_opentelemetry_nor_the_app_its_sdk(model_path) -> None:
    code = ("import sys, llamactor\n"
            f"llm = llamactor.start({model_path!r}, n_ctx=256, n_parallel=1)\n"
            "assert llm.ask('Hi', max_tokens=2).usage.completion_tokens == 2\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
            "from llamactor.http.server import create_app\n"
            "from llamactor.http.state import ServerState\n"
            "create_app(ServerState(['m'], None, 1000))\n"
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
            "llm.close()\n")
    # tracing's own settings removed; the suite's (the model-load ledger's owner) kept
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "LLAMACTOR_OTLP_ENDPOINT"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    # FastAPI itself imports OpenTelemetry's API (its propagators), never the SDK or an exporter
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "[]"]
