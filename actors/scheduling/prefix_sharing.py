"""Whether a waiting request should let a running one compute what they share first (pure: no
threads, no I/O; the scheduler asks on the batcher's thread before admitting a request).

Concurrent requests with one prefix -- ``n`` choices of a prompt, a few-shot block, lm-eval's
choices of one question -- compute it once: the others wait while it is computed, then attach
its cells from the prefix index (and its prompt scores from the ``ScoreCache``).
"""

from __future__ import annotations

from llamactor.scheduling.kv_nodes import common_prefix_len
from llamactor.scheduling.sequence import Sequence

SCORE_SHARE_MIN_ROWS = 4  # a scoring prompt waits for another's rows when it would reuse this many
LABEL_SHARE_MIN_TOKENS = 4  # a label sequence waits for a shared prompt of at least this many tokens


def waits_for_prefix(seq: Sequence, reusable: list[int], n_matched: int, running: list[Sequence],
                     share_min_tokens: int) -> bool:
    """A running sequence of ``seq``'s scope still prefilling will soon hold more of ``reusable``
    than the cache's ``n_matched`` tokens: at least ``share_min_tokens`` more, or all of it -- or,
    for a label sequence, an eighth of what it would compute (at least ``LABEL_SHARE_MIN_TOKENS``):
    a rerank's documents share a judging prompt and query that may be short, and a step's wait
    costs such throughput work little (the step's token budget is often full anyway)."""
    if n_matched >= len(reusable):
        return False
    enough = share_min_tokens
    if seq.labels:
        enough = min(enough, max(LABEL_SHARE_MIN_TOKENS, (len(seq.token_ids) - n_matched) // 8))
    for other in running:
        if other.n_past < other.n_prompt and other.scope == seq.scope:
            shared = min(common_prefix_len(reusable, other.token_ids), other.n_prompt)
            gain = shared - n_matched
            if gain > 0 and (gain >= enough or shared == len(reusable)):
                return True
    return False


def waits_for_scores(seq: Sequence, running: list[Sequence]) -> bool:
    """A scoring sequence waits while a running one of its scope computes the rows of a prefix
    they share: those rows then come from the ScoreCache, and the KV behind them from the prefix
    cache (lm-eval sends a question's choices as separate requests, all at once)."""
    if seq.scoring is None or seq.scoring.done:
        return False
    for other in running:
        if other.scoring is not None and not other.scoring.done and other.scope == seq.scope \
                and other.scoring.can_fill(seq.scoring):
            known_then = min(common_prefix_len(seq.token_ids, other.token_ids), other.n_prompt) - 1
            if known_then - seq.scoring.next_row >= SCORE_SHARE_MIN_ROWS:
                return True
    return False
