"""Traces through the real daemon (docs/operations.md, *Traces*): with ``--otlp-endpoint`` every
model route's request is a SERVER span continuing the caller's W3C ``traceparent``, with the
request's span under it (``gen_ai.*`` attributes, its phases and events; a batch line's too),
exported over OTLP/HTTP to a receiver the test runs; no API key and no prompt text in what is exported."""

from __future__ import annotations

import subprocess
import sys

import anthropic
import httpx
import pytest

from tests.support.batch_api import chat_line, finished, jsonl, upload
from tests.support.daemon import API_KEY, MODEL_ID, start_daemon
from tests.support.otlp import ReceivedSpan, otlp_receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
STREAM_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "00f067aa0ba902b7"
SECRET_PROMPT = "Zebra-umbrella-7781 wrote"


def request_spans(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id and s.attributes.get("gen_ai.operation.name")]


@pytest.mark.timeout(180)
def test_the_daemon_exports_a_span_per_request_continuing_the_callers_trace(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the SDK's batch goes out within 50 ms
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llamactor-under-test")
    with otlp_receiver() as receiver:
        daemon = start_daemon("--api-key", API_KEY, "--otlp-endpoint", receiver.endpoint, "--n-parallel", "2",
                              "--data-dir", str(tmp_path))
        try:
            client = daemon.client(default_headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
            chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": SECRET_PROMPT}],
                                                  max_tokens=5, temperature=0.5, seed=3)
            completion = client.completions.create(model=MODEL_ID, prompt=SECRET_PROMPT, max_tokens=0)
            streamed = daemon.client(default_headers={"traceparent": f"00-{STREAM_TRACE_ID}-{CALLER_SPAN}-01"})
            assert len(list(streamed.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": SECRET_PROMPT}], max_tokens=3, stream=True))) > 1
            embedded = daemon.client().embeddings.create(model=MODEL_ID, input=SECRET_PROMPT)
            anthropic.Anthropic(base_url=daemon.url, api_key=API_KEY, max_retries=0).messages.create(
                model=MODEL_ID, max_tokens=4, messages=[{"role": "user", "content": SECRET_PROMPT}])
            httpx.post(f"{daemon.url}/api/generate", headers={"authorization": f"Bearer {API_KEY}"},
                       json={"model": MODEL_ID, "prompt": SECRET_PROMPT, "stream": False, "options": {"num_predict": 3}},
                       timeout=60).raise_for_status()
            batch = client.batches.create(input_file_id=upload(client, jsonl([chat_line("q", SECRET_PROMPT, 2)])),
                                          endpoint="/v1/chat/completions", completion_window="24h")
            assert finished(daemon, batch.id).status == "completed"
            spans = receiver.wait_for(lambda got: len(request_spans(got, TRACE_ID)) == 2
                                      and sum(s.name.startswith(("chat ", "text_completion ", "embeddings "))
                                              for s in got) == 7)
        finally:
            assert daemon.stop() == 0
    chat_span, = (s for s in request_spans(spans, TRACE_ID) if s.name == f"chat {MODEL_ID}")
    server_span, = (s for s in spans if s.span_id == chat_span.parent_span_id)
    assert server_span.parent_span_id == CALLER_SPAN and server_span.kind == 2  # SERVER, under the caller's
    assert server_span.name == "POST /v1/chat/completions" and server_span.service == "llamactor-under-test"
    assert server_span.attributes["http.response.status_code"] == 200
    assert server_span.attributes["llamactor.dialect"] == "openai.chat"
    assert server_span.attributes["llamactor.tenant"] == chat_span.attributes["llamactor.tenant"] == "default"
    a = chat_span.attributes
    assert a["gen_ai.request.model"] == MODEL_ID and a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.seed"] == 3
    assert a["gen_ai.usage.input_tokens"] == chat.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == chat.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == (chat.choices[0].finish_reason,)
    assert a["llamactor.dialect"] == "openai.chat" and a["llamactor.adapters"] == ()
    assert "gen_ai.usage.cache_read.input_tokens" in a and a["gen_ai.latency.e2e"] > 0
    phases = sorted((s for s in spans if s.parent_span_id == chat_span.span_id), key=lambda s: s.start_ns)
    assert [p.name for p in phases] == ["queue", "prefill", "decode"]
    assert chat_span.start_ns == phases[0].start_ns <= phases[-1].end_ns == chat_span.end_ns
    assert server_span.start_ns <= chat_span.start_ns and chat_span.end_ns <= server_span.end_ns
    events = [name for name, _, _ in chat_span.events]
    assert events == ["first_token", "finished"]
    assert chat_span.events[-1][2] == {"gen_ai.response.finish_reasons": (chat.choices[0].finish_reason,)}

    stream_span, = request_spans(spans, STREAM_TRACE_ID)  # a stream's span ends with its last chunk, inside
    stream_server, = (s for s in spans if s.span_id == stream_span.parent_span_id)
    assert stream_server.name == "POST /v1/chat/completions" and stream_server.parent_span_id == CALLER_SPAN
    assert stream_span.end_ns <= stream_server.end_ns and stream_span.attributes["gen_ai.usage.output_tokens"] == 3

    scored, = (s for s in request_spans(spans, TRACE_ID) if s.name.startswith("text_completion"))
    assert scored.attributes["gen_ai.usage.output_tokens"] == 0 == completion.usage.completion_tokens
    assert [p.name for p in spans if p.parent_span_id == scored.span_id] == ["queue", "prefill"]  # no token drawn
    by_dialect = {s.attributes["llamactor.dialect"] for s in spans if s.name.startswith(("chat ", "text_completion ",
                                                                                          "embeddings "))}
    assert by_dialect == {"openai.chat", "openai.completions", "openai.embeddings", "anthropic.messages", "ollama",
                          "batch"}
    embedding, = (s for s in spans if s.name == f"embeddings {MODEL_ID}")
    assert embedding.attributes["gen_ai.usage.input_tokens"] == embedded.usage.prompt_tokens
    assert embedding.trace_id != TRACE_ID  # no traceparent: a trace of its own
    exported = b"".join(receiver.bodies)
    assert API_KEY.encode() not in exported and b"Zebra" not in exported  # neither the key nor the prompt


@pytest.mark.pure
def test_serve_with_an_endpoint_but_without_the_sdk_says_what_to_install() -> None:
    code = ("import sys; sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None; "
            "from llamactor.cli.commands import main; "
            "sys.argv = ['llamactor', 'serve', '--port', '0', '--otlp-endpoint', 'http://127.0.0.1:9']; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "pip install 'llamactor[otel]'" in done.stderr and "--otlp-endpoint" in done.stderr
