"""The words and prompts the benchmark's workloads are built from.

Deterministic, so every run (and every leg of a run) sees the same inputs; ``uniform_prompts``
differ from their first word, so no leg gets a prompt-prefix cache hit by accident.
"""

from __future__ import annotations

ANIMALS = ["fox", "cat", "dog", "owl", "bee", "elk", "ant", "yak", "cow", "hen", "eel", "bat", "ram", "emu", "gnu", "pig"]
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing near an old stone bridge "
         "under the warm light of a quiet summer evening").split()
TRADES = ["baker", "smith", "weaver", "potter", "miller", "tanner", "cooper", "mason", "carver", "glazier", "joiner",
          "brewer", "dyer", "fletcher", "chandler", "roper"]
TOWNS = ["Arden", "Brill", "Colby", "Dunmore", "Elkin", "Farrow", "Galt", "Hollin", "Ivel", "Jarrow", "Kells",
         "Lusk", "Marlow", "Nairn", "Orme", "Pell"]


def uniform_prompts(n: int) -> list[str]:
    # Distinct from the first word, so no baseline gets a prompt-prefix cache hit.
    return [f"{ANIMALS[i % len(ANIMALS)].title()} story {i}: once upon a time, a {ANIMALS[i % len(ANIMALS)]} "
            f"named {chr(65 + i % 26)}" for i in range(n)]
