"""The numpy sampler's candidate prefilter and the page release behind the logits buffer (pure)."""

from __future__ import annotations

import mmap
import re

import numpy as np
import pytest

from llamactor.native import host_pages
from llamactor.native.sampling import RowSpec, log_sum_exp, sample, top_candidates

pytestmark = pytest.mark.pure


def _rows() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    flat = np.zeros(5000, np.float32)
    peaked = rng.standard_normal(5000).astype(np.float32)
    peaked[17] = 80.0  # one token far above the margin: the prefilter must widen for the rest
    masked = np.full(5000, -np.inf, np.float32)
    masked[[3, 9, 4000]] = [1.0, 2.0, 0.5]  # fewer allowed tokens than k
    spread = (rng.standard_normal(5000) * 30).astype(np.float32)
    return [flat, peaked, masked, spread]


@pytest.mark.parametrize("k", [1, 5, 40, 700])
def test_top_candidates_are_exactly_the_k_largest_in_order(k: int) -> None:
    for row in _rows():
        vals, ids = top_candidates(row, k)
        expected = np.sort(row)[::-1][:k]
        np.testing.assert_array_equal(vals, expected)
        np.testing.assert_array_equal(row[ids], vals)
        assert len(set(ids.tolist())) == len(ids) == min(k, row.size)


def test_log_sum_exp_matches_the_textbook_formula_and_ignores_masked_entries() -> None:
    row = np.array([1.0, 2.0, -np.inf, 3.0], np.float32)
    assert log_sum_exp(row) == pytest.approx(float(np.log(np.exp([1.0, 2.0, 3.0]).sum())), abs=1e-6)
    assert log_sum_exp(np.full(4, 1000.0, np.float32)) == pytest.approx(1000.0 + np.log(4.0), abs=1e-3)


def test_a_row_without_top_k_draws_only_inside_its_nucleus_even_when_it_is_wide() -> None:
    # 300 equally likely tokens hold 99% of the mass: the candidate set must grow past 64 and 256.
    row = np.full((1, 20000), -20.0, np.float32)
    row[0, 1000:1300] = 5.0
    rng = np.random.default_rng(5)
    spec = RowSpec(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0, repeat_penalty=1.0, presence_penalty=0.0,
                   frequency_penalty=0.0, rng=rng, recent_tokens=(), want_logprob=False)
    drawn = {sample(row.copy(), [spec]).tokens[0] for _ in range(200)}
    assert drawn <= set(range(1000, 1300)) and len(drawn) > 100


def _resident_kib(address: int) -> int:
    """The Rss of the mapping holding ``address``, from /proc/self/smaps."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head[1], 16) <= address < int(head[2], 16)
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError("mapping not found")


def test_released_pages_leave_the_resident_set_and_read_back_as_zeros() -> None:
    n_pages = 256
    area = mmap.mmap(-1, n_pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as malloc's
    try:
        view = np.frombuffer(area, dtype=np.uint8)
        view[:] = 7  # every page touched
        address = view.ctypes.data
        before = _resident_kib(address)
        # an unaligned range: only the whole pages inside it go, the partial ones at each end stay
        assert host_pages.release(address + 100, (n_pages - 1) * mmap.PAGESIZE)
        after = _resident_kib(address)
        assert before - after >= (n_pages - 2) * mmap.PAGESIZE // 1024
        assert view[:100].tolist() == [7] * 100 and view[mmap.PAGESIZE:2 * mmap.PAGESIZE].max() == 0
        del view
    finally:
        area.close()


def _torch_kept(row: np.ndarray, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens llama.cpp's top-k -> top-p -> min-p chain keeps, by a full sort in torch: an
    independent reference for the numpy sampler's prefiltered candidates."""
    import torch

    vals, ids = torch.sort(torch.from_numpy(row).double(), descending=True)
    if top_k > 0:
        vals, ids = vals[:top_k], ids[:top_k]
    probs = torch.softmax(vals, 0) if top_k > 0 else torch.exp(vals - torch.logsumexp(torch.from_numpy(row).double(), 0))
    keep = (torch.cumsum(probs, 0) - probs) < top_p
    keep &= probs >= min_p * probs[0]
    keep[0] = True
    return set(ids[keep].tolist())


@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 0.95, 0.05), (0, 0.9, 0.0), (0, 1.0, 0.1), (5, 1.0, 0.0),
                                               (0, 0.5, 0.02)])
def test_drawn_tokens_stay_inside_what_a_full_sort_keeps(top_k: int, top_p: float, min_p: float) -> None:
    rng = np.random.default_rng(23)
    row = (rng.standard_normal(3000) * 2.5).astype(np.float32)
    kept = _torch_kept(row, top_k, top_p, min_p)
    spec = RowSpec(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=1.0, presence_penalty=0.0,
                   frequency_penalty=0.0, rng=np.random.default_rng(4), recent_tokens=(), want_logprob=False)
    drawn = [sample(row[None, :].copy(), [spec]).tokens[0] for _ in range(400)]
    assert set(drawn) <= kept
    assert len(set(drawn)) >= min(len(kept), 20) // 2  # the draw spreads over the kept set


def test_logprobs_and_alternatives_equal_torchs_log_softmax() -> None:
    import torch

    row = (np.random.default_rng(9).standard_normal(5000) * 4).astype(np.float32)
    spec = RowSpec(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, presence_penalty=0.0,
                   frequency_penalty=0.0, rng=np.random.default_rng(0), recent_tokens=(), want_logprob=True,
                   top_logprobs=4)
    out = sample(row[None, :].copy(), [spec])
    reference = torch.log_softmax(torch.from_numpy(row).double(), 0)
    vals, ids = reference.topk(4)
    assert out.tokens[0] == int(ids[0])
    assert out.logprobs[0] == pytest.approx(float(vals[0]), abs=1e-5)
    assert [t for t, _ in out.top[0]] == ids.tolist()
    assert [lp for _, lp in out.top[0]] == pytest.approx(vals.tolist(), abs=1e-5)


def test_a_temperature_only_row_draws_from_the_whole_softmax_without_sorting(monkeypatch: pytest.MonkeyPatch) -> None:
    import llamactor.native.sampling as sampling

    def no_sort(*_: object) -> None:
        raise AssertionError("a temperature-only row must not search candidates")
    monkeypatch.setattr(sampling, "top_candidates", no_sort)
    row = np.array([[0.0, 1.0, 2.0, -np.inf, 0.5]], np.float32)
    temperature, n = 0.7, 20000
    spec = RowSpec(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, presence_penalty=0.0,
                   frequency_penalty=0.0, rng=np.random.default_rng(3), recent_tokens=(), want_logprob=False)
    counts = np.bincount([sample(row.copy(), [spec]).tokens[0] for _ in range(n)], minlength=5)
    expected = np.exp(np.where(np.isinf(row[0]), -np.inf, row[0] / temperature))
    expected = n * expected / expected.sum()
    assert counts[3] == 0  # a masked token is never drawn
    seen = expected > 0
    chi2 = float((((counts[seen] - expected[seen]) ** 2) / expected[seen]).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


class _CountingNumpy:
    """numpy as ``llamactor.native.sampling`` sees it, noting the size of every array it sorts."""

    def __init__(self) -> None:
        self.sorted_sizes: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(np, name)

    def argsort(self, a: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        self.sorted_sizes.append(int(np.size(a)))
        return np.argsort(a, *args, **kwargs)  # type: ignore[call-overload, no-any-return]


def _no_top_k(top_p: float, min_p: float, temperature: float, seed: int) -> RowSpec:
    return RowSpec(temperature=temperature, top_k=0, top_p=top_p, min_p=min_p, repeat_penalty=1.0,
                   presence_penalty=0.0, frequency_penalty=0.0, rng=np.random.default_rng(seed), recent_tokens=(),
                   want_logprob=False)


@pytest.mark.parametrize("top_p,min_p", [(0.9, 0.0), (0.5, 0.0), (1.0, 1e-6)])
def test_a_flat_row_with_top_p_or_min_p_sorts_no_more_than_a_small_band(monkeypatch: pytest.MonkeyPatch,
                                                                         top_p: float, min_p: float) -> None:
    # A flat 262k-entry row (a caller's top_p=0.9 on a high-entropy step): its nucleus is most of
    # the vocabulary, and a full sort of it is tens of ms on the batcher thread.
    import llamactor.native.sampling as sampling

    counting = _CountingNumpy()
    monkeypatch.setattr(sampling, "np", counting)
    row = (np.random.default_rng(2).standard_normal((1, 262_144)) * 0.01).astype(np.float32)
    token = sample(row, [_no_top_k(top_p, min_p, 1.0, 0)]).tokens[0]
    assert 0 <= token < row.shape[1]
    assert max(counting.sorted_sizes, default=0) <= 4096, counting.sorted_sizes


@pytest.mark.parametrize("top_p,min_p,temperature", [(0.85, 0.0, 1.0), (0.9, 0.0, 0.7), (0.97, 0.3, 0.7)])
def test_a_wide_nucleus_draws_as_a_full_sort_of_the_row_says(top_p: float, min_p: float, temperature: float) -> None:
    # three levels of 20k tokens, jittered apart: top-p's edge falls inside the last level (min-p's
    # between levels), past the band that is sorted whole, so it is found by halving
    rng = np.random.default_rng(17)
    levels = np.repeat([2.0, 1.0, 0.0], [3000, 6000, 11000])
    row = (levels + rng.uniform(0.0, 0.01, levels.size)).astype(np.float32)
    ids = np.argsort(-row.astype(np.float64), kind="stable")  # the reference: llama.cpp's rules on a full sort
    probs = np.exp(row[ids].astype(np.float64) - log_sum_exp(row))
    keep = ((np.cumsum(probs) - probs) < top_p) & (probs >= min_p * probs[0])
    weights = np.zeros(row.size)
    weights[ids[keep]] = np.exp(row[ids[keep]].astype(np.float64) / temperature)
    group = np.where(weights > 0, 2 - np.searchsorted([0.5, 1.5], row), 3)  # levels 2.0, 1.0, 0.0 kept; 3 out
    expected = np.bincount(group, weights=weights, minlength=4)[:3] / weights.sum()
    drawn = expected > 0
    assert (group == 3).any() and expected[drawn].min() > 0.02

    spec, n = _no_top_k(top_p, min_p, temperature, 5), 3000
    counts = np.bincount([group[sample(row[None, :].copy(), [spec]).tokens[0]] for _ in range(n)], minlength=4)
    assert counts[3] == 0  # nothing beyond the nucleus's edge
    chi2 = float((((counts[:3][drawn] - n * expected[drawn]) ** 2) / (n * expected[drawn])).sum())
    assert chi2 < {2: 10.8, 3: 13.8}[int(drawn.sum())]  # 1 or 2 degrees of freedom, p = 0.001
