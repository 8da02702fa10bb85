"""Where the numbers part: one sequence's logits alone vs beside others (docs/performance.md,
*Where the numbers part*).

Runs llama.cpp's low-level API directly (``llama_batch`` / ``llama_decode`` /
``llama_get_logits_ith``), not llamactor's engine, so that each candidate cause is isolated by a
minimal A/B. A *target* sequence (a short prompt, then ``K`` teacher-forced tokens, so that no
greedy divergence can hide or add a difference) runs once alone and once in each variant; its
float32 logits rows are compared bit for bit (``np.array_equal``) and by the largest absolute
difference, separately for its prompt rows ("prefill") and its one-token rows ("decode").
``--part trace`` names the first graph tensor in which a row parts
(``examples/batch_invariance_trace.py``); ``--part verify / engine / long`` check the settings that
came out exact (``examples/batch_invariance_recipe.py``; run them with ``GGML_CPU_TILED_MM=0``,
which ggml reads once per process). Results: docs/performance.md, "Where the numbers part".

    RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 .venv/bin/python examples/batch_invariance.py

One thread by default (the thread count is a candidate of its own); about a minute a part.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import llama_cpp
import numpy as np

from llamactor.base.models import default_model_path, instruct_model_path

K = 4  # teacher-forced decode steps
TARGET = "The quick brown fox jumps over the lazy dog, and then it"
CONTINUATION = " runs into the old barn behind the"
OTHERS = ["Once upon a time in a small village", "def fibonacci(n):\n    return", "The capital of France is",
          "1, 2, 3, 4, 5, 6,", "Water boils at a temperature of", "In the beginning was the word",
          "My favourite colour is blue because", "Rain fell all night on the"]
SLOT = 3  # the target's sequence id and place in a batch of 8


@dataclass(frozen=True)
class Setup:
    """The llama.cpp settings of one context (one model instance per ``extra_bufts``)."""

    unified: bool = True  # kv_unified: one cell pool for all sequences (llamactor's engine: True)
    extra_bufts: bool = True  # use_extra_bufts: repacked weights (CPU_REPACK GEMM/GEMV kernels)
    flash: bool = False
    n_threads: int = 1  # llama.cpp's n_threads: what a ubatch of one token is computed with
    n_threads_batch: int = 0  # larger ubatches; 0: n_threads (the batch-invariant mode: 1 and n)
    n_ubatch: int = 512
    n_ctx: int = 2048  # kv_unified off: each of the 8 streams gets an eighth
    shadows: bool = False  # every token also carries sequence id + 8, as in llamactor's engine

    def label(self) -> str:
        return (f"unified={'T' if self.unified else 'F'} repack={'T' if self.extra_bufts else 'F'} "
                f"fa={'on' if self.flash else 'off'}" + (f" thr={self.n_threads}" if self.n_threads != 1 else "")
                + (f" thr_batch={self.n_threads_batch}" if self.n_threads_batch else "")
                + (f" ub={self.n_ubatch}" if self.n_ubatch != 512 else "") + (" shadows" if self.shadows else ""))



Entry = tuple[int, int, int, bool]  # token, position, sequence id, wants logits


class Ctx:
    """One context over a shared model: 8 sequence ids, f16 KV, ``swa_full`` as in the engine.
    ``cb_eval``: llama.cpp's per-tensor callback (the trace)."""

    _models: dict[tuple[str, bool], int] = {}

    def __init__(self, path: str, setup: Setup, cb_eval: object = None) -> None:
        key = (path, setup.extra_bufts)
        if key not in self._models:
            mp = llama_cpp.llama_model_default_params()
            mp.n_gpu_layers = 0
            mp.use_extra_bufts = setup.extra_bufts
            self._models[key] = llama_cpp.llama_model_load_from_file(path.encode(), mp)
        self.model = self._models[key]
        cp = llama_cpp.llama_context_default_params()
        self.n_ids = 2 if setup.shadows else 1
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = setup.n_ctx, 2048, setup.n_ubatch, len(OTHERS) * self.n_ids
        cp.n_threads, cp.n_threads_batch = setup.n_threads, setup.n_threads_batch or setup.n_threads
        cp.kv_unified, cp.swa_full, cp.no_perf = setup.unified, True, True
        cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if setup.flash
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if cb_eval is not None:
            cp.cb_eval = cb_eval
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        assert self.ctx, f"no context for {setup}"
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)

    def tokens(self, text: str, bos: bool) -> list[int]:
        buf = (llama_cpp.llama_token * 256)()
        n = llama_cpp.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, 256, bos, False)
        return list(buf[:n])

    def decode(self, entries: list[Entry]) -> list[np.ndarray]:
        """One ``llama_decode`` of ``entries``; the logits of those that asked, in order."""
        batch = llama_cpp.llama_batch_init(len(entries), 0, self.n_ids)
        try:
            for i, (tok, pos, seq, out) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, self.n_ids, out
                for j in range(self.n_ids):
                    batch.seq_id[i][j] = seq + j * len(OTHERS)
            batch.n_tokens = len(entries)
            rc = llama_cpp.llama_decode(self.ctx, batch)
            assert rc == 0, f"llama_decode returned {rc}"
        finally:
            llama_cpp.llama_batch_free(batch)
        rows = [i for i, e in enumerate(entries) if e[3]]
        return [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), (self.n_vocab,)).copy()
                for i in rows]


@dataclass
class Rows:
    prefill: np.ndarray  # [prompt tokens, vocab]: the target's prompt rows
    decode: np.ndarray  # [K, vocab]: its one-token rows


class Target:
    """The token ids of the target and of the other sequences (the same in every setup): each
    sequence's prompt and ``K`` teacher-forced continuation tokens (the others': their prompt's)."""

    def __init__(self, ctx: Ctx) -> None:
        self.prompt = ctx.tokens(TARGET, True)
        self.cont = ctx.tokens(CONTINUATION, False)[:K]
        self.others = [ctx.tokens(t, True) for t in OTHERS]
        self.prompts = [self.prompt if s == SLOT else p for s, p in enumerate(self.others)]
        self.conts = [self.cont if s == SLOT else (p * K)[:K] for s, p in enumerate(self.others)]


def _prompt(seq: int, toks: list[int], start: int = 0, out: bool = True) -> list[Entry]:
    return [(t, start + p, seq, out) for p, t in enumerate(toks)]


def alone(ctx: Ctx, t: Target, chunks: tuple[int, ...] = (), filler: int = 0, seq: int = SLOT) -> Rows:
    """Sequence ``seq`` (the target) in an empty cache, its prompt in one decode (or cut at
    ``chunks``), then ``K`` one-token decodes. ``filler``: another sequence's cells come first in
    the cache (and stay)."""
    llama_cpp.llama_memory_clear(ctx.mem, True)
    if filler:
        ctx.decode(_prompt(0 if seq else 1, (t.others[0] * 64)[:filler], out=False))
    prompt, cuts = t.prompts[seq], [0, *chunks, len(t.prompts[seq])]
    pre = [r for a, b in zip(cuts, cuts[1:]) for r in ctx.decode(_prompt(seq, prompt[a:b], a))]
    dec = [ctx.decode([(tok, len(prompt) + k, seq, True)])[0] for k, tok in enumerate(t.conts[seq])]
    return Rows(np.stack(pre), np.stack(dec))


def batched(ctx: Ctx, t: Target, n: int = 8, copies: bool = False, prefill_apart: bool = False,
            everyone: bool = False) -> list[Rows]:
    """``n`` sequences prefilled in one decode (``prefill_apart``: the target first and alone, then
    the others in one decode), then ``K`` steps of ``n`` rows. The target is sequence ``SLOT``
    (``copies``: all ``n`` are the target, in separate sequences). Returns the target's rows
    (``copies`` or ``everyone``: every sequence's, in sequence order)."""
    llama_cpp.llama_memory_clear(ctx.mem, True)
    slot = min(SLOT, n - 1)
    prompts = [t.prompt if copies else t.prompts[s] for s in range(n)]
    conts = [t.cont if copies else t.conts[s] for s in range(n)]
    mine = list(range(n)) if copies or everyone else [slot]
    order = [slot] + [s for s in range(n) if s != slot] if prefill_apart else list(range(n))
    groups = [order[:1], order[1:]] if prefill_apart else [order]
    flat = [r for g in groups for r in ctx.decode([e for s in g for e in _prompt(s, prompts[s], out=s in mine)])]
    pre, at = {}, 0
    for s in (s for s in order if s in mine):  # the output rows come in batch order
        pre[s], at = np.stack(flat[at:at + len(prompts[s])]), at + len(prompts[s])
    dec: dict[int, list[np.ndarray]] = {s: [] for s in mine}
    for k in range(K):
        rows = ctx.decode([(conts[s][k], len(prompts[s]) + k, s, s in mine) for s in range(n)])
        for s, row in zip(mine, rows):
            dec[s].append(row)
    return [Rows(pre[s], np.stack(dec[s])) for s in mine]


def diff(a: Rows, b: Rows) -> tuple[str, str]:
    def one(x: np.ndarray, y: np.ndarray) -> str:
        return "exact" if np.array_equal(x, y) else f"{float(np.abs(x - y).max()):.2g}"
    return one(a.prefill, b.prefill), one(a.decode, b.decode)


def _row(model: str, cand: str, setting: str, d: tuple[str, str]) -> None:
    print(f"| {model} | {cand} | {setting} | {d[0]} | {d[1]} |", flush=True)


def _contexts(path: str, setups: list[Setup]) -> Iterator[tuple[Setup, Ctx, Target]]:
    for setup in setups:
        ctx = Ctx(path, setup)
        yield setup, ctx, Target(ctx)
        ctx.close()


def candidates(name: str, path: str) -> None:
    """Each candidate alone, against the target alone with the engine's settings (unified KV,
    repack, flash attention off, one thread, n_ubatch 512)."""
    base = Setup()
    for _, ctx, t in _contexts(path, [base]):
        ref = alone(ctx, t)
        _row(name, "0 nothing", "alone twice in one context", diff(ref, alone(ctx, t)))
        for n in (1, 8, 16, 40):
            _row(name, "1 KV placement", f"alone, {n} cells of another sequence first", diff(ref, alone(ctx, t, filler=n)))
        mid = len(t.prompt) // 2
        _row(name, "4 prompt chunks", f"prompt as {mid}+{len(t.prompt) - mid} tokens", diff(ref, alone(ctx, t, (mid,))))
        _row(name, "4 prompt chunks", "prompt one token a step", diff(ref, alone(ctx, t, tuple(range(1, len(t.prompt))))))
        for setup in (replace(base, unified=False), replace(base, extra_bufts=False), replace(base, flash=True),
                      replace(base, n_threads=2), replace(base, n_ubatch=8)):
            for _, other, _t in _contexts(path, [setup]):
                _row(name, "settings", f"alone, {setup.label()}", diff(ref, alone(other, t)))


def rows_effect(name: str, path: str) -> None:
    """Candidate 2 isolated: ``n`` copies of the target, each its own KV stream (kv_unified off),
    so every copy's attention sees exactly its cells alone: a difference is a matmul kernel that
    depends on the ubatch's row count (or on a row's place in it)."""
    for setup, ctx, t in _contexts(path, [Setup(unified=False), Setup(unified=False, extra_bufts=False)]):
        ref = alone(ctx, t)
        for n in (2, 3, 4, 5, 8):
            per = [diff(ref, c) for c in batched(ctx, t, n=n, copies=True)]
            _row(name, "2 rows in a ubatch", f"{n} copies vs alone, {setup.label()} (per copy)",
                 (" ".join(p for p, _ in per), " ".join(d for _, d in per)))


def combos(name: str, path: str) -> None:
    """Alone vs slot 3 of a batch of 8 for each combination of the switches: prefill rows with the
    8 prompts in one decode, decode rows after the target's prompt was prefilled alone."""
    setups = [Setup(unified=u, extra_bufts=r, flash=f) for u in (True, False) for r in (True, False) for f in (False, True)]
    for setup, ctx, t in _contexts(path, setups):
        ref = alone(ctx, t)
        pre, _ = diff(ref, batched(ctx, t)[0])
        _, dec = diff(ref, batched(ctx, t, prefill_apart=True)[0])
        _row(name, "batch of 8", setup.label(), (pre, dec))


def sampler_side(path: str) -> None:
    """Candidate 5: our reductions (native/scoring.py) on bit-equal logits rows at another address
    and alone, and the size of an fp32 (instead of fp64) softmax denominator."""
    from llamactor.native.scoring import score_rows
    for _, ctx, t in _contexts(path, [Setup()]):
        rows = alone(ctx, t).prefill
        token = list(t.prompt[1:]) + [t.cont[0]]
    a = score_rows(rows, token, 5)
    moved = np.empty(rows.size + 3, np.float32)[3:].reshape(rows.shape)  # another alignment
    moved[:] = rows
    b = score_rows(moved, token, 5)
    single = [score_rows(r[None, :], [tok], 5).logprobs[0] for r, tok in zip(rows, token)]
    same = a.logprobs == b.logprobs == single and a.top_logprobs == b.top_logprobs and a.ranks == b.ranks
    f32 = [float(r[tok] - r.max() - np.log(np.exp(r - r.max()).sum(dtype=np.float32))) for r, tok in zip(rows, token)]
    _row("gemma3-270m", "5 our reductions", "score_rows on equal logits: other address, one row at a time; "
         "fp32 vs fp64 denominator", ("exact" if same else "differ", f"{max(abs(x - y) for x, y in zip(f32, a.logprobs)):.2g}"))


def throughput(name: str, path: str, steps: int = 16) -> None:
    """8 streams: prefill tokens/s (8 prompts of 64 tokens in one decode) and decode tokens/s
    (``steps`` steps of 8 rows), best of three. Run it once per ``GGML_CPU_TILED_MM`` value."""
    exact = Setup(extra_bufts=False, flash=True, n_ubatch=32)
    for setup, ctx, t in _contexts(path, [Setup(), Setup(flash=True), replace(exact, n_ubatch=512), exact]):
        prompts = [(p * 64)[:64] for p in t.others]
        pre = dec = 0.0
        for _ in range(3):
            llama_cpp.llama_memory_clear(ctx.mem, True)
            t0 = time.perf_counter()
            ctx.decode([e for s, p in enumerate(prompts) for e in _prompt(s, p, out=False)])
            t1 = time.perf_counter()
            for k in range(steps):
                ctx.decode([(t.cont[k % K], 64 + k, s, True) for s in range(len(prompts))])
            t2 = time.perf_counter()
            pre, dec = max(pre, 8 * 64 / (t1 - t0)), max(dec, steps * 8 / (t2 - t1))
        _row(name, "speed", f"8 streams, {setup.label()}", (f"{pre:.0f} tok/s", f"{dec:.0f} tok/s"))


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level: int, text: bytes, user_data: int) -> None:
    if level == 4:  # errors only
        print(text.decode(errors="replace"), end="")


MODELS = [("gemma3-270m", default_model_path), ("smollm2-135m", instruct_model_path)]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parts = ["candidates", "rows", "combos", "verify", "engine", "long", "holes", "sampler", "trace", "speed"]
    ap.add_argument("--part", choices=[*parts, "all"], default="all", help="all: every part but speed")
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    models = [(n, f()) for n, f in MODELS]
    from batch_invariance_recipe import engine_like, holes, long_context, verify  # beside this file
    from batch_invariance_trace import trace

    run: dict[str, Callable[[str, str], None]] = {"candidates": candidates, "rows": rows_effect, "combos": combos,
                                                  "verify": verify, "engine": engine_like, "long": long_context, "holes": holes, "trace": trace,
                                                  "speed": throughput}
    print("| model | candidate | setting | prefill rows | decode rows |\n|---|---|---|---|---|")
    for part in parts:
        if args.part == part or (args.part == "all" and part != "speed"):
            if part == "sampler":
                sampler_side(models[0][1])
                continue
            for name, path in models:
                run[part](name, path)


if __name__ == "__main__":
    main()
