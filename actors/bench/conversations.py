"""Multi-turn chat conversations for the benchmark's prefix-cache legs (``prefix``, ``replicas``, ``peer``).

Each user has its own ~300-token ``persona`` (different from the first word on) and asks
``QUESTIONS`` in turn; ``conversation`` holds one user's chat through ``chat()``, re-sending the
whole history every turn, and records each turn's TTFT and token counts as a ``Turn``.
"""

from __future__ import annotations

from dataclasses import dataclass

import llamactor
from llamactor.bench.prompts import TOWNS, TRADES

QUESTIONS = ["What do you make?", "Who taught you your trade?", "What is the hardest part of your work?",
             "What did you do yesterday?", "What will you do tomorrow?", "What is your favourite tool?"]


def persona(i: int) -> str:
    """About 300 tokens about user ``i``'s character, different from the first word on."""
    trade, town = TRADES[i % len(TRADES)], TOWNS[(i * 7) % len(TOWNS)]
    facts = " ".join(f"Fact {k} about {trade} number {i}: in the year {1700 + 13 * i + k} the {trade} of {town} "
                     f"sold {k + 3} fine pieces at the {['spring', 'summer', 'autumn', 'winter'][k % 4]} fair."
                     for k in range(10))
    return f"Character {i}: you are the {trade} of {town}, a proud craftsman. {facts} Stay in character and answer briefly."


@dataclass(slots=True)
class Turn:
    user: int
    turn: int
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    history_tokens: int  # tokens the previous turn left: its prompt and its answer (0 on turn 1)


def conversation(llm: llamactor.Client, user: int, n_turns: int, max_tokens: int) -> list[Turn]:
    """User ``user``'s ``n_turns``-turn chat with ``llm`` (greedy), the history re-sent every turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": persona(user)}]
    turns, history = [], 0
    for t in range(n_turns):
        messages.append({"role": "user", "content": QUESTIONS[(user + t) % len(QUESTIONS)]})
        c = llm.chat(messages, max_tokens=max_tokens, temperature=0)
        messages.append({"role": "assistant", "content": c.text})
        turns.append(Turn(user, t, c.timings.ttft_ms, c.usage.prompt_tokens, c.usage.cached_tokens, history))
        history = c.usage.prompt_tokens + c.usage.completion_tokens
    return turns
