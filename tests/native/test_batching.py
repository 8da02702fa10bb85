"""Requests from many callers share decode steps, flush by size or window, and wait for seq_ids."""

from __future__ import annotations

import concurrent.futures
import llamactor
from llamactor.native.engine import Engine

from tests.conftest import assert_equal_up_to_near_tie

PROMPTS = [f"Story {i}: once upon a time, a {animal}" for i, animal in
           enumerate(["fox", "cat", "dog", "owl", "bee", "elk", "ant", "yak"] * 2)]


def test_sixteen_threads_all_get_complete_results_from_shared_decode_steps(start_llm) -> None:
    llm = start_llm(n_parallel=16)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda p: llm.ask(p, max_tokens=24, temperature=0, ignore_eos=True), PROMPTS))
    assert all(r.usage.completion_tokens == 24 and len(r.token_ids) == 24 and r.finish_reason == "length"
               for r in results)
    assert len({r.request_id for r in results}) == 16
    stats = llm.stats()
    assert stats["tokens_generated"] == 16 * 24
    assert stats["steps"] < 16 * 24 / 4  # decode calls were shared: far fewer steps than tokens
    assert stats["free_seq_ids"] == 16 and stats["running"] == 0


def test_a_lone_request_waits_out_the_window_then_runs_alone(start_llm) -> None:
    llm = start_llm(n_parallel=4, batch_timeout_ms=300)
    c = llm.ask("Hello", max_tokens=4, temperature=0)
    assert c.timings.queue_ms >= 300  # the timer cannot fire before the window ends
    assert c.usage.completion_tokens == 4


def test_a_burst_of_batch_size_starts_together_without_waiting_for_the_window(start_llm) -> None:
    llm = start_llm(n_parallel=4, batch_size=4, batch_timeout_ms=60_000)
    futures = [llm.submit(p, max_tokens=8, temperature=0, ignore_eos=True) for p in PROMPTS[:4]]
    results = [f.result(timeout=30) for f in futures]  # well before the 60 s window could end
    assert max(r.timings.queue_ms for r in results) < 5_000  # admitted on the 4th arrival, not by the timer
    # Admitted in one step: one prefill step yields every first token, then 7 shared decode steps.
    assert llm.stats()["steps"] == 8


def test_requests_beyond_n_parallel_wait_for_a_free_seq_id_and_then_finish(start_llm) -> None:
    llm = start_llm(n_parallel=2, batch_timeout_ms=5)
    futures = [llm.submit(p, max_tokens=6, temperature=0, ignore_eos=True) for p in PROMPTS[:6]]
    results = [f.result(timeout=60) for f in futures]
    assert [r.usage.completion_tokens for r in results] == [6] * 6
    assert max(r.timings.queue_ms for r in results) > min(r.timings.queue_ms for r in results)
    assert llm.stats()["free_seq_ids"] == 2


def test_batched_greedy_output_equals_the_request_decoded_alone_except_after_a_near_tie(
        start_llm, reference_engine: Engine) -> None:
    llm = start_llm(n_parallel=8)
    alone = [llm.ask(p, max_tokens=24, temperature=0, ignore_eos=True) for p in PROMPTS[:4]]
    batched = [f.result() for f in [llm.submit(p, max_tokens=24, temperature=0, ignore_eos=True) for p in PROMPTS[:8]]]
    for prompt, a, b in zip(PROMPTS, alone, batched):
        assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(prompt), a, b)


def test_the_async_api_serves_many_tasks_on_one_event_loop(llm: llamactor.LLM) -> None:
    import asyncio

    async def main() -> list[llamactor.Completion]:
        return await asyncio.gather(*(llm.ask_async(p, max_tokens=5, temperature=0) for p in PROMPTS[:6]))

    results = asyncio.run(main())
    assert [r.usage.completion_tokens for r in results] == [5] * 6

    async def collect() -> tuple[list[str], llamactor.Completion]:
        stream = llm.stream_async("Count: one, two,", max_tokens=6, temperature=0)
        return [p async for p in stream], stream.completion

    pieces, completion = asyncio.run(collect())
    assert "".join(pieces) == completion.text and completion.usage.completion_tokens <= 6


def test_several_event_loops_in_several_threads_share_one_tree(llm: llamactor.LLM) -> None:
    import asyncio

    async def one_loop(tag: int) -> list[str]:
        async def streamed(i: int) -> str:
            return "".join([p async for p in llm.stream_async(f"Loop {tag} item {i}:", max_tokens=4, ignore_eos=True)])
        plain = await llm.ask_async(f"Loop {tag}:", max_tokens=4, ignore_eos=True)
        return [plain.text, *await asyncio.gather(*(streamed(i) for i in range(3)))]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda tag: asyncio.run(one_loop(tag)), range(3)))
    assert len(results) == 3 and all(len(texts) == 4 and all(texts) for texts in results)
