"""The two yardsticks llamactor is measured against, on the same model and threads.

* ``sequential``: requests one at a time through ``llama_cpp.Llama.create_completion`` — what a
  llama-cpp-python user has today.
* ``score_one_at_a_time``: prompt log-likelihoods through ``Llama(logits_all=True)``, one at a time;
  ``label_scores_one_at_a_time``: a rerank's judging prompts, the same way, read as P(yes) / (P(yes) + P(no)).
* ``ceiling``: the engine's raw batched decode — prefill B prompts, then one token for each of the
  B sequences per ``llama_decode``, argmax, no scheduler, no actors: the most llama.cpp gives on
  this machine at that batch size.

Both run on the calling thread with their own llama context; nothing else may be running.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import llama_cpp
import numpy as np

from llamactor.native.engine import Engine


@dataclass(frozen=True, slots=True)
class RunTiming:
    n_requests: int
    n_tokens: int  # generated
    seconds: float
    ttft_ms: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0


class Sequential:
    """Each prompt alone through ``Llama.create_completion`` (greedy, streamed to time the first token).

    Kept open so its runs can interleave with llamactor's: alternating the two cancels the drift
    of a shared machine's speed over minutes.
    """

    def __init__(self, model_path: str, *, n_ctx: int, n_threads: int, n_gpu_layers: int = 0) -> None:
        self.llm = llama_cpp.Llama(model_path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                                   n_gpu_layers=n_gpu_layers, verbose=False)
        self.llm.create_completion("warm up", max_tokens=2, temperature=0)

    def run(self, prompts: list[str], max_tokens: int) -> RunTiming:
        n_tokens, ttfts = 0, []
        start = time.perf_counter()
        for prompt in prompts:
            t0 = time.perf_counter()
            first: float | None = None
            for _chunk in self.llm.create_completion(prompt, max_tokens=max_tokens, temperature=0, stream=True):
                first = first or time.perf_counter()
                n_tokens += 1
            ttfts.append(((first or time.perf_counter()) - t0) * 1000)
        return RunTiming(len(prompts), n_tokens, time.perf_counter() - start, ttfts)

    def close(self) -> None:
        self.llm.close()


def ceiling(model_path: str, prompts: list[str], max_tokens: int, *, n_ctx: int, n_threads: int,
            n_batch: int = 512, n_gpu_layers: int = 0) -> RunTiming:
    """All prompts as one batch: prefill together, then B tokens per decode, argmax, EOG ignored."""
    b = len(prompts)
    engine = Engine(model_path, n_ctx=n_ctx, n_batch=max(n_batch, b), n_ubatch=n_batch, n_seq_max=b,
                    n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    try:
        tokenized = [engine.tokenizer.tokenize(p) for p in prompts]
        start = time.perf_counter()
        next_tokens = _prefill_argmax(engine, tokenized)
        ttft = (time.perf_counter() - start) * 1000
        n_past = [len(t) for t in tokenized]
        for step in range(max_tokens - 1):
            entries = [(i, int(next_tokens[i]), n_past[i] + step) for i in range(b)]
            next_tokens = engine.decode_batch(entries).logits.argmax(axis=1)
        return RunTiming(b, b * max_tokens, time.perf_counter() - start, [ttft] * b)
    finally:
        engine.close()


def _prefill_argmax(engine: Engine, tokenized: list[list[int]]) -> np.ndarray:
    """Every prompt's KV in decodes of at most ``n_batch`` tokens (64 prompts outgrow one); the
    argmax after each prompt's last token, in prompt order."""
    tokens = np.concatenate([np.asarray(t, np.int32) for t in tokenized])
    pos = np.concatenate([np.arange(len(t), dtype=np.int32) for t in tokenized])
    seq = np.concatenate([np.full(len(t), i, np.int32) for i, t in enumerate(tokenized)])
    wants = np.concatenate([np.array([0] * (len(t) - 1) + [1], np.int8) for t in tokenized])
    step = engine.info.n_batch
    firsts = [engine.decode(tokens[i:i + step], pos[i:i + step], seq[i:i + step], wants[i:i + step])
              .logits.argmax(axis=1).astype(np.int32) for i in range(0, len(tokens), step)]
    return np.concatenate(firsts)


def embed_one_at_a_time(model_path: str, texts: list[str], n_threads: int, n_batch: int = 512) -> tuple[float, int]:
    """Each text alone through ``Llama(embedding=True).embed`` (mean pooling, normalized): the
    seconds it takes and the tokens embedded."""
    llm = llama_cpp.Llama(model_path, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=n_batch,
                          n_batch=n_batch, n_ubatch=n_batch, n_threads=n_threads, n_threads_batch=n_threads,
                          verbose=False)
    try:
        llm.embed(texts[0])  # warm up
        n_tokens = sum(len(llm.tokenize(t.encode())) for t in texts)
        start = time.perf_counter()
        for text in texts:
            llm.embed(text, normalize=True)
        return time.perf_counter() - start, n_tokens
    finally:
        llm.close()


def score_one_at_a_time(model_path: str, requests: list[list[int]], n_threads: int, n_ctx: int = 1024) -> float:
    """Each token-id prompt alone through ``Llama(logits_all=True)``: every row's log-softmax and
    top token (numpy, vectorized), then one greedy token as lm-eval's echo request asks; seconds."""
    llm = llama_cpp.Llama(model_path, logits_all=True, n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                          n_threads_batch=n_threads, verbose=False)
    try:
        llm.eval(requests[0][:4])  # warm up
        start = time.perf_counter()
        for ids in requests:
            llm.reset()
            llm.eval(ids)
            rows = llm.scores[:len(ids)]
            top = rows.max(axis=1, keepdims=True)
            logprobs = rows - (np.log(np.exp(rows - top).sum(axis=1, keepdims=True)) + top)
            chosen = logprobs[np.arange(len(ids) - 1), ids[1:]]  # noqa: F841 - what a caller reads
            best = logprobs.argmax(axis=1)  # noqa: F841 - the top-1 alternative per row
        return time.perf_counter() - start
    finally:
        llm.close()


def label_scores_one_at_a_time(model_path: str, prompts: list[list[int]], labels: tuple[tuple[int, ...], ...],
                               n_threads: int, *, flash_attn: bool = False,
                               invariant: bool = False) -> tuple[float, list[float]]:
    """Each judging prompt alone through ``Llama(logits_all=True)``: its last row's share of the
    first label group, mass(group 0) / sum of masses (a rerank's P(yes) / (P(yes) + P(no)));
    the seconds it takes and the scores, in order. ``invariant``: with the kernels of
    batch-invariant mode (``llamactor.native.invariance``: plain weights, flash attention, 32-row
    batches, one thread for a one-row batch; tiled matmuls off is the process's)."""
    n_ctx = -(-max(len(p) for p in prompts) // 64) * 64  # the scores buffer is n_ctx rows of the vocabulary
    with _plain_weights(invariant):
        llm = llama_cpp.Llama(model_path, logits_all=True, n_ctx=n_ctx, n_batch=512, n_ubatch=32 if invariant else 512,
                              n_threads=1 if invariant else n_threads, n_threads_batch=n_threads,
                              flash_attn=flash_attn or invariant, verbose=False)
    try:
        llm.eval(prompts[0][:4])  # warm up
        scores = []
        start = time.perf_counter()
        for ids in prompts:
            llm.reset()
            llm.eval(ids)
            scores.append(group_share(llm.scores[len(ids) - 1], labels))
        return time.perf_counter() - start, scores
    finally:
        llm.close()


@contextlib.contextmanager
def _plain_weights(on: bool) -> Iterator[None]:
    """While a ``Llama`` loads: without llama.cpp's repacked weight buffers, if ``on`` (the
    constructor takes no such option; it starts from the library's default model parameters)."""
    if not on:
        yield
        return
    default = llama_cpp.llama_cpp.llama_model_default_params

    def plain() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params
    with mock.patch.object(llama_cpp.llama_cpp, "llama_model_default_params", plain):
        yield


def group_share(row: np.ndarray, labels: tuple[tuple[int, ...], ...]) -> float:
    """A logits row's probability mass on ``labels[0]`` over the mass on all the groups (float64)."""
    logits = np.asarray(row, dtype=np.float64)
    top = max(logits[list(g)].max() for g in labels)
    masses = [np.exp(logits[list(g)] - top).sum() for g in labels]
    return float(masses[0] / sum(masses))
