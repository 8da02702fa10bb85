"""Embeddings: the pure queue and retry rule, then llm.embed and /v1/embeddings on the real model."""

from __future__ import annotations

import base64
import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import openai
import pytest

import llamactor
from llamactor import InvalidRequestError
from llamactor.tree.embedding_steps import EmbeddingSteps, encoder_positions
from llamactor.scheduling.embedding_queue import EmbeddingJob, EmbeddingQueue
from llamactor.base.messages import Embed, ReplyChannel
from llamactor.native.embedding import EmbeddingNoRoomError
from llamactor.native.tokenizer import Tokenizer

from tests.conftest import NotAMessage, batcher_ref
from tests.support.stub_tree import INFO
from tests.support.daemon import MODEL_ID, Daemon, start_daemon

TEXTS = ["The cat sat on the mat.", "Quantum computers use qubits.", "Paris is the capital of France.",
         "I like green tea in the morning, with a little honey and lemon.", "Hello there, how are you today?"]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _job(rid: str, n: int, pooling: str = "mean") -> EmbeddingJob:
    msg = Embed(request_id=rid, inputs=("x",) * n, reply=ReplyChannel(), submitted_at=time.perf_counter())
    return EmbeddingJob(msg, pooling, [0] * n, np.zeros((n, 4), np.float32))


@pytest.mark.pure
def test_the_queue_packs_inputs_of_many_requests_first_fit_within_tokens_and_ids() -> None:
    queue = EmbeddingQueue(n_batch=10, n_seq_max=3)
    queue.add(_job("a", 2), [[1] * 6, [1] * 5])
    queue.add(_job("b", 2), [[1] * 3, [1] * 1])
    first = queue.pack()
    assert [(i.job.request.request_id, i.index) for i in first] == [("a", 0), ("b", 0), ("b", 1)]  # 6 + 3 + 1
    assert [(i.job.request.request_id, i.index) for i in queue.pack()] == [("a", 1)]
    with pytest.raises(InvalidRequestError, match="n_ubatch = 10"):
        queue.add(_job("c", 1), [[1] * 11])
    assert not queue.waiting  # nothing of the refused request was queued


@pytest.mark.pure
def test_one_step_holds_one_pooling_and_embeddings_get_their_share_of_time_under_generation() -> None:
    queue = EmbeddingQueue(n_batch=100, n_seq_max=8, share=0.2)
    queue.add(_job("a", 1, "mean"), [[1, 2]])
    queue.add(_job("b", 1, "last"), [[1, 2]])
    queue.add(_job("c", 1, "mean"), [[1, 2]])
    assert [i.job.request.request_id for i in queue.pack()] == ["a", "c"]
    assert not queue.turn(generation_waiting=True)  # contention starts: generation goes first
    queue.charge(False, 25.0)
    assert queue.turn(generation_waiting=True)  # embeddings have used 0% of the time
    queue.charge(True, 100.0)  # one long embedding step
    turns = []
    for _ in range(6):
        turns.append(queue.turn(generation_waiting=True))
        queue.charge(turns[-1], 100.0 if turns[-1] else 25.0)
    assert turns == [False] * 6  # 100 ms of embedding needs more than 400 ms of generation (20%)
    queue.charge(False, 250.0)
    assert queue.turn(generation_waiting=True)
    assert queue.turn(generation_waiting=False) and queue.contended_ms == [0.0, 0.0]


@pytest.mark.pure
def test_while_generation_waits_an_embedding_step_is_a_quarter_of_the_budget() -> None:
    queue = EmbeddingQueue(n_batch=100, n_seq_max=8)
    queue.add(_job("a", 4), [[1] * 20, [1] * 20, [1] * 20, [1] * 20])
    queue.add(_job("big", 1), [[1] * 90])
    assert len(queue.pack(contended=True)) == 1  # 25 tokens: one input of 20
    assert len(queue.pack(contended=False)) == 3  # the rest of "a" (60); "big" does not fit
    assert [len(i.token_ids) for i in queue.pack(contended=True)] == [90]  # alone, however long


@pytest.mark.pure
def test_an_encoders_inputs_end_at_its_training_context_a_decoders_at_the_step() -> None:
    queue = EmbeddingQueue(n_batch=512, n_seq_max=8, max_input_tokens=128)
    with pytest.raises(InvalidRequestError, match="positions for 128 tokens"):
        queue.add(_job("long", 1), [[1] * 129])
    queue.add(_job("fits", 1), [[1] * 128])
    encoder = {"general.architecture": "bert", "bert.attention.causal": "false"}
    assert encoder_positions(replace(INFO, n_ctx_train=128, metadata=encoder)) == 128
    assert encoder_positions(replace(INFO, n_ctx_train=128, metadata={"general.architecture": "llama"})) is None


@pytest.mark.pure
def test_a_step_without_room_is_retried_in_halves_and_only_an_input_that_never_fits_fails() -> None:
    def fake_embed(inputs: list[list[int]], pooling: str) -> np.ndarray:
        if len(inputs) > 2 or any(len(t) > 50 for t in inputs):
            raise EmbeddingNoRoomError("no room")
        return np.array([[float(len(t)), 1.0, 0.0, 0.0] for t in inputs], np.float32)

    class Vocab(Tokenizer):  # the vocabulary's own checks, without a model
        def __init__(self) -> None:
            self.n_vocab = 100

    steps = EmbeddingSteps(EmbeddingQueue(1000, 16), Vocab(), fake_embed, 4, "mean")
    good = Embed(request_id="good", inputs=tuple((1,) * k for k in (3, 4, 5, 6, 7)), reply=ReplyChannel(),
                 submitted_at=time.perf_counter(), normalize=False)
    bad = Embed(request_id="bad", inputs=((1,) * 60,), reply=ReplyChannel(), submitted_at=time.perf_counter())
    steps.add(good)
    steps.add(bad)
    steps.step()
    assert [v[0] for v in good.reply.future.result(timeout=1).vectors] == [3, 4, 5, 6, 7]
    with pytest.raises(llamactor.ContextFullError):
        bad.reply.future.result(timeout=1)
    assert steps.n_retries >= 2


@pytest.fixture(scope="module")
def reference(model_path: str) -> Iterator[object]:
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

    ref = Llama(model_path, embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_ctx=512, n_batch=512,
                n_threads=2, verbose=False)
    yield ref
    ref.close()


def test_a_list_embeds_as_each_input_alone_and_as_llama_cpp_python_does(llm: llamactor.LLM, reference) -> None:
    together = llm.embed(TEXTS)
    assert together.vectors.shape == (len(TEXTS), llm.info.n_embd) and together.pooling == "mean"
    assert np.allclose(np.linalg.norm(together.vectors, axis=1), 1.0, atol=1e-5)
    theirs = reference.embed(TEXTS, normalize=True)
    for text, ours, ref in zip(TEXTS, together, theirs):
        assert cosine(ours, llm.embed(text)[0]) >= 0.999
        assert cosine(ours, np.array(ref)) >= 0.999
    assert together.prompt_tokens == sum(len(reference.tokenize(t.encode())) for t in TEXTS)
    last = llm.embed(TEXTS[:2], pooling="last")
    assert cosine(last[0], llm.embed(TEXTS[0], pooling="last")[0]) >= 0.999 and cosine(last[0], together[0]) < 0.999


def test_dimensions_truncate_then_renormalize_and_normalize_false_keeps_the_raw_vector(llm: llamactor.LLM) -> None:
    full = llm.embed("hello world", normalize=False)[0]
    short = llm.embed("hello world", dimensions=64)[0]
    assert short.shape == (64,) and abs(np.linalg.norm(short) - 1) < 1e-5
    assert np.allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-4)
    assert abs(np.linalg.norm(full) - 1) > 1e-3


def test_thirty_two_concurrent_callers_are_packed_into_few_steps(start_llm) -> None:
    llm = start_llm(n_parallel=4)
    llm.embed("warm up")  # the embedding context is made on first use
    before = llm.stats()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: llm.embed(f"sentence number {i} about {TEXTS[i % 5]}"), range(32)))
    after = llm.stats()
    steps = after["embedding_steps"] - before["embedding_steps"]
    assert all(len(r) == 1 for r in results) and after["embedding_inputs"] - before["embedding_inputs"] == 32
    assert steps <= 8, f"32 inputs took {steps} steps"


def test_an_input_longer_than_a_physical_batch_is_refused_and_others_go_on(llm: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="n_ubatch = 512"):
        llm.embed(["short", "word " * 600])
    assert len(llm.embed("still fine")) == 1


def test_generation_running_at_the_same_time_completes(llm: llamactor.LLM) -> None:
    stream = llm.stream("Once upon a time", max_tokens=48, ignore_eos=True, temperature=0)
    futures = [llm.submit_embed([f"text {i} {t}" for t in TEXTS]) for i in range(8)]
    pieces = list(stream)
    assert stream.completion.usage.completion_tokens == 48 and pieces
    assert all(len(f.result(timeout=60)) == len(TEXTS) for f in futures)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--n-parallel", "4")
    yield d
    assert d.stop() == 0


def test_the_openai_client_gets_embeddings_as_floats_and_as_base64(daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", max_retries=0)
    floats = client.embeddings.create(model=MODEL_ID, input=TEXTS[:3], encoding_format="float")
    packed = client.embeddings.create(model=MODEL_ID, input=TEXTS[:3], encoding_format="base64")  # left encoded
    default = client.embeddings.create(model=MODEL_ID, input=TEXTS[:3])  # the client asks base64, decodes it
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.usage.prompt_tokens > 3
    for a, b, c in zip(floats.data, packed.data, default.data):
        decoded = np.frombuffer(base64.b64decode(b.embedding), dtype="<f4")  # type: ignore[arg-type]
        assert np.allclose(a.embedding, decoded, atol=1e-6) and np.allclose(a.embedding, c.embedding, atol=1e-6)
    tokens = client.embeddings.create(model=MODEL_ID, input=[[2, 651, 4799], [2, 9259]], dimensions=32)
    assert [len(d.embedding) for d in tokens.data] == [32, 32]
    with pytest.raises(openai.BadRequestError, match="physical batch"):
        client.embeddings.create(model=MODEL_ID, input="word " * 600)


def test_embedding_requests_survive_a_batcher_crash(start_llm) -> None:
    llm = start_llm(n_parallel=2)
    expected = llm.embed(TEXTS[0])[0]
    batcher_ref(llm).tell(NotAMessage())
    futures = [llm.submit_embed(TEXTS) for _ in range(4)]  # some may meet the dying batcher: replayed
    assert all(cosine(f.result(timeout=60)[0], expected) >= 0.999 for f in futures)
    assert llm.stats()["restarts"] == 1
