"""The judging prompt a causal LM reranks with, and the tokens of its answers "yes" and "no".

The score of a document is P(yes) / (P(yes) + P(no)) at the end of a prompt that asks whether
the document answers the query (how Qwen3-Reranker is used, and SGLang's and vLLM's decoder
rerankers). The prompt is a ``JudgeTemplate``: template text around three slots, the
instruction, the query and the document, the document last. Everything before the document is
the context every document of a request shares (computed once); each document's own tokens and
the template text after it (the end of the turn, the answer's header) are its continuation.

Where the template comes from, first found: ``Config.rerank_template`` (also per model in the
TOML model specs), else the GGUF's ``tokenizer.chat_template.rerank`` -- both with llama.cpp's
literal ``{query}`` and ``{document}`` placeholders (and ``{instruction}`` here) --, else the
built-in judging chat (``judge_messages``) rendered by the model's own chat format (a
``User:``/``Assistant:`` transcript for a base model without one).

The template's text is tokenized with special tokens read (``<|im_start|>``); the instruction,
the query and the documents as plain text, so a document that writes ``<|im_end|>`` cannot close
its turn and answer for the model. A space that ends the template's text before a slot goes with
the slot's text (BPE and SentencePiece vocabularies attach a space to the word after it), as
llama-server's pair would tokenize. No BOS is added: a template writes the BOS text where its
model wants one (the chat formats do, as llama-server's rerank template must).

Pure but for the tokenizer it is handed (``TextTokenizer``): the caller's side answers it from
the batcher's tokenizer (``llamactor.handles.rerank``), tests from a model's own.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.rank_pairs import TextTokenizer, carry_space, plain_text, template_text

INSTRUCTION, QUERY, DOCUMENT = "instruction", "query", "document"
SLOTS = (INSTRUCTION, QUERY, DOCUMENT)
GGUF_RERANK_TEMPLATE = "tokenizer.chat_template.rerank"  # llama.cpp's key (llama_model_chat_template(m, "rerank"))

# The built-in judging chat, chosen by top-1 accuracy on llamactor.bench.rerank_set with both
# bundled models (docs/performance.md, *Rerank quality*).
JUDGE_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
                'Note that the answer can only be "yes" or "no".')
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
JUDGE_USER = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
# Two worked examples before the query (shared by every rerank, so computed once and cached):
# tiny models judge far better after them, a base model's transcript hardly at all without them.
JUDGE_EXAMPLES = (("What color is the sky on a clear day?", "The sky is blue on a clear day.", "yes"),
                  ("What do cows eat?", "Cows are large farm animals.", "no"))

# Where each slot sits in the rendered chat while the template renders: private-use characters,
# which no template changes and no vocabulary merges with the text around them.
_MARKS = {slot: f"\U000f8100{slot}\U000f8101" for slot in SLOTS}
_MARK = re.compile("\U000f8100(" + "|".join(SLOTS) + ")\U000f8101")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(SLOTS) + r")\}")


def judge_messages() -> tuple[dict[str, Any], ...]:
    """The built-in judging chat with its slots marked, for the model's chat format to render."""
    examples = []
    for query, document, answer in JUDGE_EXAMPLES:
        examples += [{"role": "user", "content": JUDGE_USER.format(instruction=DEFAULT_INSTRUCTION, query=query,
                                                                   document=document)},
                     {"role": "assistant", "content": answer}]
    user = JUDGE_USER.format(**{slot: _MARKS[slot] for slot in SLOTS})
    return ({"role": "system", "content": JUDGE_SYSTEM}, *examples, {"role": "user", "content": user})


@dataclass(frozen=True, slots=True)
class JudgeTemplate:
    """Template text around slots: ``pieces[i]`` comes before ``slots[i]``, ``pieces[-1]`` after
    the last slot (the document); ``source`` says where it came from."""

    pieces: tuple[str, ...]
    slots: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if self.slots.count(QUERY) != 1 or self.slots.count(DOCUMENT) != 1 or self.slots.count(INSTRUCTION) > 1:
            raise InvalidRequestError(f"the rerank template ({self.source}) must hold {{query}} and {{document}} "
                                      "once each (and {instruction} at most once)", param="rerank_template")
        if self.slots[-1] != DOCUMENT:
            raise InvalidRequestError(f"the rerank template ({self.source}) must put {{document}} after "
                                      "{query} and {instruction}: what precedes it is shared by every document",
                                      param="rerank_template")

    @classmethod
    def from_placeholders(cls, template: str, source: str) -> JudgeTemplate:
        """A template with literal ``{query}``, ``{document}`` and ``{instruction}`` (llama.cpp's
        ``rerank`` template; not Jinja: nothing else in it is read)."""
        return cls._split(template, _PLACEHOLDER, source)

    @classmethod
    def from_rendered(cls, rendered: str, source: str) -> JudgeTemplate:
        """The judging chat (``judge_messages``) as the chat format rendered it."""
        return cls._split(rendered, _MARK, source)

    @classmethod
    def _split(cls, text: str, slot: re.Pattern[str], source: str) -> JudgeTemplate:
        parts = slot.split(text)  # piece, slot name, piece, ...
        return cls(tuple(parts[0::2]), tuple(parts[1::2]), source)

    def context(self, tokenizer: TextTokenizer, query: str, instruction: str) -> list[int]:
        """The tokens every document shares: the template's text up to the document, the query
        and the instruction in their slots."""
        texts = {QUERY: query, INSTRUCTION: instruction}
        tokens: list[int] = []
        for piece, slot in zip(self.pieces, self.slots):
            literal, carried = carry_space(piece)
            tokens += template_text(tokenizer, literal)
            if slot != DOCUMENT:
                tokens += plain_text(tokenizer, carried + texts[slot])
        return tokens

    def document(self, tokenizer: TextTokenizer, document: str) -> list[int]:
        """A document's own tokens, as its slot reads it (with the space the template carries)."""
        return plain_text(tokenizer, carry_space(self.pieces[-2])[1] + document)

    def suffix(self, tokenizer: TextTokenizer) -> list[int]:
        """The template's text after the document: the end of the turn and the answer's header."""
        return template_text(tokenizer, self.pieces[-1])

    @property
    def takes_instruction(self) -> bool:
        return INSTRUCTION in self.slots


def placeholder_template(config_template: str | None, gguf_template: str | None) -> JudgeTemplate | None:
    """The template given with placeholders: the ``rerank_template`` option, else the GGUF's; None
    when neither is set (the built-in judging chat is then rendered by the chat format)."""
    if config_template:
        return JudgeTemplate.from_placeholders(config_template, "the rerank_template option")
    if gguf_template:
        return JudgeTemplate.from_placeholders(gguf_template, f"the GGUF's {GGUF_RERANK_TEMPLATE}")
    return None


# -- the answers ------------------------------------------------------------------------------

ANSWER_WORDS = ("yes", "no")


def answer_spellings(word: str) -> list[str]:
    """Every casing of ``word``, bare and after a space ("yes", " Yes", " YES" ...)."""
    casings = {"".join(c) for c in itertools.product(*((ch.lower(), ch.upper()) for ch in word))}
    return [prefix + c for c in sorted(casings) for prefix in ("", " ")]


def answer_ids(tokenizer: TextTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The single tokens that spell "yes" and "no" (any casing, a leading space or not);
    ``InvalidRequestError`` if the vocabulary has none for one of them (no such model can judge)."""
    groups = [tuple(sorted({t[0] for s in answer_spellings(word) if len(t := plain_text(tokenizer, s)) == 1}))
              for word in ANSWER_WORDS]  # every spelling asked before any refusal (``tokenized``'s two passes)
    for word, ids in zip(ANSWER_WORDS, groups, strict=True):
        if not ids:
            raise InvalidRequestError(f"this model's vocabulary has no single token for {word!r}: it cannot rerank "
                                      "with a judging prompt (a ranking-head GGUF reranks without one)")
    return groups[0], groups[1]
