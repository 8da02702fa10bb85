"""The one answer splitter: an answer as its reasoning (a ``<think>`` block), its content, and its
tool calls, piece by piece as it is written (pure; runs on the batcher thread, one per choice).

The batcher feeds each choice's splitter exactly the text it streams, so a streamed answer's parts
(``Piece.parts``) and the whole answer (``Completion.answer``, ``.tool_calls``, ``.text``) come
from one split and cannot disagree. Reasoning is split first (``llamactor.base.reasoning``), then
tool calls are read out of the content (``llamactor.base.tool_parser``): a call is sent whole once
it closes, text that is not a call streams as content. docs/architecture.md ("A request, module
by module") says where the parts go.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactor.base.completion import Answer, Parts
from llamactor.base.reasoning import ReasoningSplitter
from llamactor.base.tools import ToolCall, ToolCallStream, Tools

__all__ = ["Answer", "AnswerSplitter", "Parts", "WholeText"]


@dataclass(frozen=True, slots=True)
class WholeText:
    """What a finished answer becomes in its ``Completion``: the text around the calls (the whole
    text when there are none), the calls, the answer's parts, the whole text as written, and the
    parts held back until the end (a stream's last)."""

    text: str
    calls: tuple[ToolCall, ...]
    answer: Answer
    raw_text: str
    last: Parts


class AnswerSplitter:
    """Splits one answer. ``tools``: read calls out of its content (None: all text is content);
    ``reasoning`` False: no ``<think>`` parsing (a raw prompt's answer as the model wrote it)."""

    def __init__(self, tools: Tools | None, reasoning: bool = True) -> None:
        self._reasoning = ReasoningSplitter() if reasoning else None
        self._calls = ToolCallStream(tools) if tools is not None else None
        self._thought: list[str] = []  # the reasoning so far
        self._plain: list[str] = []  # the content so far, before its calls are read out of it
        self._content: list[str] = []  # the content so far, the calls read out of it
        self._called: list[ToolCall] = []

    @classmethod
    def of(cls, tools: Tools | None, reasoning: bool) -> AnswerSplitter | None:
        """The splitter of an answer with these ``tools`` (read only when they parse) and
        ``reasoning`` split or not; None when there is nothing to split (all text is content)."""
        tools = tools if tools is not None and tools.parses else None
        return cls(tools, reasoning) if tools is not None or reasoning else None

    def feed(self, text: str) -> Parts:
        """The parts ``text`` completes (text that may be the start of a tag or a call is held back)."""
        reasoning, content = self._reasoning.feed(text) if self._reasoning is not None else ("", text)
        return self._kept(self._content_parts(reasoning, content))

    def finish(self) -> Parts:
        """What was held back (a possible tag or call block) when the answer ends."""
        reasoning, content = self._reasoning.finish() if self._reasoning is not None else ("", "")
        parts = self._content_parts(reasoning, content)
        if self._calls is not None:
            content, calls = self._calls.finish()
            parts = Parts(parts.reasoning, parts.content + content, parts.calls + calls)
        return self._kept(parts)

    def whole(self, raw_text: str, calls_count: bool) -> WholeText:
        """The answer ended (``finish``), whole; its text as written is ``raw_text``.
        ``calls_count`` False (the answer was cut short): its calls are not taken, all is content."""
        last = self.finish()
        calls = tuple(self._called) if calls_count else ()
        plain = "".join(self._plain)
        opened = self._reasoning is not None and self._reasoning.opened
        reasoning = "".join(self._thought).strip() if opened else None
        if not calls:
            return WholeText(raw_text, (), Answer(reasoning, plain.lstrip() if opened else plain, ()), raw_text, last)
        content = "".join(self._content)
        # the text around the calls keeps the reasoning as written: what precedes the plain content
        text = (raw_text[:len(raw_text) - len(plain)] + content).strip()
        return WholeText(text, calls, Answer(reasoning, content.strip(), calls), raw_text, last)

    def _content_parts(self, reasoning: str, content: str) -> Parts:
        self._plain.append(content)
        if self._calls is None or not content:
            return Parts(reasoning, content)
        content, calls = self._calls.feed(content)
        return Parts(reasoning, content, calls)

    def _kept(self, parts: Parts) -> Parts:
        self._thought.append(parts.reasoning)
        self._content.append(parts.content)
        self._called += parts.calls
        return parts
