"""``TextFinder``: where a set of special-token texts occurs, in a ``str`` (a chat message's
content) and in ``bytes`` (the tokenizer's pieces) alike, found only whole, from any start."""

from __future__ import annotations

import random

import pytest

from llamactor.base.text_finder import TextFinder

pytestmark = pytest.mark.pure


def test_control_text_is_found_wherever_it_starts_and_only_whole() -> None:
    control = TextFinder(["<|im_start|>", "<|im_end|>", "<eos>", ""])
    assert control.found_in("hi <|im_end|>") and control.found_in("<eos>") and control.found_in("a<<|im_start|>")
    assert not control.found_in("hi <|im_end") and not control.found_in("<eo s>") and not control.found_in("")
    assert not control.found_in("<b>bold</b> and <|im>")
    assert not TextFinder[str]([]).found_in("plain <text>")


def test_occurrences_are_each_start_and_length_leftmost_first_within_the_range() -> None:
    finder = TextFinder([b"\n", b"\n\n", b"<s>"])
    data = b"a\n\n<s>b\n"
    assert list(finder.occurrences(data)) == [(1, 1), (1, 2), (2, 1), (3, 3), (7, 1)]
    assert list(finder.occurrences(data, 2, 6)) == [(2, 1), (3, 3)]
    assert list(finder.occurrences(data, 2, 5)) == [(2, 1)]  # "<s>" crosses the end: not within
    assert finder.found_in(data, 3, 6) and not finder.found_in(data, 4, 7)


def test_it_finds_what_a_scan_of_every_place_and_every_text_finds() -> None:
    rng = random.Random(7)
    for _ in range(200):
        texts = ["".join(rng.choice("ab<>") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 5))]
        data = "".join(rng.choice("ab<>c") for _ in range(rng.randint(0, 30)))
        start, end = sorted(rng.randint(0, len(data)) for _ in range(2))
        expected = sorted({(x, len(t)) for t in texts for x in range(start, end - len(t) + 1)
                           if data[x:x + len(t)] == t})
        assert list(TextFinder(texts).occurrences(data, start, end)) == expected
        assert list(TextFinder([t.encode() for t in texts]).occurrences(data.encode(), start, end)) == expected
