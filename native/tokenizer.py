"""Tokenize and detokenize with the model's own vocabulary, and stream text without broken UTF-8."""

from __future__ import annotations

import codecs
import ctypes

import time
import warnings
from typing import Any

import llama_cpp

from llamactor.base.logging import get_logger

log = get_logger("llamactor.native")


class Tokenizer:
    """The vocabulary of one loaded model. Thread-safe: llama.cpp's vocab is read-only."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p) -> None:
        self._vocab = vocab
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.bos_id = llama_cpp.llama_vocab_bos(vocab)
        self.eos_id = llama_cpp.llama_vocab_eos(vocab)
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}
        self.bos_text = self.special_text(self.bos_id)
        self.eos_text = self.special_text(self.eos_id)
        self._grammar_vocab: Any = None

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
        data = text.encode("utf-8")
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
