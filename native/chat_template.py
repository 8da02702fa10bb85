"""The model's chat template: the Jinja text stored in the GGUF, rendered in a sandbox.

Rendered the way llama-cpp-python's ``Jinja2ChatFormatter`` does (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``), so a prompt built
here tokenizes to what llama-cpp-python's chat completion would send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used only when a GGUF carries no template (llama.cpp keeps similar built-ins by name).
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\\n\\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


class ChatTemplateError(ValueError):
    """The messages could not be rendered (bad roles, or the template itself refused them)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str, architecture: str = "") -> None:
        if source:
            self.name = "gguf"
        elif architecture.startswith("gemma"):
            source, self.name = GEMMA_TEMPLATE, "gemma (fallback: the GGUF has no template)"
        else:
            source, self.name = CHATML_TEMPLATE, "chatml (fallback: the GGUF has no template)"
        self.source = source
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        self._template = env.from_string(self.source)
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in VALID_ROLES:
                raise ChatTemplateError(f"messages[{i}] needs a role in {sorted(VALID_ROLES)}")
            if not isinstance(m.get("content"), str):
                raise ChatTemplateError(f"messages[{i}].content must be a string")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
                raise_exception=_raise_exception,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
