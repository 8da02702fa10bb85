"""Reasoning ("thinking") in an answer: the ``<think>…</think>`` block that DeepSeek-R1- and
Qwen3-style chat templates make the model write before its answer (pure; any thread).

``ReasoningSplitter`` separates it piece by piece, holding back text that may be the start of a
tag; ``split_reasoning`` is the same splitter fed a finished answer at once, its ends stripped.
An answer that does not open with ``<think>`` is all content (a template that opens the block in
the prompt itself, as some DeepSeek-R1 builds do, is not split: its answers carry only the
closing tag).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a whole answer; reasoning is None when there is none."""
    splitter = ReasoningSplitter()
    reasoning, content = splitter.feed(text)
    rest_reasoning, rest_content = splitter.finish()
    reasoning, content = reasoning + rest_reasoning, content + rest_content
    return (reasoning.strip(), content.lstrip()) if splitter.opened else (None, content)


class ReasoningSplitter:
    """Feeds stream pieces; each ``feed`` returns ``(reasoning_delta, content_delta)``."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "start"  # start -> reasoning -> content, or start -> content
        self._opened = False

    def feed(self, piece: str) -> tuple[str, str]:
        self._buffer += piece
        if self._state == "start":
            head = self._buffer.lstrip()
            if head.startswith(OPEN):
                self._state, self._buffer = "reasoning", head[len(OPEN):].lstrip("\n")
                self._opened = True
            elif head and not OPEN.startswith(head):
                self._state = "content"
            else:
                return "", ""  # still may be "<think>"
        if self._state == "reasoning":
            before, closed, after = self._buffer.partition(CLOSE)
            if closed:
                self._state, self._buffer = "content", ""
                return before.rstrip("\n"), after.lstrip("\n")
            keep = _partial_suffix(self._buffer, CLOSE)
            out, self._buffer = self._buffer[:len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
            return out, ""
        out, self._buffer = self._buffer, ""
        return "", out

    @property
    def opened(self) -> bool:
        """Whether the answer opened with a ``<think>`` block (then its reasoning is not None)."""
        return self._opened

    def finish(self) -> tuple[str, str]:
        """What is still held back when the stream ends."""
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self._state == "reasoning" else ("", rest)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
