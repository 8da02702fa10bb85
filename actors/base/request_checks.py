"""Checks at the edge that every front end's request passes before anything is queued (pure).

A request is built on the caller's thread (``llamactor.base.request``, the tokenizer routes'
plans); what it carries is then read on the batcher thread, where a value the engine cannot take
would fail late -- or, worse, outside ``LlamactorError``. These checks make such values a 400 that
says what and where, in linear time on any input:

- ``check_text``: no lone surrogate (``"\\ud800"`` is valid JSON, but no UTF-8 text, so the
  tokenizer and the template cannot take it) in any string of a nested value, keys included.
  OpenAI's API replaces them; llamactor refuses them, naming the JSON path, so a caller learns
  that its text was corrupted instead of having the model read something else.
- ``json_depth``: how deeply a value nests (a JSON Schema's cap is ``llamactor.base.grammar``'s).
- ``check_messages``: at most ``MAX_MESSAGES`` messages, and every ``tool_calls`` entry shaped as
  OpenAI's (a ``function`` with a ``name`` and ``arguments`` as text or an object), whether or
  not the request gives tools: a template may render them either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llamactor.base.errors import InvalidRequestError

# Messages in one chat. The longest real conversations (agents' tool loops) reach hundreds;
# 60,001 cost 51 s of rendering on the batcher thread before the context check refused them.
MAX_MESSAGES = 4096
# Nesting a walk follows; deeper is refused (a request body's JSON is already bounded by the
# HTTP layer's depth check: this bounds what the Python API is handed, cycles included).
MAX_NESTING = 512


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (a str cannot hold a valid pair as two
    code points that UTF-8 could take: any surrogate code point is lone), or None. UTF-8's
    encoder finds it at C speed (a regex scan took 20 ms a megabyte)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def path_key(where: str, key: Any) -> str:
    """``where`` followed by ``key`` as a JSON path: ``.name`` or ``["odd key"]``."""
    if isinstance(key, str) and key.isidentifier() and lone_surrogate(key) is None:
        return f"{where}.{key}"
    if isinstance(key, str):
        escaped = key.encode("ascii", "backslashreplace").decode("ascii").replace('"', '\\"')
        return f'{where}["{escaped}"]'
    return f"{where}[{key!r}]"


def check_text(value: Any, where: str) -> None:
    """``InvalidRequestError`` naming the path (``messages[2].content[0].text``) of the first
    string in ``value`` -- a str, or mappings and sequences of them, nested -- that holds a lone
    surrogate. Linear in the value's size: JSON's and UTF-8's encoders (C) read it all at once,
    and only a value they refuse is walked to say where (4,096 messages: 5 ms, not 100)."""
    if isinstance(value, str):
        _check_string(value, where)
        return
    try:
        json.dumps(value, ensure_ascii=False, default=_plain).encode("utf-8")
        return
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        _walk(value, where)  # a lone surrogate (or an odd value): find it, or pass what is fine


def _plain(value: Any) -> Any:
    """What JSON's encoder reads of a value that is no dict, list or tuple (strings inside other
    objects are not text the engine reads)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return list(value)
    return None


def _walk(value: Any, where: str) -> None:
    """``check_text``'s slow way, which knows the path of what it reads (iterative)."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, at, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item, at)
        elif isinstance(item, Mapping):
            _check_depth(depth, where)
            for key, sub in reversed(list(item.items())):
                if isinstance(key, str):
                    _check_string(key, f"a key of {at}")
                stack.append((sub, path_key(at, key), depth + 1))
        elif isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray)):
            _check_depth(depth, where)
            stack.extend((sub, f"{at}[{i}]", depth + 1) for i, sub in reversed(list(enumerate(item))))


def _check_string(text: str, at: str) -> None:
    i = lone_surrogate(text)
    if i is not None:
        raise InvalidRequestError(
            f"{at} holds a lone surrogate (U+{ord(text[i]):04X}) at character {i}: text must be valid "
            "Unicode (a lone \\ud800-\\udfff escape is not a character)", param=at)


def _check_depth(depth: int, where: str) -> None:
    if depth >= MAX_NESTING:
        raise InvalidRequestError(f"{where} nests more than {MAX_NESTING} levels deep", param=where)


def json_depth(value: Any, limit: int) -> int:
    """How many levels of objects and arrays ``value`` nests (a scalar: 0), counted up to
    ``limit + 1`` only: iterative, so a deep (or cyclic) value never reaches Python's recursion
    limit."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, Sequence) and not isinstance(item, (str, bytes, bytearray)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_message_count(messages: Sequence[Any], where: str = "messages") -> None:
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequestError(f"{where} holds {len(messages)} messages: at most {MAX_MESSAGES} per request",
                                  param=where)


def check_messages(messages: Sequence[Any], where: str = "messages") -> None:
    """At most ``MAX_MESSAGES`` messages, each a mapping whose ``tool_calls`` (if any) are well
    formed, and no lone surrogate in any of their strings (plain string fields, the bulk of a
    chat, are read at C speed; only nested parts and calls go through ``check_text``)."""
    check_message_count(messages, where)
    for i, message in enumerate(messages):
        if type(message) is not dict and not isinstance(message, Mapping):
            raise InvalidRequestError(f"{where}[{i}] must be an object with a role and content", param=f"{where}[{i}]")
        calls = message.get("tool_calls")
        if calls is not None:
            check_tool_calls(calls, f"{where}[{i}].tool_calls")
        for key, value in message.items():
            if type(key) is str and not key.isascii():
                _check_string(key, f"a key of {where}[{i}]")
            if type(value) is str:
                if not value.isascii():
                    _check_string(value, path_key(f"{where}[{i}]", key))
            elif value is not None and not isinstance(value, (int, float)):
                check_text(value, path_key(f"{where}[{i}]", key))


def check_tool_calls(calls: Any, where: str) -> None:
    """An assistant's earlier calls as OpenAI writes them: a list of ``{"type": "function",
    "function": {"name": str, "arguments": JSON text or object}}`` (``id`` and ``type`` optional)."""
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise InvalidRequestError(f"{where} must be a list of tool calls", param=where)
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise InvalidRequestError(f'{at} must be {{"type": "function", "function": {{"name": ..., '
                                      f'"arguments": ...}}}}', param=at)
        if call.get("type", "function") != "function":
            raise InvalidRequestError(f'{at}.type must be "function"', param=f"{at}.type")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise InvalidRequestError(f"{at}.id must be a string", param=f"{at}.id")
        function = call["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidRequestError(f"{at}.function.name must be a non-empty string", param=f"{at}.function.name")
        if not isinstance(function.get("arguments"), (str, Mapping, type(None))):
            raise InvalidRequestError(f"{at}.function.arguments must be JSON text or an object",
                                      param=f"{at}.function.arguments")


# Token ids one label request may name across its groups: the reduction reads only these logits
# of a row (``llamactor.native.scoring.label_probs``), so it stays narrow next to the vocabulary.
MAX_LABEL_IDS = 1024


def label_groups(value: Any, where: str = "label_token_ids") -> tuple[tuple[int, ...], ...]:
    """A label request's groups of token ids, checked and normalized: at least two groups, each a
    non-empty list of non-negative ints (repeats within a group counted once, an id in two groups
    refused: its mass would count for both), at most ``MAX_LABEL_IDS`` ids in all. That the ids
    are the model's is checked where the vocabulary is known (the batcher, ``start_sequence``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) < 2:
        raise InvalidRequestError(f"{where} must be a list of at least two groups of token ids", param=where)
    groups: list[tuple[int, ...]] = []
    owner: dict[int, int] = {}
    for g, group in enumerate(value):
        at = f"{where}[{g}]"
        if isinstance(group, (str, bytes)) or not isinstance(group, Sequence) or not group:
            raise InvalidRequestError(f"{at} must be a non-empty list of token ids", param=where)
        ids: list[int] = []
        for t in group:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise InvalidRequestError(f"{at} holds {t!r}: token ids are non-negative integers", param=where)
            if t in owner:
                if owner[t] != g:
                    raise InvalidRequestError(f"token id {t} is in {where}[{owner[t]}] and {at}: a token belongs "
                                              "to one group", param=where)
                continue
            if len(owner) == MAX_LABEL_IDS:
                raise InvalidRequestError(f"{where} names more than {MAX_LABEL_IDS} token ids", param=where)
            owner[t] = g
            ids.append(t)
        groups.append(tuple(ids))
    return tuple(groups)
