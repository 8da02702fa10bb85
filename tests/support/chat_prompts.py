"""A long system prompt and the prompt tokens llamactor builds for a chat, for the prefix-cache
tests (tests/tree/test_prefix_cache.py, test_cache_tiers.py, test_cache_restart.py,
test_data_at_rest.py). The default model attends over a 512-token window in most layers: the
persona is longer than that, so a cached prefix is only right if the window before its end is
still in KV."""

from __future__ import annotations

from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.native.engine import Engine
from llamactor.tree.prompt_tokens import PromptBuilder

PERSONA = " ".join(
    f"Fact {i}: Captain Ada Brightwater sailed the {colour} schooner '{ship}' from {port} in {1850 + i}, "
    f"carrying {cargo} and a crew of {10 + i} sailors who sang old songs every evening."
    for i, (colour, ship, port, cargo) in enumerate(zip(
        ["red", "blue", "green", "white", "black", "grey", "golden", "silver", "amber", "violet", "olive", "ivory",
         "coral", "teal", "crimson", "azure"],
        ["Petrel", "Albatross", "Gannet", "Tern", "Heron", "Osprey", "Plover", "Curlew", "Kestrel", "Merlin",
         "Swift", "Wren", "Lark", "Finch", "Robin", "Egret"],
        ["Lisbon", "Bristol", "Boston", "Hamburg", "Genoa", "Cadiz", "Bergen", "Dublin", "Antwerp", "Marseille",
         "Naples", "Oporto", "Riga", "Danzig", "Brest", "Malaga"],
        ["tea", "salt", "wool", "timber", "spices", "copper", "cotton", "coffee", "sugar", "tobacco", "wine", "iron",
         "silk", "rice", "cocoa", "amber"]))) + " You answer as Captain Ada, briefly."


def chat_tokens(engine: Engine, messages: list[dict[str, str]]) -> list[int]:
    """The prompt tokens llamactor builds for ``messages`` (no system prompt configured)."""
    msg = Generate(request_id="ref", params=SamplingParams(max_tokens=1), reply=ReplyChannel(), submitted_at=0.0,
                   messages=tuple(messages))
    return PromptBuilder(engine.tokenizer, engine.chat_template, None).prompt_tokens(msg)[0]
