"""Ollama's request bodies and their options (pure; what they mean is ``call``).

Ollama's server is lenient where Go's JSON decoding is: unknown top-level fields are ignored, and
so are unknown ``options`` (with a warning); known fields are type-checked (a wrong type is a 400).
Options that llamactor cannot apply per request (``num_ctx``, ``mirostat`` ...) are accepted and
named in one warning log line, never applied silently as something else. Older Open WebUI builds
send the options at the top level: they are read there too (``options`` wins).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from llamactor.base.errors import InvalidRequestError

DIALECT = "ollama"
APPLIED = frozenset({"num_predict", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                     "presence_penalty", "frequency_penalty", "seed", "stop", "parse_special", "speculation"})
# Known options that change nothing at these values: no warning for them
NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
# Known options never applied whatever their value, with no effect on the output: no warning either.
# penalize_newline is ignored by Ollama itself; num_keep only matters when a context shifts, which never happens here.
QUIET = {"penalize_newline", "num_keep"}


class Options(BaseModel):
    """Ollama's ``options`` (its ``api.Options``), typed as Ollama types them; unknown keys kept."""

    model_config = ConfigDict(extra="allow")
    # applied: llamactor's sampling parameters
    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    # llamactor's: special-token text in a raw prompt read as those tokens (absent: true); a
    # templated prompt's text is message content, never read so
    parse_special: StrictBool | None = None
    # llamactor's: n-gram drafts from the sequence's own prompt and output, verified in the step
    # ("ngram") or none ("off"); absent: the operator's default (docs/architecture.md, *Speculation*)
    speculation: Literal["off", "ngram"] | None = None
    # accepted, not applied: samplers llamactor has not, and load-time settings (fixed at load)
    num_ctx: int | None = None
    num_keep: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None

    def sampling(self, n_ctx: int) -> dict[str, Any]:
        """llamactor sampling options. ``num_predict`` -1 (unlimited) and -2 (fill the context)
        both mean: until end of turn or the sequence's context (``max_tokens=None``); so does 0,
        as in Ollama's runner, which only stops at a positive limit. ``repeat_last_n`` -1: the
        whole context (``n_ctx``)."""
        out: dict[str, Any] = {k: v for k, v in {
            "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty}.items() if v is not None}
        out["max_tokens"] = self.num_predict if self.num_predict is not None and self.num_predict > 0 else None
        if self.seed is not None and self.seed >= 0:  # Ollama's -1: a random seed
            out["seed"] = self.seed
        if self.repeat_last_n is not None:  # Ollama's -1: the whole context
            out["repeat_last_n"] = n_ctx if self.repeat_last_n == -1 else self.repeat_last_n
        if self.stop:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if self.speculation is not None:
            out["speculation"] = self.speculation
        return out

    def not_applied(self) -> tuple[list[str], list[str]]:
        """(known options given but not applied, unknown options), for the warning log line."""
        ignored = sorted(k for k in self.model_fields_set & set(Options.model_fields)
                         if k not in APPLIED and k not in QUIET and getattr(self, k) is not None
                         and NEUTRAL.get(k, object()) != getattr(self, k)
                         and not (k in ("mirostat_tau", "mirostat_eta") and not self.mirostat))  # mirostat off
        unknown = sorted(k for k, v in (self.model_extra or {}).items() if v is not None)
        return ignored, unknown


OPTION_NAMES = frozenset(Options.model_fields)


class _WithOptions(BaseModel):
    """A request naming a model, with options; unknown fields are accepted and ignored (as Go does)."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    options: Options = Field(default_factory=Options)
    keep_alive: float | str | None = None

    @field_validator("options", mode="before")
    @classmethod
    def _null_options(cls, value: Any) -> Any:
        return {} if value is None else value  # null values are skipped, as Ollama skips them


class ModelRequest(_WithOptions):
    """Fields every generating request has."""

    format: Literal["", "json"] | dict[str, Any] | None = None
    stream: bool | None = None  # absent: streamed (Ollama's server default; its python client sends false)
    think: bool | Literal["low", "medium", "high", "max"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _top_level_options(cls, data: Any) -> Any:
        """Options sent beside ``options`` (older Open WebUI builds): moved into it, ``options`` wins."""
        if not isinstance(data, dict):
            return data
        loose = {k: data[k] for k in data if k in OPTION_NAMES and k not in cls.model_fields}
        if not loose:
            return data
        options = data.get("options")
        rest = {k: v for k, v in data.items() if k not in loose}
        return {**rest, "options": {**loose, **options} if isinstance(options, dict) else options or loose}

    @property
    def streamed(self) -> bool:
        return self.stream is not False


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class OllamaToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    function: ToolCallFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None  # an earlier answer's reasoning: not shown to the model again
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None  # LangChain sends it; Ollama's python client does not


class ChatRequest(ModelRequest):
    messages: list[Message] | None = None
    tools: list[dict[str, Any]] | None = None  # [] (what the python client always sends): no tools


class GenerateRequest(ModelRequest):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None

    def check(self) -> None:
        """Ollama's own refusals, and what llamactor does not do (400)."""
        if self.raw and (self.template or self.system or self.context):
            raise InvalidRequestError("raw mode does not support template, system, or context")
        if self.template:
            raise InvalidRequestError("template is not supported: prompts are rendered by the model's own chat "
                                      "template (send raw: true to pass a prompt as is)")
        if self.suffix:
            raise InvalidRequestError("suffix (fill-in-the-middle insertion) is not supported")
        if self.context:
            raise InvalidRequestError("context (the token ids of an earlier answer) is not supported: "
                                      "send the conversation to /api/chat instead")
        if self.images:
            raise InvalidRequestError(f"{self.model} does not support images")


class EmbedRequest(_WithOptions):
    input: str | list[str] = ""
    truncate: bool | None = None  # absent: true, as in Ollama
    dimensions: int | None = Field(default=None, ge=1)


class EmbeddingsRequest(_WithOptions):
    """The legacy ``/api/embeddings`` body."""

    prompt: str = ""


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    name: str | None = None  # the legacy field
    verbose: bool | None = None


class PullRequest(ShowRequest):
    stream: bool | None = None


_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_s(value: float | str | None) -> float | None:
    """``keep_alive`` in seconds (negative: forever; None: not given). A number is seconds; a
    string a Go duration ("5m", "1h30m", "-1m", "0") or, as a harmless extension, a number."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise InvalidRequestError(f'keep_alive: invalid duration "{value}" (a number of seconds or e.g. "5m", "1h")')
    return sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
