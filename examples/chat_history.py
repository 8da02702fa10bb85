"""A conversation that re-sends its whole history every turn: the prefix cache serves the old turns.

Each turn's `usage.cached_tokens` grows with the history while the tokens actually computed stay
about the size of the new message.
"""

import llamactor

PERSONA = ("You are the harbour master of a small fishing town. You know every boat, its skipper and its catch, "
           "and you answer in one or two friendly sentences.")
QUESTIONS = ["Which boat came in first today?", "What did it catch?", "Who is its skipper?", "Will it sail tomorrow?"]

with llamactor.start(n_parallel=4) as llm:
    messages = [{"role": "system", "content": PERSONA}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        c = llm.chat(messages, max_tokens=40, temperature=0)
        messages.append({"role": "assistant", "content": c.text})
        computed = c.usage.prompt_tokens - c.usage.cached_tokens
        print(f"[prompt {c.usage.prompt_tokens:4d} tokens: {c.usage.cached_tokens:4d} cached, {computed:3d} computed, "
              f"ttft {c.timings.ttft_ms:6.1f} ms] {c.text.strip()[:60]}")
    print(llm.stats()["prefix_cache"])
