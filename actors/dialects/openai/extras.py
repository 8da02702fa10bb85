"""Request fields of the peers (llama.cpp's llama-server, vLLM) that clients really send to an
OpenAI-compatible server, and the rule for fields nobody defined (pure).

The rule, from what clients send: the official SDKs send only the arguments their caller passes
and LangChain only fields it knows, so a field outside OpenAI's API comes from ``extra_body``
aimed at llama-server or vLLM. Those peers' own fields are accepted: honoured where llamactor
can (``n_predict``, ``repetition_penalty``, ``chat_template_kwargs``, ``reasoning_effort``,
vLLM's ``guided_*`` constraints; llama-server's ``lora``, a field of the schema itself), otherwise accepted and named in a ``request_fields_ignored``
warning (never silently changing the output: each one named there does not apply). A field
that neither OpenAI nor a peer defines is refused with a 400 naming it: a typo such as
``temprature`` must not quietly do nothing.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar

# Accepted, not honoured (named in the warning when given with a value that would matter).
IGNORED = frozenset({
    # llama-server (tools/server README): slots, caching, samplers llamactor does not have
    "id_slot", "n_keep", "n_probs", "min_keep", "n_indent", "n_cmpl", "n_cache_reuse", "samplers",
    "t_max_predict_ms", "top_n_sigma", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta",
    "speculative.n_max", "speculative.n_min", "speculative.p_min",  # draft lengths: the step's budget decides here
    "dynatemp_range", "dynatemp_exponent", "return_tokens", "timings_per_token", "return_progress",
    "post_sampling_probs", "response_fields", "reasoning_format", "parse_tool_calls", "typical_p",
    # vLLM's sampling extras
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "min_tokens",
    "add_special_tokens", "truncate_prompt_tokens", "use_beam_search", "length_penalty", "stop_token_ids",
    "bad_words", "allowed_token_ids", "add_generation_prompt", "continue_final_message", "documents",
    "guided_decoding_backend", "guided_whitespace_pattern", "request_id", "return_token_ids", "kv_transfer_params",
    # OpenAI fields that change nothing here
    "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "verbosity", "modalities",
    "web_search_options", "audio", "functions", "function_call",
})
# Values of ignored fields that change nothing, so they need no warning.
NEUTRAL: dict[str, Any] = {"id_slot": -1, "typical_p": 1.0, "samplers": None, "add_generation_prompt": True,
                           "continue_final_message": False, "skip_special_tokens": True, "n_probs": 0}


class PeerExtras(BaseModel):
    """Mixed into the OpenAI request bodies: the peers' fields llamactor honours."""

    model_config = ConfigDict(extra="allow")

    n_predict: int | None = None  # llama-server's max_tokens (wins over max_tokens, as there; -1: no limit)
    repetition_penalty: float | None = None  # vLLM's name for repeat_penalty
    cache_prompt: bool = True  # llama-server: reuse cached KV; llamactor always does (false: a warning)
    chat_template_kwargs: dict[str, Any] | None = None  # extra chat-template variables (enable_thinking ...)
    reasoning_effort: str | None = None  # reaches the chat template as a variable (gpt-oss-style templates)
    guided_json: dict[str, Any] | str | None = None  # vLLM's structured outputs
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _known_extras_only(self) -> PeerExtras:
        unknown = sorted(set(self.model_extra or {}) - IGNORED)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))}: not an OpenAI, llama-server or vLLM "
                             "request field")
        return self

    def ignored_fields(self) -> list[str]:
        """The given fields llamactor cannot honour, for the warning."""
        given = [k for k, v in (self.model_extra or {}).items() if v is not None and NEUTRAL.get(k, object()) != v]
        return given + (["cache_prompt"] if not self.cache_prompt else [])

    def peer_sampling(self, repeat_penalty: float | None, chat: bool) -> dict[str, Any]:
        """The honoured peer fields as llamactor sampling options (``ignored_fields`` names the rest)."""
        out: dict[str, Any] = {}
        if self.n_predict is not None:
            out["max_tokens"] = None if self.n_predict < 0 else self.n_predict
        if self.repetition_penalty is not None and repeat_penalty is None:
            out["repeat_penalty"] = self.repetition_penalty
        template_kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            template_kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        if template_kwargs:
            if not chat:
                raise InvalidRequestError("chat_template_kwargs and reasoning_effort apply to chat requests")
            out["chat_template_kwargs"] = template_kwargs
        return out

    def peer_constraint(self) -> tuple[str, Grammar] | None:
        """vLLM's ``guided_*`` constraint, if one was given (name, compiled grammar)."""
        if self.guided_json is not None:
            return "guided_json", Grammar.json_schema(self.guided_json)
        if self.guided_regex is not None:
            return "guided_regex", Grammar.regex(self.guided_regex)
        if self.guided_choice is not None:
            if not self.guided_choice:
                raise InvalidRequestError("guided_choice must list at least one choice")
            return "guided_choice", Grammar.regex("|".join(re.escape(c) for c in self.guided_choice))
        if self.guided_grammar is not None:
            return "guided_grammar", Grammar.gbnf(self.guided_grammar)
        return None
