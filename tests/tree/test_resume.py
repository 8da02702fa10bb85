"""Requests survive a batcher crash: each resumes from its checkpoint (prompt + generated token ids,
sampler state) on the restarted batcher, and a stream goes on with its next piece, no error event,
no repeated or missing piece. On the real model, in-process and over HTTP (SSE)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import openai
import pytest
import uvicorn

import llamactor
from llamactor.base.completion import Completion, Piece
from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.handles.streams import TextStream
from llamactor.tree.request_state import resume_sequence, start_sequence

from tests.conftest import NotAMessage, assert_equal_up_to_near_tie, batcher_ref, closing_what_the_test_started
from tests.support.daemon import MODEL_ID, assert_same_greedy_text_up_to_near_tie, free_port, legacy_result, \
    streamed_legacy_result, wait_until
from tests.support.structured import PERSON_SCHEMA, valid_person


def crash_after_pieces(llm: llamactor.LLM, stream: TextStream, at: set[int]) -> list[str]:
    """Iterate ``stream``, crashing ``llm``'s batcher right after piece number ``n`` for each ``n`` in ``at``."""
    pieces = []
    for piece in stream:
        pieces.append(piece)
        if len(pieces) in at:
            assert llm.inject_crash()  # the public fault-injection hook (the benchmark's too)
    return pieces


@pytest.mark.timeout(300)  # three model loads
def test_a_greedy_stream_survives_three_batcher_crashes_with_the_text_of_an_uninterrupted_run(
        start_llm, reference_engine) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    prompt = "Once upon a time"
    uninterrupted = llm.ask(prompt, max_tokens=48, temperature=0, ignore_eos=True)
    stream = llm.stream(prompt, max_tokens=48, temperature=0, ignore_eos=True)
    pieces = crash_after_pieces(llm, stream, {5, 15, 25})
    resumed = stream.completion
    assert llm.stats()["restarts"] == 3
    assert "".join(pieces) == resumed.text  # each piece once, none missing
    assert resumed.usage.completion_tokens == len(resumed.token_ids) == 48 and resumed.finish_reason == "length"
    assert resumed.usage.prompt_tokens == uninterrupted.usage.prompt_tokens
    assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(prompt), uninterrupted, resumed)


def test_a_plain_request_running_when_the_batcher_crashes_completes_from_its_checkpoint(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    submitted = time.perf_counter()
    plain = llm.submit("The sea is", max_tokens=60, temperature=0, ignore_eos=True)
    watcher = llm.stream("Once upon a time", max_tokens=200, temperature=0, ignore_eos=True)
    pieces = iter(watcher)
    for _ in range(10):
        next(pieces)  # both run: admitted in one step, the plain one has generated tokens too
    crashed = time.perf_counter()
    batcher_ref(llm).tell(NotAMessage())
    done = plain.result(timeout=60)
    assert done.usage.completion_tokens == 60 and done.finish_reason == "length"
    # Its first token is the one from before the crash: it went on, it did not start again.
    assert submitted + done.timings.ttft_ms / 1000 < crashed
    assert llm.stats()["tokens_recomputed"] > done.usage.prompt_tokens
    watcher.cancel()


def test_a_grammar_constrained_sampled_stream_keeps_its_grammar_state_across_a_crash(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    stream = llm.stream("User: Describe a person as JSON.\nAssistant:", json_schema=PERSON_SCHEMA,
                        temperature=0.9, seed=4, max_tokens=96)
    pieces = crash_after_pieces(llm, stream, {4})
    c = stream.completion
    assert llm.stats()["restarts"] == 1
    # A fresh matcher would refuse the next token of an object already begun: it replayed them all.
    assert c.finish_reason == "stop" and valid_person(c.text), c.text
    assert "".join(pieces) == c.text and len(c.token_ids) == c.usage.completion_tokens


def test_a_seeded_stream_with_penalties_logprobs_and_a_stop_string_goes_on_across_a_crash(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)

    async def run() -> tuple[list[Piece], Completion]:
        stream = llm.stream_async("Once upon a time", temperature=0.9, seed=11, presence_penalty=0.5,
                                  logprobs=True, max_tokens=80, ignore_eos=True, stop=["zzqx"])
        pieces = []
        async for piece in stream.pieces():
            pieces.append(piece)
            if len(pieces) in (3, 20):
                batcher_ref(llm).tell(NotAMessage())
        return pieces, stream.completion

    pieces, c = asyncio.run(run())
    assert llm.stats()["restarts"] == 2
    assert "".join(p.text for p in pieces) == c.text and c.usage.completion_tokens == 80
    # every token's logprob went out with exactly one piece
    assert sum(len(p.logprobs) for p in pieces) == len(c.logprobs) == 80


@contextlib.contextmanager
def in_process_daemon(model_path: str) -> Iterator[tuple[llamactor.LLM, openai.OpenAI]]:
    """The daemon's app on uvicorn in a thread, so the test can crash its batcher."""
    from llamactor.http.server import create_app
    from llamactor.http.state import ServerState

    with closing_what_the_test_started() as handles:
        router = llamactor.start(models=[{"name": MODEL_ID, "path": model_path, "n_parallel": 2, "n_ctx": 2048,
                                          "batch_timeout_ms": 5}])
        handles.append(router)
        state = ServerState([MODEL_ID], api_key=None, max_body_bytes=1 << 20)
        state.router = router
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_config=None,
                                               access_log=False, lifespan="off",
                                               timeout_graceful_shutdown=1))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        try:
            wait_until(lambda: server.started, "uvicorn to start")
            yield router.model(MODEL_ID).replica(0), client
        finally:
            client.close()  # no idle keep-alive connection for uvicorn's shutdown to wait on
            server.should_exit = True
            thread.join(timeout=30)


def test_an_sse_stream_goes_on_across_a_batcher_crash_without_an_error_event(model_path) -> None:
    with in_process_daemon(model_path) as (llm, client):
        body = dict(model=MODEL_ID, prompt="Tell me about the sea.", max_tokens=40, temperature=0, logprobs=2,
                    extra_body={"ignore_eos": True})
        uninterrupted = client.completions.create(**body)
        chunks = []
        for chunk in client.completions.create(**body, stream=True, stream_options={"include_usage": True}):
            chunks.append(chunk)  # an error event would raise openai.APIError here
            if len(chunks) == 6:
                batcher_ref(llm).tell(NotAMessage())
        assert llm.stats()["restarts"] == 1
        streamed = streamed_legacy_result(chunks)  # every token's logprobs once: none repeated or missing
        assert chunks[-1].usage.completion_tokens == len(streamed[1]) == 40 and streamed[2] == "length"
        assert_same_greedy_text_up_to_near_tie(streamed, legacy_result(uninterrupted.choices[0]))



# -- the checkpoint itself, on a stand-in tokenizer (pure; the real-model tests above do the same) --

class FakeTokenizer:
    """Eight tokens: a UTF-8 character split over two, the stop string END over two, an EOG."""

    n_vocab = 8
    BYTES = [b"A", b" B", b"\xc3", b"\xa9", b"EN", b"D", b"x", b""]

    def token_bytes(self, token: int) -> bytes:
        return self.BYTES[token]

    def token_text(self, token: int) -> str:
        return self.BYTES[token].decode(errors="replace")

    def is_eog(self, token: int) -> bool:
        return token == 7


def generate(pieces: list[str]) -> Generate:
    return Generate(request_id="r", params=SamplingParams(), submitted_at=0.0, text="x",
                    reply=ReplyChannel(on_piece=lambda p: pieces.append(p.text)))


PARAMS = SamplingParams(temperature=0.9, seed=5, presence_penalty=0.5, logprobs=True, stop=("END",))


@pytest.mark.pure
@pytest.mark.parametrize("crash_after", [1, 2, 4])  # after: a plain token, half a character, the held-back "EN"
def test_a_resumed_request_continues_with_the_state_it_had_at_its_last_checkpoint(crash_after: int) -> None:
    tok = FakeTokenizer()
    script = [6, 2, 3, 4, 6, 0, 1, 4, 5]  # "x", "é" in two, "EN" (held), "x" releases it, "A B", "END" stops
    sent: list[str] = []
    msg = generate(sent)
    original = start_sequence(msg, [1, 0], 2, PARAMS, tok)  # type: ignore[arg-type]
    reasons = []
    for i, token in enumerate(script):
        draw = original.state.rng.random()  # the draw that chooses ``token``
        if i == crash_after:  # the batcher dies after this draw, before accepting the token
            resumed = resume_sequence(msg, PARAMS, tok)  # type: ignore[arg-type]
            assert resumed.state.rng.random() == draw  # the token is drawn again as it was
            assert resumed.token_ids == original.token_ids and resumed.n_resumed == 1
            assert resumed.state.row_spec(resumed.token_ids).recent_tokens == original.token_ids[-64:]
            assert resumed.state.n_logprobs_sent == original.state.n_logprobs_sent
            assert resumed.state.text.text == original.state.text.text  # incl. what is held back
            original = resumed  # the rest runs on the resumed state
        reasons.append(original.state.accept(original, token, -0.5, [], tok, n_ctx_seq=100))
    assert reasons == [None] * 8 + ["stop"]
    assert "".join(sent) == original.state.text.text == "xéENxA B"  # each piece once; END never shown
    assert len(original.state.logprobs) == len(script)


@pytest.mark.pure
def test_a_request_that_crashed_after_its_last_token_ends_as_soon_as_it_is_resumed() -> None:
    tok = FakeTokenizer()
    msg = generate([])
    seq = start_sequence(msg, [1, 0], 2, PARAMS.replace(max_tokens=2), tok)  # type: ignore[arg-type]
    assert seq.state.accept(seq, 6, -0.1, [], tok, n_ctx_seq=100) is None
    assert seq.state.accept(seq, 0, -0.1, [], tok, n_ctx_seq=100) == "length"  # then the crash, before finishing
    resumed = resume_sequence(msg, PARAMS.replace(max_tokens=2), tok)  # type: ignore[arg-type]
    assert resumed.state.ended(resumed, 100) == "length" and resumed.n_generated == 2
