"""Turning one sequence's sampled tokens into the text its caller sees.

``TextAssembler`` decodes token bytes incrementally (never splitting a UTF-8 character) and
holds back any tail that could still grow into a stop string, so a streaming caller never sees
part of a stop string. Pure logic: the batcher feeds it bytes from the tokenizer.

Stop strings are matched by ``llamactor.base.stop_scanner``, in time linear per token.
"""

from __future__ import annotations

from llamactor.base.stop_scanner import StopScanner
from llamactor.native.tokenizer import IncrementalDetokenizer


class TextAssembler:
    """Text of one request. Used by the batcher thread only."""

    __slots__ = ("_detok", "_stop", "_scanner", "text", "_n_emitted", "stopped", "stop_sequence")

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._detok = IncrementalDetokenizer()
        self._stop = stop
        self._scanner = StopScanner(stop) if stop else None
        self.text = ""
        self._n_emitted = 0
        self.stopped = False  # a stop string matched; ``text`` ends just before it
        self.stop_sequence: str | None = None  # which one: the earliest in the text (first listed on a tie)

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to show."""
        piece = self._detok.push(data)
        self.text += piece
        if self._scanner is None:
            return self._emit(len(self.text))
        hit = self._scanner.feed(piece)
        if hit is not None:
            at, k = hit
            self.text = self.text[:at]
            self.stopped, self.stop_sequence = True, self._stop[k]
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._scanner.held_back)

    def finish(self) -> str:
        """The sequence ended: release whatever was held back (it did not become a stop string)."""
        if not self.stopped:
            self.text += self._detok.flush()
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        upto = max(upto, self._n_emitted)
        piece = self.text[self._n_emitted:upto]
        self._n_emitted = upto
        return piece
