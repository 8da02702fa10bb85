"""The model's chat template: the Jinja text stored in the GGUF, rendered in a sandbox.

Rendered the way llama-cpp-python's ``Jinja2ChatFormatter`` does (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``), so a prompt built
here tokenizes to what llama-cpp-python's chat completion would send.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamactor.base.tool_format import ToolCallFormat

# Used when the GGUF carries no template: such a model is usually a *base* model, never trained
# on any turn markers, but it continues a plain transcript sensibly -- and its next "User:" line
# is where its answer ends (``TRANSCRIPT_STOP``, added to each chat request's stop strings).
TRANSCRIPT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] in ('system', 'developer') %}{{ message['content'] | trim }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] | trim }}\n"
    "{% else %}Tool: {{ message['content'] | trim }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
TRANSCRIPT_STOP = ("\nUser:", "\nAssistant:")

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


class ChatTemplateError(ValueError):
    """The messages could not be rendered (bad roles, or the template itself refused them)."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson``: plain JSON text, not Jinja's HTML-escaped ``Markup`` (templates
    join it to strings: ``'{"name": "' + name + '", "arguments": ' + args | tojson``)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def check_template_syntax(source: str) -> None:
    """``ChatTemplateError`` if ``source`` is not a Jinja template (a user's override, checked early)."""
    try:
        ImmutableSandboxedEnvironment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message})") from e


class ChatTemplate:
    """``source``: the GGUF's template (None if it has none); ``override``: the user's, used instead.

    ``name`` says which is in use; ``stop`` holds the strings that end an answer in this format
    (the transcript's next turn; empty for real templates, whose end-of-turn token is an EOG
    token); ``base_model`` is True when the GGUF has no template, the mark of a pretrained model.
    """

    def __init__(self, source: str | None, *, bos_token: str, eos_token: str, override: str | None = None) -> None:
        self.base_model = not source
        self.stop: tuple[str, ...]
        if override:
            self.name, self.stop, self.source = "override (chat_template option)", (), override
        elif source:
            self.name, self.stop, self.source = "gguf", (), source
        else:
            self.name = "transcript (the GGUF has no chat template: plain User:/Assistant: turns)"
            self.stop, self.source = TRANSCRIPT_STOP, TRANSCRIPT_TEMPLATE
        check_template_syntax(self.source)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(self.source)
        # Hugging Face templates that render tools read a ``tools`` variable; others get the
        # plain-text fallback of llamactor.base.tools.
        self.takes_tools = "tools" in self.source
        self._bos_token = bos_token
        self.eos_token = eos_token

    @functools.cached_property
    def tool_format(self) -> ToolCallFormat:
        """How this template's model writes a tool call (learned from the template once)."""
        from llamactor.base.tool_probe import learn_tool_format  # it renders through this class

        return learn_tool_format(self)

    @functools.cached_property
    def renders_system(self) -> bool:
        """Whether a system message reaches the prompt (Gemma 2's template, for one, refuses it)."""
        mark = "\x01llamactor-system\x01"
        try:
            return mark in self.render([{"role": "system", "content": mark}, {"role": "user", "content": "?"}])
        except ChatTemplateError:
            return False

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """``template_kwargs``: extra template variables (``chat_template_kwargs``, e.g.
        ``enable_thinking``); they cannot replace the messages, tools or special tokens."""
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        for i, m in enumerate(messages):
            # a role of any other type is refused before the set lookup (a dict or list is unhashable)
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or m["role"] not in VALID_ROLES:
                raise ChatTemplateError(f"messages[{i}] needs a role in {sorted(VALID_ROLES)}")
            if not isinstance(m.get("content"), str):
                raise ChatTemplateError(f"messages[{i}].content must be a string")
        if len(messages) >= 2 and all(m["role"] == "assistant" for m in messages[-2:]):
            # llama-server's rule: one trailing assistant message is continued, two are a mistake
            raise ChatTemplateError("Cannot have 2 or more assistant messages at the end of the list.")
        try:
            return self._template.render({  # ours last: a template kwarg cannot replace them
                **dict(template_kwargs or {}),
                "messages": [dict(m) for m in messages],
                "add_generation_prompt": add_generation_prompt,
                "bos_token": self._bos_token,
                "eos_token": self.eos_token,
                "raise_exception": _raise_exception,
                # None without tools, as Hugging Face passes it: templates test ``{% if tools %}``,
                # which StrictUndefined would refuse on a missing variable
                "tools": tools or None,
            })
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
