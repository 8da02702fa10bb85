"""The typed generation request every front end builds: ``GenerationRequest`` (its sibling for
embeddings: ``llamactor.base.embedding_request``).

The Python API's arguments, an HTTP dialect's body and a batch line all become one of these,
built and validated once, on the caller's thread, before anything is queued: a bad value is an
``InvalidRequestError`` here and nowhere later. A generation request carries its sampling
parameters already resolved against the model's defaults (``SamplingParams``, its grammar
compiled), its tools (their grammar compiled once), its priority, and what its answer must carry
back (the prompt as text, a clamped ``max_tokens``). ``Client.submit(request)`` turns it into one
``Generate`` message per choice. Pure: no actor, no I/O.

What only the batcher knows -- the chat format's turn markers and the prompt's token count -- it
adds once, when it admits a choice (``admitted_sampling``): the sampling a choice runs with is final
from then on, and nothing edits it after.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.adapters import AdapterSet, adapter_set
from llamactor.base.sampling import SEED_LIMIT, SamplingParams
from llamactor.base.errors import ContextExceededError, InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.logging import get_logger
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.priority import DEFAULT_PRIORITY, parse_priority
from llamactor.base.request_checks import check_message_count, check_messages, check_text, label_groups
from llamactor.base.tenants import DEFAULT, Tenant
from llamactor.base.tool_format import ToolCallFormat
from llamactor.base.tools import Tools

log = get_logger("llamactor.batcher")  # its one event, max_tokens_clamped, is the batcher's (it runs there)

MAX_CHOICES = 64  # choices of one prompt per request (the API's n; HTTP caps n and best_of at 16)
Prompt = str | Sequence[int]
Messages = Sequence[Mapping[str, Any]]
Continuation = str | tuple[int, ...]


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def choice_request_id(request_id: str, index: int, n: int) -> str:
    """The id of choice ``index`` of ``n``: the request's own id when ``n`` is 1."""
    return request_id if n == 1 else f"{request_id}-{index}"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """``n`` choices of one prompt: exactly one of ``text`` (raw completion), ``token_ids`` or
    ``messages`` (a chat, rendered by the model's chat format). Build it with ``build`` (or
    ``Client.request``), which resolves loose API arguments; the constructor only checks."""

    params: SamplingParams  # resolved against the model's defaults; with a seed, choice i uses seed + i
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    n: int = 1
    tools: Tools | None = None  # a chat's tools: rendered into its prompt, calls parsed from its answers
    priority: int = DEFAULT_PRIORITY  # lower runs first (llamactor.scheduling.policy)
    chat_template_kwargs: Mapping[str, Any] | None = None  # a chat's extra template variables
    # Scoring (lm-eval's loglikelihood): choice i scores continuations[i] after the prompt.
    continuations: tuple[Continuation, ...] = ()
    # Label scoring (rerank): nothing sampled; the prompt's last row read as these groups' share
    # of probability (``Completion.label_probs``), with or without ``continuations``.
    label_token_ids: tuple[tuple[int, ...], ...] = ()
    request_id: str | None = None  # None: a fresh one per submission
    echo_prompt: bool = False  # the answer carries the prompt as text (``Completion.prompt_text``)
    # A max_tokens the context cannot hold after the prompt is cut to the room left (Anthropic's
    # upper-bound reading) instead of refused; ``Completion.clamped_max_tokens`` says so.
    clamp_max_tokens: bool = False
    # Whose request: its cache scope, fair share, limits (the server derives it from the key;
    # in-process, the caller names it). Set with ``for_tenant``, which applies its priority ceiling.
    tenant: Tenant = DEFAULT
    # The LoRA adapters it runs under, (name, scale) sorted by name (``adapter_set``); (): the base model.
    lora: AdapterSet = ()
    # Whether its answers' ``<think>`` blocks are split from their content (``Completion.answer``,
    # ``Piece.parts``); None: a chat's are, a raw prompt's are not (it is the model's text as written).
    split_reasoning: bool | None = None
    # Whether special-token text in a raw prompt (``<|im_start|>``, ``<start_of_turn>``) is read as
    # those tokens, as llama-server and llama-cpp-python read completion prompts; a chat's message
    # content never is (docs/operations.md, the threat model).
    parse_special: bool = True

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.text, self.messages, self.token_ids)) != 1:
            raise InvalidRequestError("a request needs exactly one of a prompt (text or token ids) or messages")
        if self.token_ids is not None and not self.token_ids:
            raise InvalidRequestError("prompt must not be empty")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be an integer in [1, {MAX_CHOICES}], got {self.n!r}")
        if self.messages is None and (self.tools is not None or self.chat_template_kwargs is not None):
            raise InvalidRequestError("tools and chat_template_kwargs need a chat (messages), not a raw prompt")
        if not isinstance(self.label_token_ids, tuple) or self.label_token_ids:
            self._check_labels()
        if self.continuations and (self.messages is not None or len(self.continuations) != self.n
                                   or (self.params.prompt_logprobs is None and not self.label_token_ids)):
            raise InvalidRequestError("scored continuations need a raw prompt, prompt_logprobs or label_token_ids, "
                                      "and one choice each")
        if not isinstance(self.parse_special, bool):
            raise InvalidRequestError(f"parse_special must be true or false, got {self.parse_special!r}",
                                      param="parse_special")
        self._check_text()

    def _check_labels(self) -> None:
        """A label request's groups normalized (``label_groups``); it samples nothing."""
        object.__setattr__(self, "label_token_ids", label_groups(self.label_token_ids))
        if self.params.max_tokens != 0:
            raise InvalidRequestError("a request with label_token_ids samples nothing: max_tokens must be 0 "
                                      f"(or unset), got {self.params.max_tokens}", param="max_tokens")

    def _check_text(self) -> None:
        """What the batcher will render and tokenize, checked here: valid Unicode everywhere,
        messages within the cap and their earlier tool calls well formed (a constructed request
        too: ``build`` checks the loose arguments before it compiles anything)."""
        if self.text is not None:
            check_text(self.text, "prompt")
        if self.messages is not None:
            check_messages(self.messages)
        if self.chat_template_kwargs is not None:
            check_text(self.chat_template_kwargs, "chat_template_kwargs")
        check_text(self.continuations, "continuations")

    @classmethod
    def build(cls, defaults: SamplingParams, *, prompt: Prompt | None = None, messages: Messages | None = None,
              n: int = 1, request_id: str | None = None, priority: Any = DEFAULT_PRIORITY, tools: Any = None,
              tool_choice: Any = None, parallel_tool_calls: bool | None = None, json_schema: Any = None,
              grammar: Grammar | str | None = None, echo: bool = False,
              chat_template_kwargs: Mapping[str, Any] | None = None, continuations: Sequence[Prompt] = (),
              echo_prompt: bool = False, clamp_max_tokens: bool = False, tenant: Tenant = DEFAULT,
              lora: Mapping[str, float] | None = None, adapters: Sequence[str] | None = None,
              tool_format: ToolCallFormat | None = None, split_reasoning: bool | None = None,
              parse_special: bool = True, label_token_ids: Sequence[Sequence[int]] | None = (),
              **sampling: Any) -> GenerationRequest:
        """The one place loose arguments become a request: ``prompt`` (text or token ids) or
        ``messages``; ``json_schema`` / ``grammar`` compiled; OpenAI-style ``tools`` /
        ``tool_choice`` (or a ``Tools``) checked and, for a required or named choice, turned into
        the grammar, in ``tool_format`` (the model's: ``EngineInfo.tool_format``; None: the
        Hermes fallback, or a given ``Tools``' own); ``echo`` (OpenAI's legacy name) into
        ``prompt_logprobs``; ``lora`` (``{adapter name: scale}``) checked against ``adapters``, the
        model's adapter names, when given; ``split_reasoning``, ``parse_special`` and
        ``label_token_ids`` (``max_tokens`` then defaults to 0) as the fields say; every other name
        a ``SamplingParams`` field applied over ``defaults``."""
        chat = messages is not None
        fields = {"messages": messages_tuple(messages)} if chat else prompt_fields(prompt)
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise InvalidRequestError("chat_template_kwargs must be a mapping of template variables")
        if chat:  # before tools and grammars are compiled (the rest of check_messages runs in __post_init__)
            check_message_count(fields["messages"])
        constraint = _constraint(json_schema, grammar)
        parsed_tools = _tools(tools, tool_choice, parallel_tool_calls, chat)
        if parsed_tools is not None and tool_format is not None:
            parsed_tools = parsed_tools.in_format(tool_format)
        if parsed_tools is not None and (tool_grammar := parsed_tools.grammar()) is not None:
            if constraint is not None:
                raise InvalidRequestError("a required or named tool_choice cannot be combined with json_schema or grammar")
            constraint = tool_grammar
        sampling = _echo_options(sampling) if echo else sampling
        none = label_token_ids is None or (isinstance(label_token_ids, (tuple, list)) and not label_token_ids)
        labels = () if none else label_groups(label_token_ids)
        if labels:
            sampling.setdefault("max_tokens", 0)
        params = defaults.replace(**sampling, **({"grammar": constraint} if constraint is not None else {}))
        return cls(params=params, n=n, tools=parsed_tools, priority=tenant.priority(parse_priority(priority)),
                   chat_template_kwargs=dict(chat_template_kwargs) if chat_template_kwargs else None,
                   continuations=tuple(continuation_field(c) for c in continuations), request_id=request_id,
                   echo_prompt=echo_prompt, clamp_max_tokens=clamp_max_tokens, lora=adapter_set(lora, adapters),
                   split_reasoning=split_reasoning, parse_special=parse_special,
                   label_token_ids=labels,
                   tenant=tenant, **fields)  # as for_tenant makes it, without checking it all twice

    def for_tenant(self, tenant: Tenant) -> GenerationRequest:
        """This request made by ``tenant``: its priority no more urgent than the tenant's ceiling."""
        return dataclasses.replace(self, tenant=tenant, priority=tenant.priority(self.priority))

    @property
    def parsed_tools(self) -> Tools | None:
        """The tools when answers are parsed for calls (not ``tool_choice: none``)."""
        return self.tools if self.tools is not None and self.tools.parses else None

    @property
    def splits_reasoning(self) -> bool:
        return self.split_reasoning if self.split_reasoning is not None else self.messages is not None

    def generate_messages(self, request_id: str, replies: Sequence[ReplyChannel], submitted_at: float) -> list[Generate]:
        """One ``Generate`` per choice: choice ``i`` is ``<request_id>-<i>`` (the id itself when
        ``n`` is 1), seeded ``seed + i``, scoring ``continuations[i]``."""
        seed = self.params.seed  # choice i: seed + i, wrapping around below 2**64 (the largest seed)
        return [Generate(request_id=choice_request_id(request_id, i, self.n), reply=reply, submitted_at=submitted_at,
                         priority=self.priority, tools=self.tools, text=self.text, messages=self.messages,
                         token_ids=self.token_ids,
                         params=self.params.replace(seed=(seed + i) % SEED_LIMIT) if seed is not None and i else self.params,
                         chat_template_kwargs=dict(self.chat_template_kwargs) if self.chat_template_kwargs else None,
                         continuation=self.continuations[i] if self.continuations else None,
                         echo_prompt=self.echo_prompt, clamp_max_tokens=self.clamp_max_tokens, tenant=self.tenant,
                         lora=self.lora, split_reasoning=self.splits_reasoning, parse_special=self.parse_special,
                         label_token_ids=self.label_token_ids)
                for i, reply in enumerate(replies)]


def admitted_sampling(msg: Generate, turn_stops: tuple[str, ...], n_prompt: int, n_ctx_seq: int) -> SamplingParams:
    """The sampling choice ``msg`` runs with, final: its own, a chat also stopping at the chat
    format's ``turn_stops`` (a base model would otherwise write the user's next line too), and
    ``max_tokens`` fitted to the per-sequence context (batcher thread, at admission).

    It fits if the prompt and ``max_tokens`` do; with ``clamp_max_tokens``, max_tokens is cut to
    the room the prompt leaves (``Completion.clamped_max_tokens`` reports it); else (or if the
    prompt alone fills the context) ``ContextExceededError``, with the counts a client needs."""
    params = msg.params
    extra = tuple(s for s in turn_stops if s not in params.stop) if msg.messages is not None else ()
    max_tokens = _fitted_max_tokens(msg, n_prompt, n_ctx_seq)
    if extra or max_tokens != params.max_tokens:
        params = params.replace(stop=params.stop + extra, max_tokens=max_tokens)
    return params


def _fitted_max_tokens(msg: Generate, n_prompt: int, n_ctx_seq: int) -> int | None:
    max_tokens = msg.params.max_tokens
    if n_prompt + (max_tokens or 1) <= n_ctx_seq:
        return max_tokens
    if msg.clamp_max_tokens:
        if n_prompt >= n_ctx_seq:
            raise ContextExceededError(f"prompt is too long: {n_prompt} tokens > {n_ctx_seq - 1} maximum",
                                       n_prompt_tokens=n_prompt, n_ctx=n_ctx_seq)
        room = n_ctx_seq - n_prompt
        log.info("max_tokens_clamped", max_tokens=max_tokens, to=room, n_prompt=n_prompt, n_ctx=n_ctx_seq)
        return room
    asked = f" + max_tokens ({max_tokens})" if max_tokens else ""
    raise ContextExceededError(
        f"prompt ({n_prompt} tokens){asked} exceeds the per-sequence context of {n_ctx_seq} tokens",
        n_prompt_tokens=n_prompt, n_ctx=n_ctx_seq)


# -- loose arguments -------------------------------------------------------------------------

def prompt_fields(prompt: Prompt | None) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        return {"token_ids": tuple(prompt)}
    raise InvalidRequestError("prompt must be a string or a sequence of token ids")


def messages_tuple(messages: Messages | None) -> tuple[dict[str, Any], ...]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be a {{'role': ..., 'content': ...}} dict, "
                                      f"got {type(m).__name__}", param=f"messages[{i}]")
    return tuple(dict(m) for m in messages)


def continuation_field(c: Prompt) -> Continuation:
    if isinstance(c, str):
        if not c:
            raise InvalidRequestError("a continuation must not be empty")
        return c
    return prompt_fields(c)["token_ids"]  # type: ignore[no-any-return]


def _constraint(json_schema: Any, grammar: Grammar | str | None) -> Grammar | None:
    """``json_schema=`` (a dict, JSON text, pydantic model class or ``Grammar``) or ``grammar=``
    (a ``Grammar`` or GBNF / Lark text), compiled."""
    if json_schema is not None and grammar is not None:
        raise InvalidRequestError("pass json_schema= or grammar=, not both")
    if json_schema is not None:
        return json_schema if isinstance(json_schema, Grammar) else Grammar.json_schema(json_schema)
    return Grammar.coerce(grammar) if grammar is not None else None


def _tools(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None, chat: bool) -> Tools | None:
    """OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` (or a ``Tools``) checked."""
    if tools is None or (isinstance(tools, Sequence) and not tools):
        if tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools")
        return None
    if not chat:
        raise InvalidRequestError("tools need a chat (messages), not a raw prompt")
    return tools if isinstance(tools, Tools) else Tools.from_openai(tools, tool_choice, parallel_tool_calls)


def _echo_options(sampling: dict[str, Any]) -> dict[str, Any]:
    """``echo=True`` with ``logprobs``: the prompt's logprobs too, with as many alternatives per
    token as the generated tokens get."""
    logprobs = sampling.get("logprobs")
    if not logprobs and not sampling.get("top_logprobs"):
        raise InvalidRequestError("echo=True reports the prompt's log-probabilities: pass logprobs=k as well")
    def count(value: Any) -> int:  # a value of the wrong type is SamplingParams' 400 to say
        return value if isinstance(value, int) and not isinstance(value, bool) else 0
    return {"prompt_logprobs": max(count(logprobs), count(sampling.get("top_logprobs"))), **sampling}
