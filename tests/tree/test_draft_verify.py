"""The verification rule on fixed logits rows (pure: a stand-in tokenizer, no model): a drafted
run emits exactly the tokens, logprobs and generator state that drawing the same rows one at a
time does, and sampled acceptance keeps the sampler's distribution. The real-model tests are
test_speculation.py's."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from scipy.stats import chisquare

from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from llamactor.scheduling.sequence import Sequence
from llamactor.tree.draft_verify import DraftVerifier
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.request_state import start_sequence

N_VOCAB = 8
SAMPLED = SamplingParams(temperature=0.9, seed=5, presence_penalty=0.7, logprobs=True, top_logprobs=2,
                         top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)


class ByteTokenizer:
    """Eight one-letter tokens, none of them EOG."""

    n_vocab = N_VOCAB

    def token_bytes(self, token: int) -> bytes:
        return b"abcdefgh"[token:token + 1]

    def token_text(self, token: int) -> str:
        return self.token_bytes(token).decode()

    def is_eog(self, token: int) -> bool:
        return False


@dataclass
class Kv:
    """Stands in for the scheduler and the context: what verification settles."""

    verified: list[tuple[int, int]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    def drafts_verified(self, seq: Sequence, n_drafted: int, n_accepted: int, now: float) -> None:
        self.verified.append((n_drafted, n_accepted))
        seq.n_past += n_accepted

    def seq_rm(self, seq_id: int, p0: int) -> None:
        self.removed.append(p0)


def new_sequence(params: SamplingParams) -> Sequence:
    msg = Generate(request_id="r", params=params, submitted_at=0.0, text="x", reply=ReplyChannel())
    seq = start_sequence(msg, [1, 2, 3], 3, params, ByteTokenizer())  # type: ignore[arg-type]
    seq.seq_id, seq.n_past = 0, 3
    return seq


def one_at_a_time(rows: np.ndarray, params: SamplingParams) -> tuple[list[int], Sequence]:
    """Each row drawn after the token before it was accepted: undrafted decoding."""
    seq, sampler = new_sequence(params), GrammarSampler(N_VOCAB)
    for row in rows:
        one = sampler.sample(row[None].copy(), [seq.state.row_spec(seq.token_ids)], [None])
        seq.state.accept(seq, one.tokens[0], one.logprobs[0], one.top[0], ByteTokenizer(), 100)  # type: ignore[arg-type]
    return seq.token_ids[3:], seq


def drafted_run(rows: np.ndarray, drafts: tuple[int, ...], params: SamplingParams) -> tuple[Sequence, Kv, str | None]:
    """Row 0 drawn as the step draws it, the draft rows verified."""
    seq, sampler, kv = new_sequence(params), GrammarSampler(N_VOCAB), Kv()
    logits = rows.copy()
    first = sampler.sample(logits[:1].copy(), [seq.state.row_spec(seq.token_ids)], [None])
    verifier = DraftVerifier(sampler, kv, kv.seq_rm, ByteTokenizer(), 100,  # type: ignore[arg-type]
                             {"tokens_generated": 0, "draft_tokens": 0, "accepted_draft_tokens": 0,
                              "rejected_draft_tokens": 0},
                             OutputRows(drafted={seq: (1, drafts)}), logits, 0.0)
    reason = verifier.accept(seq, first.tokens[0], first.logprobs[0], first.top[0])
    return seq, kv, reason


def rows_of(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (n, N_VOCAB)).astype(np.float32)


@pytest.mark.pure
@pytest.mark.parametrize("n_right", [0, 1, 3, 5])  # the first n_right drafts are what the rows draw
@pytest.mark.parametrize("params", [SAMPLED, SamplingParams(temperature=0, logprobs=True)], ids=["sampled", "greedy"])
def test_a_drafted_run_emits_what_one_at_a_time_decoding_emits(n_right: int, params: SamplingParams) -> None:
    rows = rows_of(n_right, 6)
    expected, alone = one_at_a_time(rows, params)
    wrong = (expected[n_right] + 1) % N_VOCAB if n_right < 5 else None
    drafts = tuple(expected[:n_right]) + ((wrong,) if wrong is not None else ())
    seq, kv, reason = drafted_run(rows, drafts, params)
    assert reason is None
    assert seq.token_ids[3:] == expected[:n_right + 1]  # the right drafts and the row after them
    assert kv.verified == [(len(drafts), n_right)]
    assert kv.removed == ([] if wrong is None else [3 + n_right])  # the rejected cells, from the first
    assert seq.n_past == 3 + n_right and seq.state.n_draft_accepted == n_right
    assert seq.state.logprobs == alone.state.logprobs[:n_right + 1]  # each from its own row
    if params.temperature:  # the generator drawn once per emitted token, as alone
        replay = new_sequence(params)
        for _ in range(n_right + 1):
            replay.state.rng.random()
        assert seq.state.rng.bit_generator.state == replay.state.rng.bit_generator.state


@pytest.mark.pure
def test_a_stop_string_inside_a_drafted_run_ends_it_there_and_drops_the_rest() -> None:
    rows = rows_of(7, 6)
    greedy = SamplingParams(temperature=0)
    expected, _ = one_at_a_time(rows, greedy)
    stop = ByteTokenizer().token_text(expected[1])
    params = SamplingParams(temperature=0, stop=(stop,))
    seq, kv, reason = drafted_run(rows, tuple(expected[:5]), params)
    assert reason == "stop" and seq.state.text.text == ByteTokenizer().token_text(expected[0]) * (expected[0] != expected[1])
    assert kv.verified[0][1] <= 2 and kv.removed == [seq.n_past]


@pytest.mark.pure
def test_sampled_acceptance_keeps_the_distribution_of_the_sampler() -> None:
    row = rows_of(3, 1)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)
    n = 4000
    counts = np.zeros(N_VOCAB)
    for seed in range(n):
        rows = np.repeat(row, 2, axis=0)
        seq, _, _ = drafted_run(rows, (int(np.argmax(row)),), params.replace(seed=seed))  # the likeliest drafted
        counts[seq.token_ids[3]] += 1
    p = np.exp(row[0] - row[0].max())
    p /= p.sum()
    assert chisquare(counts, p * n).pvalue > 1e-3
