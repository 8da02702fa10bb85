"""What a request's span says, as plain data (``llamactor.base.trace_spans``), and when tracing
is on at all; the OpenTelemetry side refuses to start without its packages. The same spans
through the real daemon and engine: tests/http/test_traces.py, tests/handles/test_tracing.py."""

from __future__ import annotations

import concurrent.futures
import sys

import pytest

from llamactor.base.completion import Completion, Timings, Usage
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import CancelledError, InvalidRequestError
from llamactor.base.messages import Generate, Progress, ReplyChannel
from llamactor.base.tenants import Tenant
from llamactor.base.trace_spans import Submitted, TraceSettings, dialect_of, generation_span, trace_settings

pytestmark = pytest.mark.pure
SUBMITTED = 100.0  # perf_counter seconds
WALL_NS = 1_700_000_000_000_000_000  # the wall clock then


@pytest.mark.parametrize(("endpoint", "environ", "expected"), [
    (None, {}, None),
    ("http://collector:4318", {}, TraceSettings("http://collector:4318/v1/traces")),
    ("http://collector:4318/v1/traces", {}, TraceSettings("http://collector:4318/v1/traces")),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/custom"},
     TraceSettings("http://c:9/custom", source="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_SERVICE_NAME": "edge"},
     TraceSettings("http://c:4318/v1/traces", "edge", "OTEL_EXPORTER_OTLP_ENDPOINT")),
    ("http://collector:4318", {"OTEL_TRACES_EXPORTER": "none"}, None),
    ("http://collector:4318", {"OTEL_SDK_DISABLED": "true"}, None),
])
def test_tracing_is_on_only_where_an_endpoint_is_configured_and_not_turned_off(endpoint, environ, expected) -> None:
    assert trace_settings(endpoint, environ) == expected


def finished(reason: str = "length", n_gen: int = 4) -> Completion:
    return Completion("r1", "secret answer", tuple(range(n_gen)), reason,  # type: ignore[arg-type]
                      Usage(prompt_tokens=7, completion_tokens=n_gen, cached_tokens=3),
                      Timings(queue_ms=10.0, ttft_ms=30.0, total_ms=90.0, decode_tokens_per_s=50.0))


def message(progress: Progress | None = None) -> Generate:
    reply = ReplyChannel(progress=progress)
    return Generate("r1", SamplingParams(max_tokens=4, temperature=0.5, seed=9), reply, SUBMITTED,
                    messages=({"role": "user", "content": "secret prompt"},), tenant=Tenant("acme"),
                    lora=(("french", 0.5),))


NOTED = Submitted(WALL_NS, SUBMITTED, "gemma", "openai.chat")


def ns(ms: float) -> int:
    return WALL_NS + round(ms * 1e6)


def test_a_finished_request_is_a_span_with_its_phases_events_and_gen_ai_attributes() -> None:
    progress = Progress((1, 2), marks=[("preempted", SUBMITTED + 0.05), ("restarted", SUBMITTED + 0.06)],
                        n_preempted=1, n_resumed=1)
    span = generation_span(message(progress), NOTED, finished(), SUBMITTED + 1)
    assert (span.name, span.start_ns, span.end_ns, span.error) == ("chat gemma", ns(0), ns(90), None)
    assert span.phases == (("queue", ns(0), ns(10)), ("prefill", ns(10), ns(30)), ("decode", ns(30), ns(90)))
    assert [(e.name, e.at_ns) for e in span.events] == [("first_token", ns(30)), ("preempted", ns(50)),
                                                        ("restarted", ns(60)), ("finished", ns(90))]
    a = span.attributes
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"], a["gen_ai.usage.cache_read.input_tokens"]) \
        == (7, 4, 3)
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.seed"]) == (4, 0.5, 9)
    assert (a["llamactor.tenant"], a["llamactor.adapters"], a["llamactor.dialect"]) == ("acme", ("french:0.5",), "openai.chat")
    assert (a["llamactor.preemptions"], a["llamactor.restarts"], a["gen_ai.response.finish_reasons"]) == (1, 1, ("length",))
    assert "secret" not in repr(span)  # neither the prompt nor the answer


def test_a_failed_request_names_its_error_type_never_its_message_and_a_cancelled_one_is_no_error() -> None:
    failed = generation_span(message(), NOTED, InvalidRequestError("secret prompt is bad"), SUBMITTED + 0.2)
    assert failed.error == "InvalidRequestError" and failed.end_ns == ns(200) and "secret" not in repr(failed)
    assert failed.phases == (("queue", ns(0), ns(200)),)  # never admitted
    cancelled = generation_span(message(), NOTED, CancelledError("stop", finished("cancelled", 2)), SUBMITTED + 1)
    assert cancelled.error is None and cancelled.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    unsent = generation_span(message(), NOTED, concurrent.futures.CancelledError(), SUBMITTED + 1)
    assert unsent.error is None and unsent.events[-1].attributes == {"gen_ai.response.finish_reasons": ("cancelled",)}


def test_a_prompt_only_request_has_no_decode_phase() -> None:
    span = generation_span(message(), NOTED, finished("length", n_gen=0), SUBMITTED + 1)
    assert [name for name, _, _ in span.phases] == ["queue", "prefill"]
    assert [e.name for e in span.events] == ["finished"]


def test_each_model_route_names_its_dialect() -> None:
    assert [dialect_of(p) for p in ("/v1/chat/completions", "/completions", "/v1/messages", "/api/chat",
                                    "/v1/embeddings", "/v1/responses", "/health", "/metrics", "/ui/")] == \
        ["openai.chat", "openai.completions", "anthropic.messages", "ollama", "openai.embeddings",
         "openai.responses", None, None, None]
    assert [dialect_of(p) for p in ("/v1/rerank", "/v2/rerank", "/rerank", "/v1/reranking", "/score", "/v1/score",
                                    "/api/rerank")] == ["rerank"] * 4 + ["rerank.score"] * 2 + ["ollama"]


def test_tracing_configured_without_the_sdk_fails_at_start_saying_what_to_install(monkeypatch) -> None:
    from llamactor.handles import tracing

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(tracing.TracingUnavailableError, match=r"OTEL_EXPORTER_OTLP_ENDPOINT is set.*llamactor\[otel\]"):
        tracing.configure(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracing.active() is None
