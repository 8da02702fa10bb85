"""What a request's trace span says, as plain data (pure: no OpenTelemetry here).

Tracing (docs/operations.md, *Traces*) is on when an OTLP endpoint is configured
(``Config.otlp_endpoint`` or the standard ``OTEL_EXPORTER_OTLP_*`` variables): ``trace_settings``
decides, from the configuration and the environment alone, so that a process without tracing
never imports the SDK. ``generation_span`` and ``embedding_span`` turn a finished request -- its
message, the timestamps its batcher recorded (``Progress``), its ``Completion`` or error -- into
a ``SpanData``: name, explicit start and end, attributes named by OpenTelemetry's GenAI semantic
conventions (``gen_ai.*``; vLLM's ``gen_ai.latency.*``), the ``llamactor.*`` ones, the phases
(queue, prefill, decode) as child spans and the instants (first token, preemptions, restarts,
the finish) as events. No prompt or answer text, no key ever goes into one. Any thread may call
these; ``llamactor.handles.tracing`` calls them on its recorder thread.

``DIALECT``: the front end a request came through ("openai.chat", "ollama", ...), set by the HTTP
middleware for the request's context; an in-process call is "python".
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.completion import Completion, Embeddings
from llamactor.base.messages import Embed, Generate, Progress

DIALECT: contextvars.ContextVar[str] = contextvars.ContextVar("llamactor_dialect", default="python")
SERVICE_NAME = "llamactor"
TRACES_PATH = "/v1/traces"
AttributeValue = str | bool | int | float | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """Where spans go: the OTLP/HTTP traces URL, and the service they are reported as."""

    endpoint: str
    service_name: str = SERVICE_NAME
    source: str = "--otlp-endpoint"  # what turned tracing on (named in the error when the SDK is missing)


def traces_url(base: str) -> str:
    """A collector's base URL (``http://host:4318``) with OTLP/HTTP's traces path, unless it has it."""
    base = base.strip()
    return base if base.rstrip("/").endswith(TRACES_PATH) else base.rstrip("/") + TRACES_PATH


def trace_settings(endpoint: str | None, environ: Mapping[str, str]) -> TraceSettings | None:
    """Tracing's settings, or None when it is off: no endpoint given (``endpoint``, else
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` plus
    ``/v1/traces``), ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or SERVICE_NAME
    if endpoint:
        return TraceSettings(traces_url(endpoint), service)
    if url := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return TraceSettings(url, service, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if url := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return TraceSettings(traces_url(url), service, "OTEL_EXPORTER_OTLP_ENDPOINT")
    return None


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    at_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanData:
    """One span to emit: explicit times (ns since the epoch), its phases as child spans."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    events: tuple[SpanEvent, ...] = ()
    phases: tuple[tuple[str, int, int], ...] = ()  # (name, start_ns, end_ns): child spans
    error: str | None = None  # the error's type name: never its message, which may quote a prompt


@dataclass(frozen=True, slots=True)
class Submitted:
    """What the caller's thread noted when it sent a request: the wall clock at the request's
    ``submitted_at`` (so the batcher's perf_counter stamps become wall time), the model's name as
    served, the dialect."""

    wall_ns: int  # time.time_ns() at the perf_counter instant ``perf``
    perf: float
    model: str
    dialect: str

    def ns(self, perf_time: float) -> int:
        return self.wall_ns + round((perf_time - self.perf) * 1e9)


def generation_span(msg: Generate, noted: Submitted, outcome: Completion | BaseException, ended_at: float) -> SpanData:
    """The span of one choice of a generation request that ended (``ended_at``: perf_counter when its
    future was done; a completion's own timings are used where it has them)."""
    completion = outcome if isinstance(outcome, Completion) else getattr(outcome, "completion", None)
    progress = msg.reply.progress or Progress(())
    start = noted.ns(msg.submitted_at)
    end = start + round(completion.timings.total_ms * 1e6) if completion is not None else noted.ns(ended_at)
    admitted = noted.ns(progress.admitted_at) if progress.admitted_at is not None else None
    first = noted.ns(progress.first_token_at) if progress.first_token_at is not None else None
    if completion is not None and completion.timings.queue_ms > 0:  # the completion's own stamps
        admitted = start + round(completion.timings.queue_ms * 1e6)
    if completion is not None and completion.usage.completion_tokens > 0:
        first = start + round(completion.timings.ttft_ms * 1e6)
    attributes = _request_attributes(msg, noted, completion, progress)
    cancelled = isinstance(outcome, concurrent.futures.CancelledError)
    reason = completion.finish_reason if completion is not None else "cancelled" if cancelled else "error"
    events = [SpanEvent(name, noted.ns(at)) for name, at in progress.marks]
    if first is not None:
        events.append(SpanEvent("first_token", first))
    events.append(SpanEvent("finished", end, {"gen_ai.response.finish_reasons": (reason,)}))
    error = None if isinstance(outcome, Completion) or cancelled else type(outcome).__name__
    return SpanData(f"{attributes['gen_ai.operation.name']} {noted.model}", start, end, attributes,
                    tuple(sorted(events, key=lambda e: e.at_ns)), _phases(start, admitted, first, end), error)


def _phases(start: int, admitted: int | None, first: int | None, end: int) -> tuple[tuple[str, int, int], ...]:
    """Queue (submitted -> admitted), prefill (admitted -> first token, or the end of a prompt-only
    request), decode (first token -> end): those the request reached."""
    if admitted is None:
        return (("queue", start, end),)
    phases = [("queue", start, admitted), ("prefill", admitted, first if first is not None else end)]
    if first is not None:
        phases.append(("decode", first, end))
    return tuple(phases)


def _request_attributes(msg: Generate, noted: Submitted, completion: Completion | None,
                        progress: Progress) -> dict[str, AttributeValue]:
    params = msg.params
    out: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat" if msg.messages is not None else "text_completion",
        "gen_ai.provider.name": SERVICE_NAME, "gen_ai.request.model": noted.model,
        "gen_ai.response.id": msg.request_id, "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p, "gen_ai.request.top_k": params.top_k,
        "gen_ai.request.frequency_penalty": params.frequency_penalty,
        "gen_ai.request.presence_penalty": params.presence_penalty,
        **_common(msg.tenant.name, noted.dialect, msg.request_id),
        "llamactor.priority": msg.priority,
        "llamactor.adapters": tuple(f"{name}:{scale:g}" for name, scale in msg.lora),
        "llamactor.preemptions": progress.n_preempted, "llamactor.restarts": progress.n_resumed,
    }
    if params.max_tokens is not None:
        out["gen_ai.request.max_tokens"] = params.max_tokens
    if params.seed is not None:
        out["gen_ai.request.seed"] = params.seed
    if completion is not None:
        usage, timings = completion.usage, completion.timings
        out |= {"gen_ai.response.model": noted.model, "gen_ai.response.finish_reasons": (completion.finish_reason,),
                "gen_ai.usage.input_tokens": usage.prompt_tokens, "gen_ai.usage.output_tokens": usage.completion_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
                "gen_ai.latency.time_in_queue": timings.queue_ms / 1000,
                "gen_ai.latency.time_to_first_token": timings.ttft_ms / 1000,
                "gen_ai.latency.e2e": timings.total_ms / 1000}
    else:
        out["gen_ai.usage.input_tokens"] = len(progress.prompt_ids)
        out["gen_ai.usage.output_tokens"] = len(progress.generated)
    return out


def _common(tenant: str, dialect: str, request_id: str) -> dict[str, AttributeValue]:
    return {"llamactor.tenant": tenant, "llamactor.dialect": dialect, "llamactor.request_id": request_id}


def embedding_span(msg: Embed, noted: Submitted, outcome: Embeddings | BaseException, ended_at: float) -> SpanData:
    """The span of one embedding request that ended: its inputs' token count, its time."""
    start = noted.ns(msg.submitted_at)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "embeddings", "gen_ai.provider.name": SERVICE_NAME,
        "gen_ai.request.model": noted.model, **_common(msg.tenant.name, noted.dialect, msg.request_id),
        "llamactor.inputs": len(msg.pairs.documents) if msg.pairs is not None else len(msg.inputs)}
    if isinstance(outcome, Embeddings):
        attributes |= {"gen_ai.response.model": noted.model, "gen_ai.usage.input_tokens": outcome.prompt_tokens,
                       "gen_ai.embeddings.dimension.count": int(outcome.vectors.shape[-1]),
                       "llamactor.steps": outcome.n_steps}
        end, error = start + round(outcome.total_ms * 1e6), None
    else:
        end, error = noted.ns(ended_at), type(outcome).__name__
    return SpanData(f"embeddings {noted.model}", start, end, attributes,
                    (SpanEvent("finished", end),), (), error)


def dialect_of(path: str) -> str | None:
    """The front end an HTTP path belongs to, for its spans; None: not a model route."""
    trimmed = path.removeprefix("/v1").removeprefix("/v2")  # (Cohere's /v2/rerank)
    for prefix, dialect in _DIALECTS:
        if trimmed.startswith(prefix):
            return dialect
    return None


_DIALECTS = (("/chat/completions", "openai.chat"), ("/completions", "openai.completions"),
             ("/embeddings", "openai.embeddings"), ("/responses", "openai.responses"),
             ("/messages", "anthropic.messages"), ("/api/", "ollama"), ("/batches", "openai.batches"),
             ("/files", "openai.files"), ("/tokenize", "tokenizer"), ("/detokenize", "tokenizer"),
             ("/apply-template", "tokenizer"), ("/rerank", "rerank"), ("/score", "rerank.score"))
