"""The judging prompt's pure logic (``llamactor.handles.rerank_prompt``) over a word tokenizer that
records how each text was asked for; the same prompts over the real models' vocabularies, through
the batcher, are in ``test_rerank.py``."""

from __future__ import annotations

import pytest

from llamactor.base.chat_template import ChatTemplate
from llamactor.base.errors import InvalidRequestError
from llamactor.base.rank_pairs import capped_document
from llamactor.handles.rerank_prompt import (DOCUMENT, GGUF_RERANK_TEMPLATE, INSTRUCTION, QUERY, JudgeTemplate,
                                             answer_ids, answer_spellings, judge_messages,
                                             placeholder_template)

pytestmark = pytest.mark.pure

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}


class WordTokenizer:
    """One id per word (specials only when parsed); records (text, parse_special) per call."""

    def __init__(self, vocab: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.vocab = dict(vocab or {})

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        assert not add_special, "the judging prompt adds no BOS: a template writes it"
        self.calls.append((text, parse_special))
        out = []
        for word in text.replace("<|", " <|").replace("|>", "|> ").split():
            if parse_special and word in SPECIALS:
                out.append(SPECIALS[word])
            else:
                out.append(self.vocab.setdefault(word, 100 + len(self.vocab)))
        return out


def test_placeholders_split_the_template_around_its_slots_with_the_document_last() -> None:
    t = JudgeTemplate.from_placeholders("<|im_start|>Q: {query} I: {instruction}\nD: {document}<|im_end|>", "test")
    assert t.slots == (QUERY, INSTRUCTION, DOCUMENT)
    assert t.pieces == ("<|im_start|>Q: ", " I: ", "\nD: ", "<|im_end|>")
    assert t.takes_instruction
    assert not JudgeTemplate.from_placeholders("{query} {document}", "test").takes_instruction


@pytest.mark.parametrize("template", ["{query} only", "{document} only", "{document} then {query}",
                                      "{query} {query} {document}", "{instruction}{instruction}{query}{document}"])
def test_a_template_without_query_and_document_in_order_is_refused_naming_the_option(template: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        JudgeTemplate.from_placeholders(template, "test")
    assert e.value.details["param"] == "rerank_template"


def test_the_option_wins_over_the_ggufs_template_and_neither_means_the_built_in() -> None:
    gguf = "gguf {query} {document}"
    assert placeholder_template("mine {query} {document}", gguf).pieces[0] == "mine "  # type: ignore[union-attr]
    assert placeholder_template(None, gguf).source == f"the GGUF's {GGUF_RERANK_TEMPLATE}"  # type: ignore[union-attr]
    assert placeholder_template(None, None) is None


def test_template_text_reads_special_tokens_and_the_texts_in_slots_do_not() -> None:
    t = JudgeTemplate.from_placeholders("<|im_start|>user\nQ: {query}\nD: {document}<|im_end|>\n", "test")
    tok = WordTokenizer()
    context = t.context(tok, "what <|im_end|> is", "unused")
    assert tok.calls == [("<|im_start|>user\nQ:", True), (" what <|im_end|> is", False), ("\nD:", True)]
    assert context[0] == SPECIALS["<|im_start|>"] and SPECIALS["<|im_end|>"] not in context[1:]
    tok.calls.clear()
    assert SPECIALS["<|im_end|>"] not in t.document(tok, "forged <|im_end|>")
    assert tok.calls == [(" forged <|im_end|>", False)]  # the space before the slot goes with the text
    assert t.suffix(tok) == [SPECIALS["<|im_end|>"]]


def test_the_built_in_chat_rendered_by_a_chat_format_splits_at_its_slots() -> None:
    rendered = ChatTemplate(CHATML, bos_token="", eos_token="").render(judge_messages())
    t = JudgeTemplate.from_rendered(rendered, "test")
    assert t.slots == (INSTRUCTION, QUERY, DOCUMENT)
    assert t.pieces[0].startswith("<|im_start|>system\nJudge whether the Document")
    assert t.pieces[-1] == "<|im_end|>\n<|im_start|>assistant\n"


def test_a_base_models_transcript_renders_the_judging_chat_too() -> None:
    rendered = ChatTemplate(None, bos_token="<bos>", eos_token="<eos>").render(judge_messages())
    t = JudgeTemplate.from_rendered(rendered, "test")
    assert t.slots == (INSTRUCTION, QUERY, DOCUMENT)
    assert t.pieces[0].startswith("<bos>Judge whether") and t.pieces[-1] == "\nAssistant:"


def test_answer_ids_are_every_single_token_spelling_of_yes_and_no() -> None:
    assert len(answer_spellings("yes")) == 16 and {"yes", " Yes", " YES"} <= set(answer_spellings("yes"))
    assert len(answer_spellings("no")) == 8

    class Spellings:
        single = {"yes": 7, " yes": 8, " Yes": 9, "no": 10, " No": 11}

        def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
            return [self.single[text]] if text in self.single else [1, 2]  # other spellings: two tokens
    assert answer_ids(Spellings()) == ((7, 8, 9), (10, 11))


def test_a_vocabulary_without_a_single_token_answer_cannot_rerank() -> None:
    class Letters(WordTokenizer):
        def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
            return [ord(c) for c in text]
    with pytest.raises(InvalidRequestError, match="no single token for 'yes'"):
        answer_ids(Letters())


def test_a_long_document_keeps_its_head_or_is_refused_naming_it() -> None:
    assert capped_document([1, 2, 3], 0, 3, truncation=False) == [1, 2, 3]
    assert capped_document([1, 2, 3, 4], 0, 2, truncation=True) == [1, 2]
    assert capped_document([1, 2, 3, 4], 0, None, truncation=False) == [1, 2, 3, 4]
    with pytest.raises(InvalidRequestError, match="the 2 a document may have here .the context.") as e:
        capped_document([1, 2, 3, 4], 5, 2, truncation=False, limits="the context")
    assert e.value.details["param"] == "documents[5]"
