"""The one answer splitter every dialect uses: an answer as its reasoning (a ``<think>`` block),
its content, and its tool calls -- piece by piece for a stream (``AnswerSplitter``) or at once for
a finished ``Completion`` (``split_answer``). Pure.

A stream's tool calls are sent whole, each once it closes (in the model's own format); text that is not
a call streams as content (``llamactor.base.tools.ToolCallStream``). A finished answer's calls are
the engine's own (parsed from the whole text: ``Completion.tool_calls``), its text what surrounds
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamactor.base.completion import Completion
from llamactor.base.reasoning import ReasoningSplitter, split_reasoning
from llamactor.base.tools import ToolCall, ToolCallStream, Tools


@dataclass(frozen=True, slots=True)
class Parts:
    """What one piece (or a whole answer) adds: reasoning, content, and whole tool calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class AnswerSplitter:
    """Splits one streamed answer. ``tools``: parse it for calls (None: all text is content);
    ``reasoning`` False: no ``<think>`` parsing (a raw prompt's answer as the model wrote it)."""

    def __init__(self, tools: Tools | None, reasoning: bool = True) -> None:
        self._reasoning = ReasoningSplitter() if reasoning else None
        self._calls = ToolCallStream(tools) if tools is not None else None

    def feed(self, text: str) -> Parts:
        reasoning, content = self._reasoning.feed(text) if self._reasoning is not None else ("", text)
        return self._content(reasoning, content)

    def finish(self) -> Parts:
        """What was held back (a possible tag or call block) when the answer ends."""
        reasoning, content = self._reasoning.finish() if self._reasoning is not None else ("", "")
        parts = self._content(reasoning, content)
        if self._calls is None:
            return parts
        content, calls = self._calls.finish()
        return Parts(parts.reasoning, parts.content + content, parts.calls + calls)

    def _content(self, reasoning: str, content: str) -> Parts:
        if self._calls is None or not content:
            return Parts(reasoning, content)
        content, calls = self._calls.feed(content)
        return Parts(reasoning, content, calls)


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    reasoning: str | None  # None: the model did not reason
    content: str
    calls: tuple[ToolCall, ...]


def split_answer(c: Completion, reasoning: bool = True) -> WholeAnswer:
    """A finished answer's parts (``reasoning`` False: no ``<think>`` parsing)."""
    thought, content = split_reasoning(c.text) if reasoning else (None, c.text)
    return WholeAnswer(thought, content, tuple(c.tool_calls))
