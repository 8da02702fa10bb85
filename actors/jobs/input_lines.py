"""Pure: a batch job's input file read into lines, and the order those lines run in.

An input file is OpenAI's batch input format: one JSON object per line, ``{"custom_id", "method":
"POST", "url", "body"}``. ``read_input_lines`` splits it into the lines that will run and the lines
that failed validation (not JSON, no or a repeated ``custom_id``, another endpoint, a body the
endpoint's schema refuses, an unknown model): a bad line is an error-file entry, the job goes on.
A file with no JSON object on any line (or not UTF-8 at all) is no JSONL: ``NotJsonlError``
fails the whole batch.

The run order groups lines that share a prefix: lines sorted by their prompt's text run next to
their neighbours in a trie of prompts (a shared system prompt or few-shot block first), so the
prefix cache still holds that prefix when the next line needs it. No I/O, no threads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_LINES = 50_000  # OpenAI's limit per batch


class NotJsonlError(ValueError):
    """The input file is not JSONL at all: the batch fails (``code`` names why, for ``errors``)."""

    def __init__(self, message: str, code: str = "invalid_json_lines") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class InputLine:
    """One input line: ``body`` set when it runs, ``error`` (code, message) when it failed validation."""

    line_no: int  # 0-based, in the input file's order (the output file's order)
    custom_id: str | None
    body: dict[str, Any] | None
    error: tuple[str, str] | None = None
    rank: int = 0  # the run order: lines sharing a prefix get neighbouring ranks

    def __post_init__(self) -> None:
        if (self.body is None) == (self.error is None):
            raise ValueError("an input line has either a body to run or an error, not both or neither")


# Checks a body against the endpoint's schema; returns an error message or None. Given by the
# caller (``llamactor.jobs.endpoints.check_body``) so this module stays pure.
BodyCheck = Callable[[str, dict[str, Any]], str | None]


def read_input_lines(data: bytes, endpoint: str, check_body: BodyCheck) -> list[InputLine]:
    """Every non-blank line of ``data`` as an ``InputLine``, ranked for the run order.

    Raises ``NotJsonlError`` when the file is empty, not UTF-8, too long, or holds no JSON object."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
    seen: set[str] = set()
    lines = [_read_one(i, p, endpoint, check_body, seen) for i, p in enumerate(_parse_jsonl(data))]
    return rank_by_prefix(lines, endpoint)


def _parse_jsonl(data: bytes) -> list[Any]:
    """Each non-blank line's JSON value (None where it is not JSON); ``NotJsonlError`` for a file
    that is no JSONL at all."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotJsonlError(f"the input file is not UTF-8 text (byte {e.start}): not JSONL") from None
    raw_lines = [line for line in text.splitlines() if line.strip()]
    if not raw_lines:
        raise NotJsonlError("the input file is empty", "empty_file")
    if len(raw_lines) > MAX_LINES:
        raise NotJsonlError(f"the input file has {len(raw_lines)} lines; at most {MAX_LINES}", "too_many_requests")
    parsed: list[Any] = []
    for raw in raw_lines:
        try:
            parsed.append(json.loads(raw))
        except ValueError:
            parsed.append(None)
    if not any(isinstance(p, dict) for p in parsed):
        raise NotJsonlError("no line of the input file is a JSON object: the file is not JSONL")
    return parsed


def _read_one(line_no: int, obj: Any, endpoint: str, check_body: BodyCheck, seen: set[str]) -> InputLine:
    if not isinstance(obj, dict):
        return InputLine(line_no, None, None, ("invalid_json_line", f"line {line_no + 1} is not a JSON object"))
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InputLine(line_no, None, None, ("missing_custom_id", f"line {line_no + 1} has no custom_id string"))
    if custom_id in seen:
        return InputLine(line_no, custom_id, None,
                           ("duplicate_custom_id", f"custom_id {custom_id!r} appears more than once"))
    seen.add(custom_id)
    if obj.get("method", "POST") != "POST":
        return InputLine(line_no, custom_id, None, ("invalid_method", "method must be POST"))
    if obj.get("url") != endpoint:
        return InputLine(line_no, custom_id, None,
                           ("mismatched_url", f"url is {obj.get('url')!r}; this batch's endpoint is {endpoint}"))
    body = obj.get("body")
    if not isinstance(body, dict):
        return InputLine(line_no, custom_id, None, ("invalid_body", "body must be a JSON object"))
    if body.get("stream"):
        return InputLine(line_no, custom_id, None, ("invalid_body", "stream is not allowed in a batch"))
    problem = check_body(endpoint, body)
    if problem is not None:
        return InputLine(line_no, custom_id, None, ("invalid_body", problem))
    return InputLine(line_no, custom_id, body)


def prompt_text(endpoint: str, body: dict[str, Any]) -> str:
    """The text a line's prompt starts with, for grouping: chat messages joined in order (a shared
    system prompt first), a completion's prompt, an embedding's input."""
    if endpoint == "/v1/chat/completions":
        return "\x00".join(f"{m.get('role')}\x01{_content(m.get('content'))}"
                           for m in body.get("messages", []) if isinstance(m, dict))
    if endpoint == "/v1/responses":  # the instructions are the system message
        value = body.get("input")
        return f"{body.get('instructions') or ''}\x00{value if isinstance(value, str) else json.dumps(value)}"
    value = body.get("prompt" if endpoint == "/v1/completions" else "input")
    return value if isinstance(value, str) else json.dumps(value)


def _content(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def rank_by_prefix(lines: Sequence[InputLine], endpoint: str) -> list[InputLine]:
    """The lines (in input order) with ``rank`` set: lexicographic by prompt text, so that every
    group sharing a prefix is contiguous (a depth-first walk of the prompts' trie); ties keep the
    input order. Failed lines rank last (they never run)."""
    def key(line: InputLine) -> tuple[int, str, int]:
        return (0, prompt_text(endpoint, line.body), line.line_no) if line.body is not None else (1, "", line.line_no)
    order = sorted(lines, key=key)
    ranks = {line.line_no: r for r, line in enumerate(order)}
    return [InputLine(line.line_no, line.custom_id, line.body, line.error, ranks[line.line_no]) for line in lines]
