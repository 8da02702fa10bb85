"""Turning one sequence's sampled tokens into the text its caller sees.

``TextAssembler`` decodes token bytes incrementally (never splitting a UTF-8 character) and
holds back any tail that could still grow into a stop string, so a streaming caller never sees
part of a stop string. Pure logic: the batcher feeds it bytes from the tokenizer.
"""

from __future__ import annotations

from llamactor.native.tokenizer import IncrementalDetokenizer


class TextAssembler:
    """Text of one request. Used by the batcher thread only."""

    __slots__ = ("_detok", "_stop", "text", "_n_emitted", "stopped", "stop_sequence")

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._detok = IncrementalDetokenizer()
        self._stop = stop
        self.text = ""
        self._n_emitted = 0
        self.stopped = False  # a stop string matched; ``text`` ends just before it
        self.stop_sequence: str | None = None  # which one: the earliest in the text (first listed on a tie)

    def push(self, data: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to show."""
        self.text += self._detok.push(data)
        if not self._stop:
            return self._emit(len(self.text))
        longest = max(len(s) for s in self._stop)
        search_from = max(0, self._n_emitted - longest + 1)
        hits = [(i, k) for k, i in enumerate(self.text.find(s, search_from) for s in self._stop) if i >= 0]
        if hits:
            at, k = min(hits)
            self.text = self.text[:at]
            self.stopped, self.stop_sequence = True, self._stop[k]
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._held_back())

    def finish(self) -> str:
        """The sequence ended: release whatever was held back (it did not become a stop string)."""
        if not self.stopped:
            self.text += self._detok.flush()
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _emit(self, upto: int) -> str:
        upto = max(upto, self._n_emitted)
        piece = self.text[self._n_emitted:upto]
        self._n_emitted = upto
        return piece
