"""The result of one request: ``Completion`` with its ``Usage`` and ``Timings``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "context_full", "tool_calls"]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV was attached from the prefix cache, not computed
    # Drafted tokens (a prediction's or n-gram lookup's) the model agreed with, and those it did not
    # (OpenAI's completion_tokens_details; rejected ones were computed, so quotas count them).
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    queue_ms: float  # submit -> admitted to a sequence
    ttft_ms: float  # submit -> first token sampled
    total_ms: float  # submit -> finished
    decode_tokens_per_s: float  # generated tokens after the first, per second


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its text, its log-probability, and the most likely alternatives."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    # prompt tokens (``prompt_logprobs``): the token's id, the alternatives' ids (as in ``top``), and
    # its rank in the distribution (1: the most likely)
    token_id: int = -1
    top_ids: tuple[int, ...] = ()
    rank: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class Embeddings:
    """The result of ``LLM.embed``: one vector per input, in order (iterable and indexable)."""

    request_id: str
    vectors: Any  # numpy float32 array [n_inputs, dimensions]
    pooling: str  # "mean" | "cls" | "last"
    prompt_tokens: int
    total_ms: float
    n_steps: int  # embedding steps its inputs were computed in (shared with other callers' inputs)

    def __len__(self) -> int:
        return len(self.vectors)

    def __getitem__(self, i: int) -> Any:
        return self.vectors[i]

    def __iter__(self) -> Any:
        return iter(self.vectors)


@dataclass(frozen=True, slots=True)
class Parts:
    """What one piece (or the end of an answer) adds to it: reasoning, content, whole tool calls
    (split by ``llamactor.base.answer.AnswerSplitter``)."""

    reasoning: str = ""
    content: str = ""
    calls: list[Any] = field(default_factory=list)  # llamactor.base.tools.ToolCall

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


@dataclass(frozen=True, slots=True)
class Answer:
    """A finished answer's parts, as a front end renders them."""

    reasoning: str | None  # None: the model did not reason (or its request did not ask it split)
    content: str
    calls: tuple[Any, ...]  # llamactor.base.tools.ToolCall


@dataclass(frozen=True, slots=True)
class Piece:
    """One streamed piece of text, with the tokens it completes when logprobs were asked for.

    Text is held back while it might become a stop string or splits a UTF-8 character, so a
    piece may carry several tokens, and a token's logprob arrives with the piece its text ends in;
    a token whose text never streams (a stop string's, a control token's) with the request's last
    piece, which then may have no text of its own.
    ``parts``: what the text adds to the answer's reasoning, content and tool calls, when its
    request has its answer split (a chat; ``llamactor.base.answer``); None: all of it is content."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    parts: Parts | None = None

    @property
    def split(self) -> Parts:
        """``parts``, or the text as content when the request has its answer not split."""
        return self.parts if self.parts is not None else Parts(content=self.text)


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of one choice: its text and token ids, why it ended, usage and timings, and what
    the request asked to have back (logprobs, the prompt's scores or text, parsed output, calls)."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, if asked
    # With ``prompt_logprobs`` (or ``echo=True`` and logprobs): the prompt's token ids, and per prompt
    # token its log-probability given the tokens before it (None where not computed: the first token,
    # and a scored prompt's context).
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    prompt_pieces: tuple[str, ...] | None = None  # each prompt token's text (echo), with the above
    # With ``label_token_ids``: each group's share of the probability at the prompt's last position
    # (the groups' summed probabilities, normalized over the groups; rerank's P(yes) is [0]).
    label_probs: tuple[float, ...] | None = None
    # json_schema given as a pydantic model: the validated object (None if the output was cut
    # short by max_tokens or failed validation; see ``parse_error``).
    parsed: Any = None
    parse_error: str | None = None
    # A chat with tools: the calls read out of the answer (``text`` is then what is left around
    # them, ``raw_text`` the whole answer) and finish_reason "tool_calls".
    tool_calls: tuple[Any, ...] = ()  # llamactor.base.tools.ToolCall
    raw_text: str | None = None
    # A chat's answer as the one splitter (``llamactor.base.answer``) split it on the batcher: its
    # reasoning, content and calls, what front ends render; and ``last_parts``, what the splitter
    # held back until the answer ended (a stream's last parts). None: the answer is not split.
    answer: Answer | None = None
    last_parts: Parts | None = None
    # The stop string that ended the answer (the request's, or the chat format's turn marker);
    # None when it ended otherwise (end of generation, max_tokens ...).
    stop_sequence: str | None = None
    prompt_text: str | None = None  # with ``echo_prompt``: the prompt's tokens as text
    clamped_max_tokens: int | None = None  # with ``clamp_max_tokens``: the room max_tokens was cut to

    @property
    def split(self) -> Answer:
        """``answer``, or (an answer not split) the text as content with its tool calls."""
        return self.answer if self.answer is not None else Answer(None, self.text, tuple(self.tool_calls))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["usage"]["total_tokens"] = self.usage.total_tokens
        return data


@dataclass(frozen=True, slots=True)
class Score:
    """How likely one continuation is after a context (``Client.score``): lm-evaluation-harness's
    ``loglikelihood``. ``logprob`` sums the continuation tokens' log-probabilities; ``is_greedy``:
    every one of them was the most likely token at its position (greedy decoding would write it)."""

    logprob: float
    is_greedy: bool
    token_logprobs: tuple[float, ...]
    n_context_tokens: int
    request_id: str = ""

    @classmethod
    def of(cls, completion: Completion) -> Score:
        """The score of a completion whose prompt was scored from its continuation on."""
        scored = [t for t in completion.prompt_logprobs or () if t is not None]
        n_prompt = len(completion.prompt_token_ids or ())
        # is_greedy compares values, as lm-eval does: the chosen token's logprob and the top one's are
        # computed by the same operations, so they are equal exactly when it is (or ties) the argmax.
        return cls(logprob=sum(t.logprob for t in scored), is_greedy=all(t.top and t.logprob >= t.top[0][1] for t in scored),
                   token_logprobs=tuple(t.logprob for t in scored), n_context_tokens=n_prompt - len(scored),
                   request_id=completion.request_id)


@dataclass(frozen=True, slots=True)
class Tokenized:
    """What the model sees of a prompt: its token ids, its text (a chat as the chat format renders
    it, or token ids decoded), and each token's text when asked (``pieces``)."""

    token_ids: tuple[int, ...]
    text: str
    pieces: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class TokenizedTexts:
    """What the model sees of several plain texts asked in one trip (``Tokenize.texts``): a
    ``Tokenized`` per text, in their order."""

    each: tuple[Tokenized, ...]


# What a stream of ``n`` choices yields, merged (``llamactor.handles.streams.merged``): the index of
# a choice and its next text piece, then, once, the index and its finished Completion. The event
# sequences of the HTTP dialects (``llamactor.dialects``) are written over these.
ChoiceUpdate = tuple[int, Piece | Completion]
