"""Messages between callers, the supervisor and the batcher.

Every message is a frozen dataclass; those about one request carry its ``request_id``. The
mutable part of a request -- where its answer goes -- is the ``ReplyChannel`` it points to,
shared by the caller's thread (which waits on it) and the batcher's thread (which fills it).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.adapters import AdapterSet
from llamactor.base.completion import Completion, Embeddings, Parts, Piece, Tokenized, TokenizedTexts, TokenLogprob
from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import LlamactorError, ModelLoadError
from llamactor.base.priority import DEFAULT_PRIORITY
from llamactor.base.rank_pairs import RankPairs
from llamactor.base.tenants import DEFAULT, Tenant
from llamactor.base.tools import Tools


@dataclass(slots=True, eq=False)
class ReplyChannel:
    """Where one request's pieces and final result go. Filled by the batcher thread only."""

    # resolves to a Completion (Generate), Embeddings (Embed) or Tokenized (Tokenize)
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    # Done once the batcher has tokenized and queued the request, or failed with why it refused it:
    # a stream awaits it before answering 200, so a refused stream gets the same 4xx as a plain call.
    queued: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    on_piece: Callable[[Piece], None] | None = None  # streaming callers get each text piece here
    n_pieces_sent: int = 0  # > 0: the caller has seen text (only a resume can go on invisibly)
    # How far a generation got on the batcher that runs it; a new batcher resumes it from here.
    progress: Progress | None = None
    # True once ``future`` is done (its caller cancelled it, or it was answered), set by the
    # future's done-callback on whichever thread completes it: the batcher checks each running
    # request every step, and ``future.done()`` takes the future's lock each time.
    done: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._on_done)

    def _on_done(self, _future: concurrent.futures.Future[Any]) -> None:
        """Any thread: the one that completes the future."""
        self.done = True

    def __reduce__(self) -> tuple[type[ReplyChannel], tuple[()]]:
        """A message sent to another process (a Ray Serve replica) arrives with an empty channel:
        futures and callbacks stay where they were; the receiver gives the message its own."""
        return ReplyChannel, ()

    def send_piece(self, text: str, logprobs: tuple[TokenLogprob, ...] = (), parts: Parts | None = None, *,
                   last: bool = False) -> bool:
        """Stream ``text`` (with the logprobs of the tokens it completes, and its answer's parts);
        False if it is empty and so was not sent (its logprobs then go with the next piece). The
        ``last`` piece of a request goes without text when it has logprobs: no later piece would
        carry them (the tokens of a stop string, or of a control token, never become text)."""
        if not text and not (last and logprobs):
            return False
        if self.on_piece is not None:
            self.hand_on(Piece(text, logprobs, parts))
        return True

    def hand_on(self, piece: Piece) -> None:
        """Stream ``piece`` as it was made where it was sent (a front end's link: the engine's
        ``send_piece`` already decided it goes, a last piece of logprobs alone included)."""
        if self.on_piece is None:
            return
        self.n_pieces_sent += 1
        try:
            self.on_piece(piece)
        except Exception:  # noqa: BLE001 - e.g. the caller's event loop is closed
            # A broken consumer must not crash the batcher that serves everyone else:
            # cancel this request instead (the batcher sees the cancelled future).
            self.on_piece = None
            self.future.cancel()

    def mark_queued(self) -> None:
        if not self.queued.done():
            self.queued.set_result(None)

    def resolve(self, result: Completion | Embeddings | Tokenized | TokenizedTexts) -> None:
        self.mark_queued()
        if not self.future.done():
            self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        if not self.queued.done():
            self.queued.set_exception(error)
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True, eq=False)
class Progress:
    """A generation request's checkpoint: enough for a new batcher to resume it where its caller is
    after the one running it crashed -- the prompt's token ids, the tokens generated (and so
    streamed) after it, the sampler's random state after the last of them, their logprobs.

    Written by the batcher thread after each token it accepts; read by the next batcher only, once
    the writer has died (the supervisor replays the request after ``BatcherFailed``). What the
    rest of the state is -- the grammar matcher, the text held back for stop strings, the penalty
    window -- follows from the generated tokens, so the reader rebuilds it by replaying them.
    """

    prompt_ids: tuple[int, ...]
    generated: list[int] = field(default_factory=list)
    rng_state: Mapping[str, Any] | None = None  # the numpy Generator's bit_generator.state (sampled requests)
    graph_seed: int | None = None  # the seed of a request sampled inside the graph (its draws: one per token)
    logprobs: list[TokenLogprob] | None = None  # shared with the request's state; may run one token ahead
    n_cached: int = 0  # prompt tokens the first admission attached from the prefix cache (usage)
    n_preempted: int = 0
    n_resumed: int = 0  # batchers that resumed it so far
    n_draft_accepted: int = 0  # drafted tokens taken so far (usage: accepted_prediction_tokens)
    n_draft_rejected: int = 0  # drafted tokens computed and not taken so far
    admitted_at: float | None = None
    first_token_at: float | None = None
    # ("preempted" | "restarted", perf_counter) as they happened: its trace span's events
    marks: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Generate:
    """Caller -> supervisor -> batcher: complete a prompt and answer on ``reply``.

    One choice of a ``GenerationRequest`` (``llamactor.base.request``), which checked its fields:
    the prompt is exactly one of ``text`` (raw completion), ``messages`` (chat template applied)
    or ``token_ids``, tokenized by the batcher, which alone calls into llama.cpp.
    """

    request_id: str
    params: SamplingParams
    reply: ReplyChannel
    submitted_at: float  # time.perf_counter() when the caller submitted
    priority: int = DEFAULT_PRIORITY  # lower runs first; see llamactor.scheduling.policy
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    token_ids: tuple[int, ...] | None = None
    tools: Tools | None = None  # a chat's tools: rendered into its prompt, calls parsed from its answer
    chat_template_kwargs: dict[str, Any] | None = None  # a chat's extra template variables (enable_thinking ...)
    # Scoring (``Client.score``): appended to the prompt, tokenized on its own (no BOS), and only its
    # tokens' log-probabilities are computed (``params.prompt_logprobs`` is set).
    continuation: str | tuple[int, ...] | None = None
    # Label scoring: no token sampled; the prompt's last row gives each group's share of
    # probability (``Completion.label_probs``; checked by ``GenerationRequest``, ids by the batcher).
    label_token_ids: tuple[tuple[int, ...], ...] = ()
    echo_prompt: bool = False  # the Completion carries the prompt as text (``prompt_text``)
    clamp_max_tokens: bool = False  # max_tokens beyond the context's room is cut to it, not refused
    tenant: Tenant = DEFAULT  # whose: the caches it may hit (its scope), its fair share
    lora: AdapterSet = ()  # the LoRA adapters (name, scale) it runs under; (): the base model
    split_reasoning: bool = False  # its answer's <think> block split from its content (llamactor.base.answer)
    parse_special: bool = True  # special-token text in a raw ``text`` prompt is those tokens (not in messages)


POOLINGS = ("mean", "cls", "last")
MAX_EMBEDDING_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class Embed:
    """Caller -> supervisor -> batcher: embed ``inputs`` (texts or token-id tuples), answer on
    ``reply`` with an ``Embeddings``. Built from an ``EmbeddingRequest``, which checked its fields.
    ``pooling`` None: the model's own, else mean."""

    request_id: str
    inputs: tuple[str | tuple[int, ...], ...]
    reply: ReplyChannel
    submitted_at: float
    pooling: str | None = None
    normalize: bool = True
    dimensions: int | None = None  # keep the first ``dimensions`` components (then renormalize)
    truncate: bool = False  # an input longer than one embedding step is cut to it instead of refused
    tenant: Tenant = DEFAULT
    # Rank pooling only: (query, document) pairs the batcher lays out with the model's vocabulary
    # and rerank template, one input per document (``inputs`` then empty)
    pairs: RankPairs | None = None


@dataclass(frozen=True, slots=True)
class Tokenize:
    """Caller -> supervisor -> batcher: what the model sees of a prompt, answered on ``reply`` with a
    ``Tokenized``. Exactly one of ``text`` (tokenized), ``parts`` (strings tokenized and token ids
    kept, joined: llama-server's mixed ``content``), ``messages`` (rendered by the model's chat
    format, with ``tools``, then tokenized), ``token_ids`` (decoded) or ``texts``: plain texts,
    each ``(text, add_special, parse_special)``, answered with a ``TokenizedTexts`` (a ``Tokenized``
    per text) in one trip: a rerank's query and documents are one message, not one per document."""

    request_id: str
    reply: ReplyChannel
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    token_ids: tuple[int, ...] | None = None
    parts: tuple[str | int, ...] | None = None
    tools: Tools | None = None
    add_special: bool = True  # text: add BOS as the model's tokenizer does (parts: before the first)
    parse_special: bool = True  # text: special-token text read as those tokens (off: as plain text)
    with_pieces: bool = False  # also each token's text
    chat_template_kwargs: dict[str, Any] | None = None
    texts: tuple[tuple[str, bool, bool], ...] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.text, self.messages, self.token_ids, self.parts, self.texts)) != 1:
            raise ValueError("Tokenize needs exactly one of text, parts, messages, token_ids, texts")


CallerMessage = Generate | Embed | Tokenize  # the messages a caller sends, kept in flight by the supervisor


@dataclass(frozen=True, slots=True)
class PromptPrepared:
    """The batcher's preparation pool -> batcher: ``request``'s prompt, rendered and tokenized off
    the batcher thread. ``result``: for a ``Generate`` its token ids and where its continuation
    starts, for a ``Tokenize`` its ``Tokenized`` (``TokenizedTexts`` for ``texts``); or ``error``, why it
    cannot be run."""

    request: Generate | Tokenize
    result: tuple[list[int], int] | Tokenized | TokenizedTexts | None = None
    error: LlamactorError | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Caller -> supervisor -> batcher: end ``request_id`` now and free its seq_id."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Step:
    """Batcher -> itself: run one decode step. At most one is in the inbox at a time."""


@dataclass(frozen=True, slots=True)
class FlushDue:
    """Batcher's window timer -> batcher: the oldest pending request has waited batch_timeout_ms."""

    timer_id: int


@dataclass(frozen=True, slots=True)
class GetStats:
    """Asked (not told) of the batcher, by ``LLM.stats()``: a dict snapshot of its counters."""


@dataclass(frozen=True, slots=True)
class AuditKv:
    """Asked of the batcher (tests, debugging): where its prefix index and llama.cpp's cells differ."""


@dataclass(frozen=True, slots=True)
class InjectCrash:
    """Fault injection (tests, the benchmark's crash workload) -> batcher: fail now, as a bug would."""


@dataclass(frozen=True, slots=True)
class Forget:
    """Caller's future callback -> supervisor: ``request_id`` is done, drop it from in-flight."""

    request_id: str


@dataclass(frozen=True, slots=True)
class BatcherFailed:
    """Batcher -> supervisor, from ``on_failure``: it is dying; restart it. ``suspects``: the
    requests it was handling when it died (the message in hand, or the sequences of the step that
    failed); none when the failure was no request's (an injected crash, a failed start)."""

    generation: int
    reason: str
    watchdog: bool = False  # the watchdog aborted a hung step
    suspects: tuple[str, ...] = ()
    # A failed start's error when it is the model's (a file llama.cpp refuses, more sequences than
    # it holds): what ``start`` raises, its type kept.
    load_error: ModelLoadError | None = None


@dataclass(frozen=True, slots=True)
class BatcherReady:
    """Batcher -> supervisor, at the end of ``on_start``: the model is loaded, here is its info."""

    generation: int
    info: EngineInfo


@dataclass(frozen=True, slots=True)
class RestartBatcher:
    """Supervisor's backoff timer -> supervisor: start a new batcher now."""

    generation: int
