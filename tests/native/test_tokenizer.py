"""Prompt preparation's pure parts: where a text may be cut before llama.cpp tokenizes it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamactor.native.tokenizer import SpecialSplitter

pytestmark = pytest.mark.pure

Fragment = tuple[str, bytes]


def partition(data: bytes, specials: list[bytes]) -> list[Fragment]:
    """llama.cpp's ``tokenizer_st_partition`` in Python: for each special token, longest first,
    every raw fragment is cut at the token's leftmost non-overlapping occurrences."""
    fragments: list[Fragment] = [("raw", data)] if data else []
    for token in sorted(specials, key=len, reverse=True):
        cut: list[Fragment] = []
        for kind, text in fragments:
            if kind != "raw":
                cut.append((kind, text))
                continue
            start = 0
            while (at := text.find(token, start)) >= 0:
                if at > start:
                    cut.append(("raw", text[start:at]))
                cut.append(("token", token))
                start = at + len(token)
            if start < len(text):
                cut.append(("raw", text[start:]))
        fragments = cut
    return fragments


def pieces_partition(data: bytes, specials: list[bytes], chunk: int) -> tuple[list[Fragment], int]:
    cuts = SpecialSplitter(specials).cuts(data, chunk)
    assert cuts[0] == 0 and cuts[-1] == len(data)
    assert all(a < b for a, b in zip(cuts, cuts[1:])) or not data
    joined = [f for a, b in zip(cuts, cuts[1:]) for f in partition(data[a:b], specials)]
    return joined, len(cuts) - 2


_SPECIAL_SETS = [
    [b"\n", b"\n\n", b"\n\n\n"],
    [b"\n", b"  ", b"   ", b"<b>", b"</b>"],
    [b"<a>", b"a<", b"ab", b"<", b"b>"],
    [b"aba", b"ab", b"ba", b"b"],
    [b"<s>", b"<s><s>", b"s"],
    [b"<a", b"a>>", b">"],  # a longer token overlapping a shorter one's end: the shorter is not matched
]


@settings(max_examples=500, deadline=None)
@given(st.data(), st.sampled_from(_SPECIAL_SETS), st.integers(1, 9))
def test_pieces_partition_as_the_whole_does(draw: st.DataObject, specials: list[bytes], chunk: int) -> None:
    """Any text over an alphabet dense in special tokens (their bytes, the tokens, one other byte):
    llama.cpp's partition of the pieces, joined, is its partition of the whole -- so each fragment
    is tokenized as it would have been."""
    alphabet = sorted({bytes([b]) for t in specials for b in t} | set(specials) | {b"/"})
    parts = draw.draw(st.lists(st.sampled_from(alphabet), max_size=80))
    data = b"".join(parts)
    joined, _ = pieces_partition(data, specials, chunk)
    assert joined == partition(data, specials)


def test_line_structured_text_is_cut_in_pieces_of_the_chunk_size() -> None:
    data = b"hi\n" * 1000
    joined, n_cuts = pieces_partition(data, [b"\n", b"\n\n"], 30)
    assert joined == partition(data, [b"\n", b"\n\n"])
    assert n_cuts == len(data) // 30 - 1


def test_no_cut_before_a_token_that_a_longer_one_overlaps() -> None:
    """``<a`` in ``/<a>>`` is not matched (``a>>`` is, first): no boundary where it starts."""
    data = b"/<a>>" * 10
    assert SpecialSplitter([b"<a", b"a>>"]).cuts(data, 3) == [0, len(data)]
    assert pieces_partition(data, [b"<a", b"a>>"], 3)[0] == partition(data, [b"<a", b"a>>"])


def test_no_cut_inside_a_run_of_a_longer_token() -> None:
    """A run of newlines is matched as the longest newline token, so no point inside it is safe."""
    assert SpecialSplitter([b"\n", b"\n\n"]).cuts(b"\n" * 100, 4) == [0, 100]


def test_without_special_tokens_nothing_is_cut() -> None:
    assert SpecialSplitter([]).cuts(b"hello world" * 100, 8) == [0, 1100]
    assert SpecialSplitter([b"<eos>"]).cuts(b"hello world" * 100, 8) == [0, 1100]


def test_a_piece_needs_parse_special_only_if_it_holds_a_token_only_that_matches() -> None:
    splitter = SpecialSplitter([b"<b>", b"<eos>", b"\n"], parse_only=[b"<eos>"])
    data = b"<b>x\n<eos>y<eo"
    assert splitter.needs_parse(data, 0, len(data)) and splitter.needs_parse(data, 5, 10)
    assert not splitter.needs_parse(data, 0, 9) and not splitter.needs_parse(data, 6, len(data))
    assert not SpecialSplitter([b"<eos>"]).needs_parse(data, 0, len(data))
