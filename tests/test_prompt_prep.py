"""Prompt preparation on the real models: long texts tokenized in pieces give the very tokens of
the whole text (Gemma's SPM and SmolLM2's BPE vocabularies), in linear time."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

import llamactor.native.tokenizer as tokenizer_module
from llamactor.native.engine import Engine
from llamactor.native.tokenizer import Tokenizer

_WORDS = ["hi", "hello world", "The quick brown fox.", "naïve café", "日本語のテキスト", "emoji 🎉🚀", "Ω≈ç√",
          "x=1; y=[2,3]", "def f(a):", "    return a", "a", "<", ">", "/", "[", "]", "|"]
_SEPARATORS = ["\n", "\n\n", "\n\n\n\n", " ", "  ", "   ", "\t", "\t\t", "\r\n", " \n", "\n "]
_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>", "<pad>", "<table>", "</td>", "<b>", "</b>",
             "[multimodal]", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<unused7>", "<<b>>", "<b><b>"]


def varied_texts() -> Iterator[tuple[str, str]]:
    """Texts of every shape this test knows, each with a name: random mixes of words, runs of
    whitespace and special-token text, and the regular shapes that made llama.cpp quadratic."""
    rng = random.Random(36)
    for i in range(12):
        pool = _WORDS + _SEPARATORS * (1 + i % 3) + _SPECIALS * (i % 4)
        yield f"mix{i}", "".join(rng.choice(pool) for _ in range(400 + 100 * i))
    yield "lines", "hi\n" * 3000
    yield "newlines", "\n" * 5000
    yield "spaces", " " * 5000
    yield "tags", "<b>" * 2000
    yield "tagged", "a<b>" * 2000
    yield "turns", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nhello<end_of_turn>\n" * 60
    yield "chatml", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n" * 60
    yield "prose", "It was the best of times, it was the worst of times. " * 200
    yield "indented", "def f():\n    if x:\n\t\treturn 1\n\n\n" * 300


@pytest.fixture(scope="module", params=["gemma", "smollm2"])
def tokenizer(request: pytest.FixtureRequest, model_path: str, instruct_path: str) -> Iterator[Tokenizer]:
    """The vocabulary of each bundled model: Gemma 3 (SPM) and SmolLM2 (BPE)."""
    engine = Engine(model_path if request.param == "gemma" else instruct_path, n_ctx=256, n_batch=64, n_ubatch=64,
                    n_seq_max=1, n_threads=1)
    yield engine.tokenizer
    engine.close()


@pytest.mark.parametrize("chunk", [5, 64, tokenizer_module.CHUNK_BYTES])
def test_pieces_tokenize_to_the_tokens_of_the_whole(tokenizer: Tokenizer, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """For every text, both ``parse_special`` modes and with/without BOS, the pieces' tokens joined
    equal llama.cpp's tokens of the unsplit text; the texts are really cut (not vacuous)."""
    monkeypatch.setattr(tokenizer_module, "CHUNK_BYTES", chunk)
    n_cut = 0
    for name, text in varied_texts():
        data = text.encode()
        for parse_special in (False, True):
            splitter = tokenizer.facts().splitters[parse_special]
            assert splitter is not None
            n_cut += len(splitter.cuts(data, chunk)) > 2
            for add_special in (False, True):
                whole = tokenizer._tokenize(data, add_special, parse_special)  # llama.cpp, one call
                assert tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special) == whole, (
                    f"{name}: parse_special={parse_special} add_special={add_special}")
    assert n_cut >= 10


def test_line_structured_text_tokenizes_in_linear_time(tokenizer: Tokenizer) -> None:
    """'hi\\n' x 40k (llama.cpp alone: 39 s on Gemma, quadratic in the newlines it matches) is cut in
    pieces; their sizes are bounded, so the work per piece is. (Counted, not timed.)"""
    data = ("hi\n" * 40_000).encode()
    for parse_special in (False, True):
        splitter = tokenizer.facts().splitters[parse_special]
        assert splitter is not None
        cuts = splitter.cuts(data, tokenizer_module.CHUNK_BYTES)
        sizes = [b - a for a, b in zip(cuts, cuts[1:])]
        if b"\n" in tokenizer_facts_specials(tokenizer, parse_special):
            assert max(sizes) <= tokenizer_module.CHUNK_BYTES + 3, "a piece holds a bounded number of matches"
        else:  # no special token in it: llama.cpp makes one fragment, linear already
            assert len(cuts) == 2


def tokenizer_facts_specials(tokenizer: Tokenizer, parse_special: bool) -> frozenset[bytes]:
    splitter = tokenizer.facts().splitters[parse_special]
    assert splitter is not None
    return splitter._tokens
