"""Reasoning ("thinking") in an answer: the ``<think>…</think>`` block that DeepSeek-R1- and
Qwen3-style chat templates make the model write before its answer (pure; any thread).

``split_reasoning`` separates a finished answer; ``ReasoningSplitter`` does it piece by piece for
streams, holding back text that may be the start of a tag; both agree on every answer. An answer
that does not open with ``<think>`` is all content (a template that opens the block in the prompt
itself, as some DeepSeek-R1 builds do, is not split: its answers carry only the closing tag).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a whole answer; reasoning is None when there is none."""
    stripped = text.lstrip()
    if stripped.startswith(OPEN):
        body = stripped[len(OPEN):]
        reasoning, closed, content = body.partition(CLOSE)
        return reasoning.strip(), content.lstrip() if closed else ""
    return None, text


class ReasoningSplitter:
    """Feeds stream pieces; each ``feed`` returns ``(reasoning_delta, content_delta)``."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "start"  # start -> reasoning -> content, or start -> content

    def feed(self, piece: str) -> tuple[str, str]:
        self._buffer += piece
        if self._state == "start":
            head = self._buffer.lstrip()
            if head.startswith(OPEN):
                self._state, self._buffer = "reasoning", head[len(OPEN):].lstrip("\n")
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
