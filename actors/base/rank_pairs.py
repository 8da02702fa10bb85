"""A (query, document) pair as a ranking-head model reads it: the tokens llama-server builds.

Pure but for the tokenizer it is handed (any thread: ``llamactor.native.tokenizer.Tokenizer`` is
read-only); the batcher builds a ``RankPairs`` request's inputs with it (``llamactor.handles.rank_pairs``
offers the same function to callers). llama-server's ``format_prompt_rerank`` is the reference,
with one difference:

- With the GGUF's ``tokenizer.chat_template.rerank`` template (``EngineInfo.rerank_template``):
  ``{query}`` and ``{document}`` replaced literally (not Jinja), no BOS added, the template's own
  text read with special tokens parsed. llama-server parses the whole string so, query and
  document included: a document that writes ``<|im_end|>`` would close the template's turn and
  forge an answer. Here the query and the document are tokenized as plain text, apart from the
  template's text; a space that ends the template's text before a slot goes with the slot's
  text (BPE and SentencePiece vocabularies attach a space to the word after it), so that a benign
  pair gets the tokens llama-server gives it.
- Without one: ``[BOS if add_bos] query [EOS if add_eos] [SEP if add_sep] document [EOS if
  add_eos]`` (EOS falls back to SEP), texts tokenized with no special tokens added or parsed --
  for a BERT vocabulary ``[CLS] q [SEP] d``.

``max_doc_tokens`` caps the document's tokens: a longer one keeps its head (``truncation``) or is
refused with ``InvalidRequestError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llamactor.base.errors import InvalidRequestError

QUERY, DOCUMENT = "{query}", "{document}"


class TextTokenizer(Protocol):
    """What a template's texts need of a vocabulary (``llamactor.native.tokenizer.Tokenizer`` has it)."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...


class PairTokenizer(TextTokenizer, Protocol):
    """What a pair needs of a vocabulary (``llamactor.native.tokenizer.Tokenizer`` has it)."""

    bos_id: int
    eos_id: int
    sep_id: int  # -1 (LLAMA_TOKEN_NULL): none
    adds_sep: bool

    @property
    def adds_bos(self) -> bool: ...

    @property
    def adds_eos(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RankPairs:
    """One query against ``documents``, each pair laid out by ``rank_pair_tokens`` where the
    model's vocabulary is (the batcher); ``template`` None: the GGUF's ``rerank`` template if it
    has one, else the plain pair."""

    query: str
    documents: tuple[str, ...]
    max_doc_tokens: int | None = None
    truncation: bool = True
    template: str | None = None

    def tokens(self, tokenizer: PairTokenizer, gguf_template: str | None) -> list[list[int]]:
        """Every document's pair (``InvalidRequestError`` for one over ``max_doc_tokens`` untruncated)."""
        template = self.template if self.template is not None else gguf_template
        return [rank_pair_tokens(tokenizer, template, self.query, d, self.max_doc_tokens, self.truncation, index=i)
                for i, d in enumerate(self.documents)]


@dataclass(frozen=True, slots=True)
class RankScores:
    """A ranking head's answer: one relevance in [0, 1] per input, in order, and the tokens scored."""

    request_id: str
    scores: tuple[float, ...]
    prompt_tokens: int


def rank_pair_tokens(tokenizer: PairTokenizer, template: str | None, query: str, document: str,
                     max_doc_tokens: int | None, truncation: bool, *, index: int = 0) -> list[int]:
    """The tokens of one (query, document) input, laid out as the module docstring says
    (``index``: the document's, named where it is refused)."""
    if template is not None:
        return _templated(tokenizer, template, query, document, max_doc_tokens, truncation, index)
    doc = capped_document(plain_text(tokenizer, document), index, max_doc_tokens, truncation)
    eos = tokenizer.eos_id if tokenizer.eos_id >= 0 else tokenizer.sep_id
    tokens = [tokenizer.bos_id] if tokenizer.adds_bos else []
    tokens += plain_text(tokenizer, query)
    tokens += [eos] if tokenizer.adds_eos else []
    tokens += [tokenizer.sep_id] if tokenizer.adds_sep else []
    tokens += doc
    tokens += [eos] if tokenizer.adds_eos else []
    return tokens


def _templated(tokenizer: PairTokenizer, template: str, query: str, document: str,
               max_doc_tokens: int | None, truncation: bool, index: int) -> list[int]:
    tokens: list[int] = []
    for piece, slot in _split(template):
        literal, carried = carry_space(piece) if slot is not None else (piece, "")
        tokens += template_text(tokenizer, literal)
        if slot == QUERY:
            tokens += plain_text(tokenizer, carried + query)
        elif slot == DOCUMENT:
            tokens += capped_document(plain_text(tokenizer, carried + document), index, max_doc_tokens, truncation)
    return tokens


def carry_space(piece: str) -> tuple[str, str]:
    """A template's text before a slot, and the space that ends it, which goes with the slot's
    text (BPE and SentencePiece vocabularies attach a space to the word after it)."""
    return (piece[:-1], " ") if piece.endswith(" ") else (piece, "")


def template_text(tokenizer: TextTokenizer, text: str) -> list[int]:
    """A template's own text: special-token text read as those tokens, nothing added."""
    return tokenizer.tokenize(text, add_special=False, parse_special=True) if text else []


def plain_text(tokenizer: TextTokenizer, text: str) -> list[int]:
    """A caller's text: no special token added, none read from its text."""
    return tokenizer.tokenize(text, add_special=False, parse_special=False) if text else []


def _split(template: str) -> list[tuple[str, str | None]]:
    """The template as (text, the slot after it) pieces, in order; the last piece's slot is None."""
    pieces: list[tuple[str, str | None]] = []
    rest = template
    while True:
        found = [(rest.find(s), s) for s in (QUERY, DOCUMENT) if s in rest]
        if not found:
            pieces.append((rest, None))
            return pieces
        at, slot = min(found)
        pieces.append((rest[:at], slot))
        rest = rest[at + len(slot):]


def capped_document(tokens: Sequence[int], index: int, cap: int | None, truncation: bool,
                    limits: str = "max_tokens_per_doc") -> list[int]:
    """``documents[index]``'s tokens within ``cap`` (None: no cap): its head when ``truncation``,
    else ``InvalidRequestError`` naming it and what set the cap (``limits``). A ranking head's
    pairs and a judging prompt's documents (``llamactor.handles.rerank_prompt``) are capped so."""
    if cap is None or len(tokens) <= cap:
        return list(tokens)
    if not truncation:
        raise InvalidRequestError(f"documents[{index}] has {len(tokens)} tokens, more than the {cap} a document may "
                                  f"have here ({limits}); truncation is off", param=f"documents[{index}]")
    return list(tokens[:cap])
