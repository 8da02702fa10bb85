"""``batch_invariance.py --part verify / engine / long``: the settings that came out bit-exact
(the *recipe*: flash attention on, no repacked weights, ``n_ubatch`` 32, and
``GGML_CPU_TILED_MM=0`` in the environment) checked harder: every one of the 8 sequences as the
target, the engine's shadow sequence ids and prefix attaches, and long sequences, where llama.cpp's
CPU flash attention changes path.
"""

from __future__ import annotations

from dataclasses import replace

import llama_cpp
import numpy as np

from batch_invariance import (OTHERS, SLOT, Ctx, Rows, Setup, Target, _contexts, _prompt, _row, alone, batched,
                              diff)


def verify(name: str, path: str) -> None:
    """The settings that came out exact (``exact``; run it with ``GGML_CPU_TILED_MM=0``) and their
    neighbours, on every one of the 8 sequences as the target: batch of 8 (prefill rows with the 8
    prompts in one decode, decode rows after each prompt alone) and the prompt cut in two or fed
    one token a step."""
    exact = Setup(extra_bufts=False, flash=True, n_ubatch=32)  # and GGML_CPU_TILED_MM=0 in the environment
    for setup, ctx, t in _contexts(path, [replace(exact, unified=False, flash=False, n_ubatch=512),
                                          replace(exact, unified=False, n_ubatch=512), replace(exact, n_ubatch=512),
                                          exact, replace(exact, n_threads=2)]):
        refs = [alone(ctx, t, seq=s) for s in range(len(OTHERS))]
        got = batched(ctx, t, everyone=True)
        apart = batched(ctx, t, everyone=True, prefill_apart=True)
        checks = {"batch of 8, prefill rows": [diff(r, g)[0] for r, g in zip(refs, got)],
                  "batch of 8, decode rows": [diff(r, g)[1] for r, g in zip(refs, apart)],
                  "prompt in 2 chunks": [diff(r, alone(ctx, t, (len(t.prompts[s]) // 2,), seq=s))[0]
                                         for s, r in enumerate(refs)],
                  "prompt one token a step": [diff(r, alone(ctx, t, tuple(range(1, len(t.prompts[s]))), seq=s))[0]
                                              for s, r in enumerate(refs)]}
        for label, per in checks.items():
            worst = max((float(x) for x in per if x != "exact"), default=0.0)
            verdict = "exact" if not worst else f"{sum(x == 'exact' for x in per)}/8 exact, max {worst:.2g}"
            _row(name, "8 targets", f"{label}, {setup.label()}", (verdict, "") if "decode" not in label else ("", verdict))


def attached(ctx: Ctx, t: Target) -> Rows:
    """The target's first half computed by sequence 5 after another sequence's prompt, then
    copied to the target (``llama_memory_seq_cp``, shadows too), as a prefix-cache hit does."""
    llama_cpp.llama_memory_clear(ctx.mem, True)
    ctx.decode(_prompt(0, t.others[0], out=False))
    half = len(t.prompt) // 2
    first = ctx.decode(_prompt(5, t.prompt[:half]))
    for j in range(ctx.n_ids):
        llama_cpp.llama_memory_seq_cp(ctx.mem, 5 + j * len(OTHERS), SLOT + j * len(OTHERS), 0, half)
    rest = ctx.decode(_prompt(SLOT, t.prompt[half:], half))
    dec = [ctx.decode([(tok, len(t.prompt) + k, SLOT, True)])[0] for k, tok in enumerate(t.cont)]
    return Rows(np.stack(first + rest), np.stack(dec))


def engine_like(name: str, path: str) -> None:
    """The recipe (with ``GGML_CPU_TILED_MM=0``) under the engine's habits: shadow sequence ids
    on every cell and a prompt prefix attached from another sequence."""
    recipe = Setup(extra_bufts=False, flash=True, n_ubatch=32)
    plain = Ctx(path, recipe)
    t = Target(plain)
    ref = alone(plain, t)
    plain.close()
    for setup, ctx, _ in _contexts(path, [recipe, replace(recipe, shadows=True)]):
        _row(name, "engine", f"alone, {setup.label()} vs without shadows", diff(ref, alone(ctx, t)))
        _row(name, "engine", f"batch of 8, {setup.label()}", diff(ref, batched(ctx, t)[0]))
        _row(name, "engine", f"first half attached from another sequence, {setup.label()}", diff(ref, attached(ctx, t)))


def long_context(name: str, path: str) -> None:
    """The exact settings with long sequences, where llama.cpp's CPU flash attention changes path:
    a stream's ubatch of >= 64 query rows takes the tiled kernel (else one row at a time), and a
    single query row over >= 512 KV cells with >= 2 threads splits the cells among the threads
    (the split follows n_kv: the cache's used cells, with kv_unified off the ubatch's longest stream)."""
    exact = Setup(extra_bufts=False, flash=True, n_ubatch=32, n_ctx=8 * 1024)
    for setup, ctx, t in _contexts(path, [replace(exact, n_ubatch=512), exact, replace(exact, n_threads=2),
                                          replace(exact, unified=False, n_threads=2),
                                          replace(exact, n_threads_batch=2)]):  # the mode's threads
        t.prompt = t.prompts[SLOT] = (t.prompt + t.prompt[1:] * 60)[:600]
        t.prompts[0] = (t.others[0] + t.others[0][1:] * 150)[:900]
        ref = alone(ctx, t)
        _row(name, "long", f"600-token prompt whole vs 300+300, {setup.label()}", diff(ref, alone(ctx, t, (300,))))
        _row(name, "long", f"600-token prompt whole vs 590+10, {setup.label()}", diff(ref, alone(ctx, t, (590,))))
        _row(name, "long", f"decode beside a 900-token sequence (prefill apart), {setup.label()}",
             diff(ref, batched(ctx, t, prefill_apart=True)[0]))


def holes(name: str, path: str) -> None:
    """The recipe with freed cells (docs/performance.md, *Batch-invariant mode*, ``--part holes``):
    another sequence's cells removed (``llama_memory_seq_rm``) below or above the target's, then the
    target's decode tokens land in the hole below (out of position order) or after its cells.
    Single thread, so the two flash-attention paths are not mixed in."""
    recipe = Setup(extra_bufts=False, flash=True, n_ubatch=32)
    for setup, ctx, t in _contexts(path, [recipe]):
        ref = alone(ctx, t)
        for below in (True, False):
            llama_cpp.llama_memory_clear(ctx.mem, True)
            filler = _prompt(0, (t.others[0] * 64)[:16], out=False)
            if below:
                ctx.decode(filler)
            first = ctx.decode(_prompt(SLOT, t.prompt))
            if not below:
                ctx.decode(filler)
            llama_cpp.llama_memory_seq_rm(ctx.mem, 0, -1, -1)
            dec = [ctx.decode([(tok, len(t.prompt) + k, SLOT, True)])[0] for k, tok in enumerate(t.cont)]
            where = "below" if below else "above"
            _row(name, "holes", f"16 freed cells {where} the target's, {setup.label()}",
                 diff(ref, Rows(np.stack(first), np.stack(dec))))
