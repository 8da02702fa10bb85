"""Prompt preparation off the batcher thread: chat templates rendered and texts tokenized on a
small pool, so that a long prompt never holds up the steps that stream everyone else's tokens.

The batcher owns the pool, as it owns the ``Engine`` whose vocabulary the workers read
(llama.cpp's tokenizer is safe to call from several threads on one vocabulary: it only reads
it). ``submit`` (batcher thread) prepares a small generation's prompt at once (at most
``INLINE_CHARS`` characters: a few milliseconds, and no hop that would cost it a step) and hands
any other ``Generate`` or ``Tokenize`` to a worker; the worker
tells the batcher ``PromptPrepared`` with the prompt's token ids or the typed error, so the
batcher only ever handles ready token ids; ``close`` (batcher thread, before ``engine.close()``)
drops what has not started and waits for what has, so no tokenize runs on a freed model. A
request cancelled while it is prepared is answered at once and its result dropped.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pykka
import structlog

from llamactor.base.errors import CancelledError, LlamactorError
from llamactor.base.logging import get_logger
from llamactor.base.messages import Generate, PromptPrepared, Tokenize
from llamactor.tree.draft_rows import prediction_ids
from llamactor.tree.prompt_tokens import PromptBuilder
from llamactor.tree.request_state import request_error
from llamactor.tree.tell import tell_quietly

log = get_logger("llamactor.batcher")

PREP_THREADS = 2  # tokenizing runs outside the GIL, rendering a template inside it: a few suffice
# A generation whose prompt is at most this many characters (at most this many messages, no tools)
# is prepared on the batcher thread itself: a few milliseconds at worst (tokenizing is linear, about
# 1.5 ms per KB on the densest text), and no hop to the pool and back, which costs a request one
# whole step of latency when it arrives while others run (interactive TTFT beside a batch job).
INLINE_CHARS = 1024
INLINE_MESSAGES = 16

Prepared = Generate | Tokenize


class PromptPrep:
    """The batcher's preparation pool, and the requests it is preparing (batcher thread only)."""

    def __init__(self, prompts: PromptBuilder, batcher: pykka.ActorRef[Any], n_ctx_seq: int,
                 n_threads: int = PREP_THREADS) -> None:
        self._prompts = prompts
        self._batcher = batcher
        self._n_ctx_seq = n_ctx_seq
        self._pool = ThreadPoolExecutor(n_threads, thread_name_prefix="llamactor-prep")
        self._waiting: dict[str, Prepared] = {}

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, msg: Prepared) -> PromptPrepared | None:
        """Batcher thread: a small generation's prompt prepared at once (returned); any other
        prepared on the pool, and ``PromptPrepared`` comes back to the batcher (None)."""
        if isinstance(msg, Generate) and small_prompt(msg):
            return self._prepared(msg)
        self._waiting[msg.request_id] = msg
        self._pool.submit(self._prepare, msg)
        return None

    def cancel(self, request_id: str) -> bool:
        """Batcher thread: answer a request still being prepared with ``CancelledError`` (it has
        generated nothing); False if none is."""
        msg = self._waiting.pop(request_id, None)
        if msg is None:
            return False
        msg.reply.fail(CancelledError(f"request {request_id} was cancelled"))
        log.info("request_cancelled_in_preparation")
        return True

    def take(self, done: PromptPrepared) -> bool:
        """Batcher thread: whether to go on with a prepared request (not cancelled meanwhile)."""
        msg = done.request
        if self._waiting.get(msg.request_id) is msg:
            del self._waiting[msg.request_id]
        return not msg.reply.future.done()

    def close(self) -> None:
        """Batcher thread, before the engine is closed: requests not started are dropped (the
        supervisor replays what is in flight on the next batcher), those started are waited for."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._waiting.clear()

    def _prepare(self, msg: Prepared) -> None:
        """Pool thread: prepare ``msg`` and tell the batcher."""
        tell_quietly(self._batcher, self._prepared(msg))

    def _prepared(self, msg: Prepared) -> PromptPrepared:
        """Pool thread, or the batcher's for a small prompt: the prompt's token ids, its
        n_context and its prediction's token ids (None without one), or why not;
        any error fails this request alone."""
        with structlog.contextvars.bound_contextvars(request_id=msg.request_id):
            result: Any = None
            error: LlamactorError | None = None
            if not msg.reply.future.done():  # cancelled by its caller while it waited: no work
                try:
                    result = (self._prompts.inspect(msg) if isinstance(msg, Tokenize)
                              else (*self._prompts.prompt_tokens(msg, self._n_ctx_seq),
                                    prediction_ids(msg.params, self._prompts.tokenizer)))
                except LlamactorError as e:
                    error = e
                except Exception as e:  # noqa: BLE001 - our bug, or the template's: this request's 500
                    error = request_error(msg, e, "preparing its prompt")  # RequestFailedError, logged once
            return PromptPrepared(msg, result, error)


def small_prompt(msg: Generate) -> bool:
    """Whether ``msg``'s prompt is cheap enough to prepare on the batcher thread (token ids always
    are); counted without walking more than ``INLINE_MESSAGES`` messages."""
    if msg.params.prediction is not None and len(msg.params.prediction) > INLINE_CHARS:
        return False  # its prediction is tokenized with its prompt
    if msg.token_ids is not None:
        return True
    if msg.text is not None:
        return len(msg.text) + _chars(msg.continuation) <= INLINE_CHARS
    messages = msg.messages or ()
    if msg.tools is not None or len(messages) > INLINE_MESSAGES:
        return False
    return sum(_chars(m.get("content")) for m in messages) <= INLINE_CHARS


def _chars(content: Any) -> int:
    """A message content's characters (text parts of a list counted; anything else as too many)."""
    if content is None or isinstance(content, tuple):  # no content, or a scored continuation's ids
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list) and len(content) <= INLINE_MESSAGES:
        return sum(len(p.get("text", "")) if isinstance(p, dict) and isinstance(p.get("text", ""), str)
                   else INLINE_CHARS + 1 for p in content)
    return INLINE_CHARS + 1
