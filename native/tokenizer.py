"""Tokenize and detokenize with the model's own vocabulary, and stream text without broken UTF-8.

Long texts are tokenized in pieces (``SpecialSplitter``): llama.cpp first cuts a text at every
occurrence of a special token (``tokenizer_st_partition``), keeping the fragments in a
``std::forward_list`` and finding each match's place in it with ``std::distance`` from the list's
head, so a text with k matches costs O(k^2): Gemma's user-defined tokens include ``"\\n"``, and
``'hi\\n' * 40_000`` took 39 s in one call. Pieces cut where llama.cpp's own partition has a
boundary are tokenized to the very tokens of the whole (each fragment is tokenized on its own).
"""

from __future__ import annotations

import codecs
import ctypes
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any

import llama_cpp

from llamactor.base.errors import InvalidRequestError
from llamactor.base.logging import get_logger
from llamactor.base.text_finder import TextFinder

log = get_logger("llamactor.native")


CHUNK_BYTES = 1024  # a long text's pieces: about this long (at the first cut llama.cpp allows after it)
_SPECIAL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
_PARSED_ONLY = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN  # matched with parse_special only
_STRIPS = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP


class SpecialSplitter:
    """Where a text may be cut so that llama.cpp tokenizes the pieces into the tokens of the whole.

    llama.cpp cuts a text at the occurrences of the special tokens it matches (longest token
    first, leftmost first within each fragment), then tokenizes each text fragment on its own. A
    cut at ``c`` leaves that partition as it is when no occurrence of a matched token straddles
    ``c``; and ``c`` is a boundary of it when an occurrence ``[c, c + n)`` starts there whose end
    straddles nothing either: no token overlapping it can be matched before it, so it is matched.
    "Straddles nothing" is checked conservatively, in O(1): the two bytes around the point are no
    adjacent pair inside any matched token. Pure (bytes in, offsets out): tested without a model.
    Only for token attributes without lstrip/rstrip (those move whitespace across fragments).

    ``parse_only``: those of ``specials`` that only ``parse_special`` matches (control tokens). A
    piece holding none of them is tokenized alike without ``parse_special``, where llama.cpp skips
    them at once instead of searching every fragment for each of them (Gemma has 6,250).
    """

    def __init__(self, specials: Iterable[bytes], parse_only: Iterable[bytes] = ()) -> None:
        self._tokens = TextFinder(specials)
        self._parse_only = TextFinder(parse_only)
        inner = bytearray(65536)
        for token in self._tokens.texts:
            for a, b in zip(token, token[1:]):
                inner[a << 8 | b] = 1
        self._inner = bytes(inner)

    def needs_parse(self, data: bytes, start: int, end: int) -> bool:
        """Whether ``data[start:end]`` holds a token that only ``parse_special`` matches."""
        return self._parse_only.found_in(data, start, end)

    def cuts(self, data: bytes, chunk: int) -> list[int]:
        """Offsets from 0 to ``len(data)`` that cut ``data`` into pieces of ``chunk`` bytes or more
        (the last may be shorter); each byte is looked at a bounded number of times (the longest
        token's length at most), so this is linear."""
        cuts, pos = [0], chunk
        while pos < len(data):
            cut = self._cut_from(data, pos)
            if cut is None:
                break
            cuts.append(cut)
            pos = cut + chunk
        cuts.append(len(data))
        return cuts

    def _cut_from(self, data: bytes, pos: int) -> int | None:
        """The first offset at or after ``pos`` where a matched token starts at a safe cut and
        ends at one."""
        return next((x for x, n in self._tokens.occurrences(data, pos)
                     if self._free(data, x) and self._free(data, x + n)), None)

    def _free(self, data: bytes, x: int) -> bool:
        """No matched token can straddle offset ``x`` (its two neighbours are no inner pair)."""
        return x <= 0 or x >= len(data) or not self._inner[data[x - 1] << 8 | data[x]]


class VocabFacts:
    """What tokenizing in pieces and the byte cap need to know of a vocabulary, read once (about
    0.2 s for Gemma's 262k tokens): the splitters without and with ``parse_special`` (None where
    pieces are not known to be exact: not SPM or BPE, or a token that strips whitespace), and the
    longest token text in bytes (None where a token may stand for more bytes than its text)."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p) -> None:
        start = time.perf_counter()
        kind = llama_cpp.llama_vocab_type(vocab)
        longest, strips, specials = 1, False, dict[bytes, int]()
        for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            text = llama_cpp.llama_vocab_get_text(vocab, token) or b""
            longest = max(longest, len(text))
            attr = llama_cpp.llama_vocab_get_attr(vocab, token)
            strips = strips or bool(attr & _STRIPS)
            if attr & _SPECIAL:
                specials[text] = attr
        exact = kind in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE) and not strips
        self.splitters = (SpecialSplitter(t for t, a in specials.items() if not a & _PARSED_ONLY),
                          SpecialSplitter(specials, (t for t, a in specials.items() if a & _PARSED_ONLY))
                          ) if exact else (None, None)
        self.max_token_bytes = longest if exact else None
        # what only parse_special matches: a chat's message content must not hold these as tokens
        self.control_texts = frozenset(t.decode("utf-8", errors="replace") for t, a in specials.items()
                                       if a & _PARSED_ONLY and t)
        log.info("vocab_facts_read", n_special=len(specials), max_token_bytes=longest, split=exact,
                 ms=round((time.perf_counter() - start) * 1000, 1))


class Tokenizer:
    """The vocabulary of one loaded model. Thread-safe: llama.cpp's vocab is read-only."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p) -> None:
        self._vocab = vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.bos_id = llama_cpp.llama_vocab_bos(vocab)
        self.eos_id = llama_cpp.llama_vocab_eos(vocab)
        self.sep_id = llama_cpp.llama_vocab_sep(vocab)  # BERT's [SEP] between a pair's texts; -1: none
        self.adds_sep = bool(llama_cpp.llama_vocab_get_add_sep(vocab))  # a pair gets SEP between its texts
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}
        self.bos_text = self.special_text(self.bos_id)
        self.eos_text = self.special_text(self.eos_id)
        self._grammar_vocab: Any = None
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self._add_eos = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
        self._facts: VocabFacts | None = None
        self._facts_lock = threading.Lock()

    def facts(self) -> VocabFacts:
        """The vocabulary's ``VocabFacts``, read on first use (by whichever thread asks first)."""
        with self._facts_lock:
            if self._facts is None:
                self._facts = VocabFacts(self._vocab)
            return self._facts

    @property
    def adds_bos(self) -> bool:
        """Whether ``tokenize(..., add_special=True)`` puts BOS first (the GGUF's ``add_bos_token``)."""
        return self._add_bos

    @property
    def adds_eos(self) -> bool:
        """Whether ``tokenize(..., add_special=True)`` puts EOS last (the GGUF's ``add_eos_token``)."""
        return self._add_eos

    def min_tokens(self, n_bytes: int) -> int:
        """A lower bound on the tokens of any text of ``n_bytes`` UTF-8 bytes (0 if unknown): no
        token stands for more bytes than the longest token text."""
        longest = self.facts().max_token_bytes
        return -(-n_bytes // longest) if longest else 0

    def grammar_vocab(self) -> Any:
        """This vocabulary as llguidance reads it (an ``LLTokenizer``), built on first use: it reads
        every token's bytes, about 2 s for Gemma's 262k tokens, so models never constrained skip it."""
        if self._grammar_vocab is None:
            import llguidance.llamacpp  # imports llama_cpp, hence here in native/

            start = time.perf_counter()
            end_tokens = [t for t in (self.eos_id, llama_cpp.llama_vocab_eot(self._vocab)) if t >= 0]
            with warnings.catch_warnings():  # it calls a deprecated llama_cpp alias once per token
                warnings.simplefilter("ignore", DeprecationWarning)
                self._grammar_vocab = llguidance.llamacpp.lltokenizer_from_vocab(self._vocab, eos_token=end_tokens)
            log.info("grammar_vocab_built", n_vocab=self.n_vocab, ms=round((time.perf_counter() - start) * 1000, 1))
        return self._grammar_vocab

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """``text``'s tokens; any thread. A long text is tokenized in pieces cut where llama.cpp's
        own partition has a boundary (``SpecialSplitter``), which gives the very same tokens in
        linear time (see the module's docstring)."""
        data = text.encode("utf-8")
        splitter = self.facts().splitters[parse_special] if len(data) > 2 * CHUNK_BYTES else None
        if splitter is None:
            return self._tokenize(data, add_special, parse_special)
        cuts = splitter.cuts(data, CHUNK_BYTES)
        if len(cuts) <= 2:
            return self._tokenize(data, add_special, parse_special and splitter.needs_parse(data, 0, len(data)))
        # BOS and EOS as llama.cpp adds them (SPM and BPE alike), around the pieces
        tokens = [self.bos_id] if add_special and self._add_bos else []
        for start, end in zip(cuts, cuts[1:]):
            tokens += self._tokenize(data[start:end], False, splitter.needs_parse(data, start, end))
        if add_special and self._add_eos:
            tokens.append(self.eos_id)
        return tokens

    def _tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # the buffer was too small; -n is the size needed
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a generated token adds to the text (control tokens add none)."""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, special=False)
        return piece

    def token_text(self, token: int) -> str:
        """One token's text on its own (a partial UTF-8 character shows as U+FFFD)."""
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def special_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def detokenize(self, tokens: list[int] | tuple[int, ...]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def has_id(self, token: int) -> bool:
        """Whether ``token`` is one of the vocabulary's ids."""
        return 0 <= token < self.n_vocab

    def check_ids(self, ids: Iterable[int], what: str = "token ids") -> None:
        """``InvalidRequestError`` naming ``what`` (a prompt's token ids, a logit bias's) unless
        every id is the vocabulary's: what only the model can check of a request (any thread)."""
        if not all(self.has_id(t) for t in ids):
            raise InvalidRequestError(f"{what} must be in [0, {self.n_vocab})")

    def is_eog(self, token: int) -> bool:
        # Asked once per generated token: a ctypes call costs ~10 us, a dict lookup ~50 ns.
        eog = self._eog_cache.get(token)
        if eog is None:
            eog = self._eog_cache[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog


class IncrementalDetokenizer:
    """Turns a stream of token bytes into text pieces that never split a UTF-8 character."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
