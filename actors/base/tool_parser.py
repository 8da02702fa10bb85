"""Reading tool calls out of an answer, in the model's own ``ToolCallFormat`` (pure; any thread).

``ToolCallParser`` takes the answer piece by piece: text that is not a call comes back as
content as soon as it cannot be the start of one (text that may be the beginning of a call marker
is held back), and each call comes back whole once its JSON -- and the marker closing it, where
the format has one -- is complete. A whole answer is the same parser fed once and finished, so a
streamed answer and a finished one always split alike. A block that is not a call of a known tool
(unknown name, JSON that does not parse, no JSON after the marker) is content, as written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from llamactor.base.tool_format import ToolCall, ToolCallFormat

_WAIT = None  # _read's answer when the call is not complete yet
_BETWEEN_CALLS = " \t\r\n;,"  # what may separate two calls; dropped, not content


class ToolCallParser:
    """Splits one answer into content and whole calls of the tools named ``names``."""

    def __init__(self, fmt: ToolCallFormat, names: Iterable[str]) -> None:
        self._fmt = fmt
        self._names = frozenset(names)
        self._openings = fmt.openings
        self._buffer = ""
        self._at_start = True  # nothing but whitespace (or calls) so far: a bare JSON call may begin

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Content to send now, and the calls complete with this piece."""
        self._buffer += piece
        return self._drain(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the answer: what was held back, as content or as a last call (one whose
        closing marker never came: the turn's end closes it)."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._buffer:
            found = self._opening()
            if found is None:
                keep = 0 if final else self._held_back()
                text, self._buffer = self._buffer[:len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
                content.append(text if final else self._emit(text))  # the end: blank text is content too
                break
            at, marker = found
            before, self._buffer = self._buffer[:at], self._buffer[at:]
            content.append(self._emit(before, dropping_blank=True))
            read = self._read(marker, final)
            if read is _WAIT:
                break
            made, used = read
            if made:
                calls += made
                self._at_start = True
            else:
                content.append(self._emit(self._buffer[:used]))
            self._buffer = self._buffer[used:]
        return "".join(content), calls

    def _emit(self, text: str, dropping_blank: bool = False) -> str:
        """``text`` as content; blank text at the start (or between calls) before a call is dropped,
        and while only blank text came, it is held rather than sent (the answer may be all calls)."""
        if self._at_start and not text.strip(_BETWEEN_CALLS if dropping_blank else None):
            if dropping_blank:
                return ""
            self._buffer = text + self._buffer
            return ""
        if text:
            self._at_start = False
        return text

    def _opening(self) -> tuple[int, str] | None:
        """Where the next call may begin, and the marker that opens it ("" for bare JSON)."""
        hits = [(i, m) for m in self._openings if (i := self._buffer.find(m)) >= 0]
        if self._fmt.bare_json and self._at_start:
            head = self._buffer.lstrip(_BETWEEN_CALLS)
            if head.startswith("[" if self._fmt.as_list else "{"):
                hits.append((len(self._buffer) - len(head), ""))
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """How much of the buffer's end may be the start of a call, so is not content yet."""
        if self._at_start and not self._buffer.strip(_BETWEEN_CALLS):
            return len(self._buffer)
        longest = 0
        for marker in self._openings:
            for n in range(min(len(marker) - 1, len(self._buffer)), longest, -1):
                if marker.startswith(self._buffer[-n:]):
                    longest = n
                    break
        return longest

    def _read(self, marker: str, final: bool) -> tuple[list[ToolCall], int] | None:
        """The buffer opens with ``marker``: the calls it holds and how much of it they use, or
        ([], n) if its first n characters are content after all, or ``_WAIT``."""
        rest = self._buffer[len(marker):]
        body = rest.lstrip()
        at = len(marker) + len(rest) - len(body)
        if not body or body[0] not in "{[":
            return ([], len(self._buffer) if final or not marker else len(marker)) if body or final else _WAIT
        end = json_end(body)
        if end is None:
            return ([], len(self._buffer)) if final else _WAIT
        try:
            calls = self._calls(json.loads(body[:end]))
        except json.JSONDecodeError:
            calls = None
        if calls is None:
            return [], at + end
        return self._closed(calls, at + end, final)

    def _closed(self, calls: list[ToolCall], used: int, final: bool) -> tuple[list[ToolCall], int] | None:
        """The calls, with the closing marker after them taken too (waiting while it may come)."""
        close = self._fmt.end.strip()
        if not close:
            return calls, used
        after = self._buffer[used:]
        tail = after.lstrip()
        if tail.startswith(close):
            return calls, used + len(after) - len(tail) + len(close)
        if close.startswith(tail) and not final:
            return _WAIT
        return calls, used  # never closed (the turn ended): a call all the same

    def _calls(self, value: Any) -> list[ToolCall] | None:
        """The JSON as this format's calls of known tools, or None if it is not that."""
        items = value if self._fmt.as_list and isinstance(value, list) and value else [value]
        calls = [self._call(item) for item in items]
        return None if any(c is None for c in calls) else calls  # type: ignore[return-value]

    def _call(self, item: Any) -> ToolCall | None:
        if not isinstance(item, dict) or item.get("name") not in self._names:
            return None
        args = item.get(self._fmt.args_key, item.get("arguments", item.get("parameters", {})))
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        # Mistral's templates refuse a history call whose id is not 9 letters and digits
        call_id = uuid.uuid4().hex[:9] if self._fmt.family == "mistral" else f"call_{uuid.uuid4().hex[:24]}"
        return ToolCall(call_id, item["name"], text)


def json_end(text: str) -> int | None:
    """Where the JSON object or list that ``text`` opens with ends, or None if it is not closed
    yet (strings and their escapes skipped; whether it parses is ``json.loads``'s to say)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
