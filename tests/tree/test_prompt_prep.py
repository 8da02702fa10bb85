"""Prompt preparation on the real models: long texts tokenized in pieces give the very tokens of
the whole text (Gemma's SPM and SmolLM2's BPE vocabularies), in linear time."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import llamactor.native.tokenizer as tokenizer_module
from llamactor.base.errors import CancelledError, ContextExceededError, InvalidRequestError, LlamactorError, RequestFailedError
from llamactor.handles.streams import TextStream
from llamactor.tree.prompt_prep import INLINE_CHARS, INLINE_MESSAGES, PromptPrep
from llamactor.tree.prompt_tokens import PromptBuilder
from llamactor.native.engine import Engine
from llamactor.native.tokenizer import Tokenizer

_WORDS = ["hi", "hello world", "The quick brown fox.", "naïve café", "日本語のテキスト", "emoji 🎉🚀", "Ω≈ç√",
          "x=1; y=[2,3]", "def f(a):", "    return a", "a", "<", ">", "/", "[", "]", "|"]
_SEPARATORS = ["\n", "\n\n", "\n\n\n\n", " ", "  ", "   ", "\t", "\t\t", "\r\n", " \n", "\n "]
_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>", "<pad>", "<table>", "</td>", "<b>", "</b>",
             "[multimodal]", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<unused7>", "<<b>>", "<b><b>"]


def varied_texts() -> Iterator[tuple[str, str]]:
    """Texts of every shape this test knows, each with a name: random mixes of words, runs of
    whitespace and special-token text, and the regular shapes that made llama.cpp quadratic."""
    rng = random.Random(36)
    for i in range(12):
        pool = _WORDS + _SEPARATORS * (1 + i % 3) + _SPECIALS * (i % 4)
        yield f"mix{i}", "".join(rng.choice(pool) for _ in range(400 + 100 * i))
    yield "lines", "hi\n" * 3000
    yield "newlines", "\n" * 5000
    yield "spaces", " " * 5000
    yield "tags", "<b>" * 2000
    yield "tagged", "a<b>" * 2000
    yield "controls", "<eos>x" * 1000 + "<b>x" * 1000 + "<unused1>\n" * 300
    yield "turns", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nhello<end_of_turn>\n" * 60
    yield "chatml", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n" * 60
    yield "prose", "It was the best of times, it was the worst of times. " * 200
    yield "indented", "def f():\n    if x:\n\t\treturn 1\n\n\n" * 300


@pytest.fixture(scope="module", params=["gemma", "smollm2"])
def tokenizer(request: pytest.FixtureRequest, model_path: str, instruct_path: str) -> Iterator[Tokenizer]:
    """The vocabulary of each bundled model: Gemma 3 (SPM) and SmolLM2 (BPE)."""
    engine = Engine(model_path if request.param == "gemma" else instruct_path, n_ctx=256, n_batch=64, n_ubatch=64,
                    n_seq_max=1, n_threads=1)
    yield engine.tokenizer
    engine.close()


@pytest.mark.parametrize("chunk", [5, 64, tokenizer_module.CHUNK_BYTES])
def test_pieces_tokenize_to_the_tokens_of_the_whole(tokenizer: Tokenizer, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """For every text, both ``parse_special`` modes and with/without BOS, the pieces' tokens joined
    equal llama.cpp's tokens of the unsplit text; the texts are really cut (not vacuous)."""
    monkeypatch.setattr(tokenizer_module, "CHUNK_BYTES", chunk)
    n_cut = 0
    for name, text in varied_texts():
        data = text.encode()
        for parse_special in (False, True):
            splitter = tokenizer.facts().splitters[parse_special]
            assert splitter is not None
            n_cut += len(splitter.cuts(data, chunk)) > 2
            for add_special in (False, True):
                whole = tokenizer._tokenize(data, add_special, parse_special)  # llama.cpp, one call
                assert tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special) == whole, (
                    f"{name}: parse_special={parse_special} add_special={add_special}")
    assert n_cut >= 10


def test_line_structured_text_tokenizes_in_linear_time(tokenizer: Tokenizer) -> None:
    """'hi\\n' x 40k (llama.cpp alone: 39 s on Gemma, quadratic in the newlines it matches) is cut in
    pieces; their sizes are bounded, so the work per piece is. (Counted, not timed.)"""
    data = ("hi\n" * 40_000).encode()
    for parse_special in (False, True):
        splitter = tokenizer.facts().splitters[parse_special]
        assert splitter is not None
        cuts = splitter.cuts(data, tokenizer_module.CHUNK_BYTES)
        sizes = [b - a for a, b in zip(cuts, cuts[1:])]
        if b"\n" in tokenizer_facts_specials(tokenizer, parse_special):
            assert max(sizes) <= tokenizer_module.CHUNK_BYTES + 3, "a piece holds a bounded number of matches"
        else:  # no special token in it: llama.cpp makes one fragment, linear already
            assert len(cuts) == 2


def tokenizer_facts_specials(tokenizer: Tokenizer, parse_special: bool) -> frozenset[bytes]:
    splitter = tokenizer.facts().splitters[parse_special]
    assert splitter is not None
    return splitter._tokens.texts


def test_no_text_has_fewer_tokens_than_the_byte_cap_counts(tokenizer: Tokenizer) -> None:
    """The cap's bound is sound: every text has at least ``min_tokens(its bytes)`` tokens, the
    longest token's own text repeated (the densest text there is) included."""
    longest = max(range(tokenizer.n_vocab), key=lambda t: len(tokenizer.token_bytes(t)))
    densest = tokenizer.token_bytes(longest).decode("utf-8", errors="ignore")
    for _, text in [*varied_texts(), ("densest", densest * 50)]:
        for parse_special in (False, True):
            n_bytes = len(text.encode())
            assert len(tokenizer.tokenize(text, add_special=False, parse_special=parse_special)) >= \
                tokenizer.min_tokens(n_bytes) > 0


# -- the batcher's preparation pool, through a real tree -----------------------------------------

MARK = "<<held>>"  # prompts holding this are tokenized only once the test opens the gate
WAIT_S = 300  # only ever waited out when the property fails (the machine may be slow, never this slow)


class Gate:
    """Holds the tokenizing of every text with ``MARK`` in it until ``opened``; records on which
    threads it ran and when it started and ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.events: list[str] = []
        self.threads: list[str] = []
        original = Tokenizer.tokenize

        def tokenize(tok: Tokenizer, text: str, **options: Any) -> list[int]:
            if MARK in text:
                self.threads.append(threading.current_thread().name)
                self.events.append("tokenize_started")
                self.entered.set()
                assert self.opened.wait(WAIT_S)
                tokens = original(tok, text, **options)
                self.events.append("tokenize_ended")
                return tokens
            return original(tok, text, **options)

        monkeypatch.setattr(Tokenizer, "tokenize", tokenize)


class Pieces:
    """Reads a stream on its own thread, counting its pieces."""

    def __init__(self, stream: TextStream) -> None:
        self.count = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: TextStream) -> None:
        with contextlib.suppress(Exception):  # cancelled at the end of the test
            for _ in stream:
                with self._changed:
                    self.count += 1
                    self._changed.notify_all()

    def wait_for(self, n: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= n, WAIT_S)


@pytest.mark.timeout(WAIT_S + 120)
@pytest.mark.parametrize("kind", ["tokenize", "prompt"])
def test_a_long_text_being_tokenized_does_not_stall_a_stream(start_llm: Any, monkeypatch: pytest.MonkeyPatch,
                                                             kind: str) -> None:
    """Event-ordered, not timed: while a 75 KB text (a /tokenize, or a prompt) is being tokenized --
    held there by the test -- another tenant's stream goes on producing pieces. On the batcher
    thread, the tokenize held the steps too, and the stream stopped."""
    gate = Gate(monkeypatch)
    llm = start_llm(n_parallel=2, n_ctx=2048, batch_timeout_ms=5)
    stream = llm.stream("Once upon a time", max_tokens=400, ignore_eos=True)
    pieces = Pieces(stream)
    try:
        assert pieces.wait_for(1)
        if kind == "tokenize":
            future: Any = llm.submit_tokenize("hi\n" * 25_000 + MARK)
        else:  # fits in the context: "hello " is one token
            future = llm.submit("hello " * 300 + MARK, max_tokens=1)
        assert gate.entered.wait(WAIT_S)
        seen = pieces.count
        assert pieces.wait_for(seen + 3), "the stream stopped while a long text was being tokenized"
    finally:
        gate.opened.set()
    result = future.result(WAIT_S)
    assert len(result.token_ids) > 50_000 if kind == "tokenize" else result.usage.prompt_tokens > 300
    assert gate.threads and all(name.startswith("llamactor-prep") for name in gate.threads)
    stream.cancel()


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(start_llm: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """75 KB cannot be 1023 tokens or fewer (no Gemma token is over 48 bytes): ``ContextExceededError``
    (llama-server's 400) without tokenizing it; a prompt whose bytes exceed the context but whose
    tokens fit runs."""
    llm = start_llm(n_parallel=1, n_ctx=1024)
    tokenized: list[int] = []
    original = Tokenizer._tokenize
    monkeypatch.setattr(Tokenizer, "_tokenize", lambda tok, data, *a: (tokenized.append(len(data)), original(tok, data, *a))[1])
    with pytest.raises(ContextExceededError) as refused:
        llm.ask("hi\n" * 25_000, max_tokens=4)
    assert refused.value.details["n_ctx"] == 1024 and refused.value.details["n_prompt_tokens"] > 1023
    assert not tokenized
    with pytest.raises(ContextExceededError):
        llm.chat([{"role": "user", "content": "hi\n" * 25_000}], max_tokens=4)
    assert all(n < 1024 for n in tokenized)  # the chat was rendered, not tokenized
    fits = llm.ask("hello " * 300, max_tokens=1)  # 1800 bytes, about 300 tokens
    assert 300 <= fits.usage.prompt_tokens < 1023


def test_a_request_cancelled_while_its_prompt_is_tokenized_is_answered_at_once_and_dropped(
        start_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(monkeypatch)
    prepared = threading.Event()
    original = PromptPrep._prepare
    monkeypatch.setattr(PromptPrep, "_prepare", lambda prep, msg: (original(prep, msg), prepared.set())[0])
    llm = start_llm(n_parallel=2)
    try:
        future = llm.submit("hello " * 400 + MARK, max_tokens=50, request_id="held", ignore_eos=True)  # the pool's
        assert gate.entered.wait(WAIT_S)
        llm.cancel("held")
        with pytest.raises(CancelledError):
            future.result(WAIT_S)  # while its tokenize is still held
    finally:
        gate.opened.set()
    assert prepared.wait(WAIT_S)  # its PromptPrepared is in the batcher's inbox before the ask below
    stats = llm.stats()
    assert stats["running"] == 0 and stats["pending"] == 0 and stats["tokens_generated"] == 0


def test_a_small_prompt_is_prepared_on_the_batcher_at_once_and_a_larger_one_on_the_pool(
        start_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hop to the pool and back costs a request a step of latency when others run: a prompt of at
    most ``INLINE_CHARS`` characters (a few ms to tokenize) is prepared on the batcher thread;
    a longer one, a chat with tools or many messages, on the pool."""
    gate = Gate(monkeypatch)
    gate.opened.set()
    llm = start_llm(n_parallel=2)
    llm.ask("hi " + MARK, max_tokens=1)
    llm.chat([{"role": "user", "content": "hi " + MARK}], max_tokens=1)
    assert len(gate.threads) == 2 and not any(name.startswith("llamactor-prep") for name in gate.threads)
    llm.ask("x" * INLINE_CHARS + MARK, max_tokens=1)
    llm.chat([{"role": "user", "content": "hi"}] * (INLINE_MESSAGES + 1) + [{"role": "user", "content": MARK}],
             max_tokens=1)
    assert len(gate.threads) == 4 and all(name.startswith("llamactor-prep") for name in gate.threads[2:])


def test_an_error_while_preparing_fails_that_request_alone(start_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug while preparing one prompt is that request's 500, naming it; a caller's mistake keeps its
    400; the batcher goes on (no restart) and serves the next request."""
    original = PromptBuilder.prompt_tokens

    def prompt_tokens(builder: PromptBuilder, msg: Any, *args: Any) -> Any:
        if msg.text == "bug":
            raise KeyError("a bug")
        if msg.text == "mistake":
            raise InvalidRequestError("a mistake")
        return original(builder, msg, *args)

    monkeypatch.setattr(PromptBuilder, "prompt_tokens", prompt_tokens)
    llm = start_llm(n_parallel=2)
    with pytest.raises(LlamactorError) as bug:
        llm.ask("bug", max_tokens=2, request_id="buggy")
    assert isinstance(bug.value, RequestFailedError) and bug.value.http_status == 500 and "buggy" in str(bug.value)
    with pytest.raises(InvalidRequestError, match="a mistake"):
        llm.ask("mistake", max_tokens=2)
    assert llm.ask("Hello", max_tokens=2).usage.completion_tokens == 2
    assert llm.stats()["restarts"] == 0


@pytest.mark.timeout(WAIT_S + 120)
def test_a_stopping_batcher_waits_for_the_tokenize_in_flight_before_it_frees_the_model(
        start_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vocabulary dies with the engine: a batcher that fails while a worker tokenizes closes
    its pool (waiting for that worker) before the engine; the next batcher tokenizes it again."""
    gate = Gate(monkeypatch)
    closing = threading.Event()
    close_pool, close_engine = PromptPrep.close, Engine.close
    monkeypatch.setattr(PromptPrep, "close", lambda prep: (closing.set(), close_pool(prep))[1])
    monkeypatch.setattr(Engine, "close", lambda engine: (gate.events.append("engine_closed"), close_engine(engine))[1])
    llm = start_llm(n_parallel=2)
    try:
        future = llm.submit_tokenize("hi\n" * 1000 + MARK)
        assert gate.entered.wait(WAIT_S)
        assert llm.inject_crash()
        assert closing.wait(WAIT_S)
    finally:
        gate.opened.set()
    assert len(future.result(WAIT_S).token_ids) > 2000  # replayed on the next batcher
    assert gate.events[:3] == ["tokenize_started", "tokenize_ended", "engine_closed"]
    assert llm.stats()["restarts"] == 1
