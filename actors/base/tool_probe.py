"""Learning a model's ``ToolCallFormat`` from its chat template (pure; runs once per template).

The way llama.cpp's ``common/chat`` auto-parser does it (``chat-diff-analyzer.cpp``): render
the same conversation twice -- the assistant's turn empty, then carrying one tool call with a
distinctive name and argument -- and read the difference. The call's JSON is found by its name;
what comes before it is the opening marker, what comes after (up to the turn's end) the closing
one; the JSON's keys say where the arguments go (``"arguments"`` or ``"parameters"``), and a list
around it says the calls are written as one list (Mistral). Then the families that need more than
the template shows are handled explicitly: Llama 3.x (its ``<|python_tag|>`` opening, which the
template writes only for built-in tools), Mistral's ``[TOOL_CALLS]`` and Hermes / Qwen blocks,
when the probe cannot be rendered. A template that knows no tools gets ``FALLBACK``: the Hermes
block, taught in the system message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from llamactor.base.tool_format import FALLBACK, HERMES, LLAMA3, MISTRAL, ToolCallFormat
from llamactor.base.tool_parser import json_end


class ChatTemplate(Protocol):
    """What the probe needs of ``llamactor.base.chat_template.ChatTemplate`` (which calls it)."""

    source: str
    eos_token: str
    takes_tools: bool

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None,
               template_kwargs: Mapping[str, Any] | None = None) -> str: ...

PROBE_NAME = "probe_fn_QX7"
PROBE_ARG = "probe_arg_ZK9"
PROBE_ID = "call00001"  # 9 letters and digits: Mistral's templates refuse any other id
_PROBE_TOOL = {"type": "function", "function": {
    "name": PROBE_NAME, "description": "A probe.",
    "parameters": {"type": "object", "properties": {PROBE_ARG: {"type": "string"}}, "required": [PROBE_ARG]}}}
_CLOSERS = {"<": ">", "[": "]"}


def learn_tool_format(template: ChatTemplate) -> ToolCallFormat:
    """The format ``template``'s model writes calls in (``FALLBACK`` when it knows no tools)."""
    if not template.takes_tools:
        return FALLBACK
    try:
        learned = probe(template)
    except (ValueError, TypeError, KeyError, AttributeError):  # ChatTemplateError is a ValueError
        learned = None  # the template refused the probe: the family's markers decide
    return _family(template.source, learned)


def probe(template: ChatTemplate) -> ToolCallFormat | None:
    """The format read off two renders of the probe conversation, or None if the template
    writes no JSON call (or none that names the probe)."""
    user = {"role": "user", "content": "Probe?"}
    call = {"id": PROBE_ID, "type": "function", "function": {"name": PROBE_NAME, "arguments": {PROBE_ARG: "v"}}}
    without = template.render([user, {"role": "assistant", "content": ""}], add_generation_prompt=False,
                              tools=[_PROBE_TOOL])
    with_call = template.render([user, {"role": "assistant", "content": "", "tool_calls": [call]}],
                                add_generation_prompt=False, tools=[_PROBE_TOOL])
    return read_format(without, with_call, template.eos_token)


def read_format(without: str, with_call: str, eos_token: str = "") -> ToolCallFormat | None:
    """The format of the call that ``with_call`` adds to ``without`` (pure text work)."""
    lo = _marker_start(with_call, _common_prefix(without, with_call))
    hi = len(with_call) - _common_suffix(without[lo:], with_call[lo:])
    found = _probe_json(with_call, lo, hi)
    if found is None:
        return None
    at, end, value = found
    item = value[0] if isinstance(value, list) else value
    args_key = next((k for k, v in item.items() if k != "name" and PROBE_ARG in json.dumps(v)), None)
    if args_key not in ("arguments", "parameters"):
        return None
    start = with_call[lo:at].lstrip()
    close = _whole_markers(with_call, end, max(hi, end))
    if eos_token and close.rstrip().endswith(eos_token):
        close = close.rstrip()[:-len(eos_token)]
    return ToolCallFormat("learned", start, close.rstrip(), args_key=args_key, as_list=isinstance(value, list),
                          separator=", " if isinstance(value, list) else "\n")


def _probe_json(text: str, lo: int, hi: int) -> tuple[int, int, Any] | None:
    """The first JSON object or list in ``text[lo:hi]`` that is (or lists) the probe's call."""
    for at in range(lo, hi):
        if text[at] not in "{[":
            continue
        n = json_end(text[at:hi])
        if n is None:
            continue
        try:
            value = json.loads(text[at:at + n])
        except json.JSONDecodeError:
            continue
        item = value[0] if isinstance(value, list) and value else value
        if isinstance(item, dict) and item.get("name") == PROBE_NAME:
            return at, at + n, value
    return None


def _marker_start(text: str, at: int) -> int:
    """``at``, moved back to the start of a marker (``<...>``, ``[...]``) it falls inside of: the
    shared head the diff cut off may have ended inside the opening marker."""
    for opener, closer in _CLOSERS.items():
        if (i := text.rfind(opener, 0, at)) > text.rfind(closer, 0, at):
            at = i
    return at


def _whole_markers(text: str, start: int, stop: int) -> str:
    """``text[start:stop]``, grown to close a marker it opens (``<...>``, ``[...]``): the shared
    tail the diff cut off may have begun inside the closing marker."""
    piece = text[start:stop]
    for opener, closer in _CLOSERS.items():
        if piece.rfind(opener) > piece.rfind(closer) and (n := text.find(closer, stop)) >= 0:
            piece = text[start:n + 1]
    return piece


def _family(source: str, learned: ToolCallFormat | None) -> ToolCallFormat:
    """The learned format with what its family needs beyond the template, or the family's own."""
    if "<|python_tag|>" in source or ("<|eot_id|>" in source and '"parameters"' in source):
        base = learned if learned is not None and learned.args_key == "parameters" else LLAMA3
        return replace(base, family="llama3", alt_starts=LLAMA3.alt_starts, separator=LLAMA3.separator)
    if "[TOOL_CALLS]" in source:
        return replace(learned, family="mistral") if learned is not None and learned.as_list else MISTRAL
    if learned is not None:
        return replace(learned, family="hermes") if learned.start.strip() == "<tool_call>" else learned
    return HERMES  # a template that takes tools but writes no JSON call we can read: today's block


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    return _common_prefix(a[::-1], b[::-1])
