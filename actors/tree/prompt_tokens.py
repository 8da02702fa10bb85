"""From a ``Generate`` message to prompt token ids, and the shared system-prompt prefixes.

``prompt_tokens`` and ``inspect`` run on the batcher's preparation pool (``llamactor.tree.prompt_prep``:
llama.cpp's tokenizer only reads the vocabulary), the rest on the batcher thread. A prompt that
cannot fit in the per-sequence context is refused before it is tokenized: no token stands for
more bytes than the vocabulary's longest token text. A configured system
prompt is prefixed to raw prompts as text and to chat conversations as a system message; both
forms are prefilled once at start on reserved sequences (``shared_prefix_tokens``), so requests
starting with either attach its KV by ``seq_cp`` instead of recomputing it.

Special-token text is read as those tokens where a client or the chat format wrote the prompt: in
a raw prompt (unless the request's ``parse_special`` is off, llama-server and llama-cpp-python
read it so) and in what the template writes around a chat's messages -- never in a message's
content, so a user's ``<|im_end|>`` cannot close its own turn (docs/operations.md, the threat
model). A prompt that starts with the BOS text gets no second BOS.
"""

from __future__ import annotations

import re
from typing import Any

from llamactor.base.errors import ContextExceededError, InvalidRequestError
from llamactor.base.completion import Tokenized, TokenizedTexts
from llamactor.base.messages import Generate, Tokenize
from llamactor.base.tools import Tools
from llamactor.base.chat_template import ChatTemplate, ChatTemplateError
from llamactor.base.text_finder import TextFinder
from llamactor.native.tokenizer import Tokenizer

_SPLIT_MARK = "\x00llamactor-split\x00"
# Where a message's content held control-token text: replaced by this mark and its index while the
# template renders, then tokenized as plain text. Private-use characters, so a template leaves them
# as they are; a content holding the mark's own character is set aside too (``_control_text``).
_CONTENT_MARK = "\U000f8000"
_CONTENT_END = "\U000f8001"
_CONTENT_SLOT = re.compile(f"{_CONTENT_MARK}([0-9]+){_CONTENT_END}")


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, system_prompt: str | None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.system_prompt = system_prompt
        self._system_tokens = tokenizer.tokenize(system_prompt, add_special=True) if system_prompt else []
        self._control: TextFinder[str] | None = None  # read on first use: a tree that serves no chat never does

    def shared_prefix_tokens(self) -> list[list[int]]:
        """Token prefixes worth prefilling once: the raw and the chat-templated system prompt."""
        if not self.system_prompt:
            return []
        rendered, kept = self._render(({"role": "user", "content": _SPLIT_MARK},), None)
        chat = self._tokenize_rendered(rendered.split(_SPLIT_MARK)[0], kept)
        return [self._system_tokens, chat] if chat != self._system_tokens else [self._system_tokens]

    def prompt_tokens(self, msg: Generate, n_ctx_seq: int | None = None) -> tuple[list[int], int]:
        """The request's full prompt, and where its continuation starts (scoring; else its length).
        ``InvalidRequestError`` if it is empty or holds unknown token ids; ``ContextExceededError``,
        before any tokenizing, if its text cannot fit in ``n_ctx_seq`` tokens (None: not checked)."""
        if msg.token_ids is not None:
            tokens = list(msg.token_ids)
            self.tokenizer.check_ids(tokens)
        elif msg.messages is not None:
            rendered, kept = self._render(msg.messages, msg.tools, msg.chat_template_kwargs)
            self._check_room(n_ctx_seq, _restored(rendered, kept), msg.continuation)
            tokens = self._tokenize_rendered(rendered, kept)
        else:
            assert msg.text is not None
            if not msg.text and msg.continuation is None:  # scoring may start from BOS alone
                raise InvalidRequestError("prompt must not be empty")
            self._check_room(n_ctx_seq, msg.text, msg.continuation, len(self._system_tokens))
            if self.system_prompt:
                tokens = self._system_tokens + self.tokenizer.tokenize(
                    msg.text, add_special=False, parse_special=msg.parse_special)
            else:
                tokens = self._with_one_bos(msg.text, msg.parse_special)
        if not tokens:
            raise InvalidRequestError("prompt must not be empty")
        n_context = len(tokens)
        if msg.continuation is not None:
            tokens += self._continuation_tokens(msg.continuation, msg.parse_special)
        return tokens, n_context

    def _check_room(self, n_ctx_seq: int | None, text: str, continuation: str | tuple[int, ...] | None,
                    n_known: int = 0) -> None:
        """``ContextExceededError`` if ``text`` (+ ``continuation``, + ``n_known`` tokens) has more
        tokens than any prompt may (``admitted_sampling`` wants room for one more), counting the fewest tokens
        its bytes can be: sound, so no prompt that would fit is refused; O(1) past the encoding."""
        if n_ctx_seq is None:
            return
        n_ids = len(continuation) if isinstance(continuation, tuple) else 0
        n_bytes = [len(t.encode("utf-8", errors="surrogatepass")) for t in (text, continuation) if isinstance(t, str)]
        maximum = n_ctx_seq - 1
        if n_known + n_ids + sum(n_bytes) <= maximum:
            return  # a token is one byte at least: the vocabulary need not be asked
        least = n_known + n_ids + sum(self.tokenizer.min_tokens(n) for n in n_bytes)
        if least > maximum:
            raise ContextExceededError(
                f"prompt is too long: at least {least} tokens ({sum(n_bytes)} bytes of text) > {maximum} maximum",
                n_prompt_tokens=least, n_ctx=n_ctx_seq)

    def _continuation_tokens(self, continuation: str | tuple[int, ...], parse_special: bool) -> list[int]:
        """A scored continuation on its own, no BOS, its special-token text read as its prompt's
        is (lm-eval's ``loglikelihood`` tokenizes context and continuation apart, then joins the ids)."""
        if isinstance(continuation, str):
            tokens = self.tokenizer.tokenize(continuation, add_special=False, parse_special=parse_special)
        else:
            tokens = list(continuation)
            self.tokenizer.check_ids(tokens)
        if not tokens:
            raise InvalidRequestError("a scored continuation must not be empty")
        return tokens

    def inspect(self, msg: Tokenize) -> Tokenized | TokenizedTexts:
        """What the model sees of ``msg``'s prompt (the tokenizer and template endpoints), or of each
        of its ``texts``. No context cap: counting a text's tokens is asked of texts of any length
        (the body limit bounds it)."""
        if msg.texts is not None:
            tokenize = self.tokenizer.tokenize
            return TokenizedTexts(tuple(Tokenized(tuple(tokenize(text, add_special=add, parse_special=parse)), text)
                                        for text, add, parse in msg.texts))
        if msg.token_ids is not None:
            tokens = list(msg.token_ids)
            self.tokenizer.check_ids(tokens)
            text = self.tokenizer.detokenize(tokens)
        elif msg.messages is not None:
            rendered, kept = self._render(msg.messages, msg.tools, msg.chat_template_kwargs)
            text, tokens = _restored(rendered, kept), self._tokenize_rendered(rendered, kept)
        elif msg.parts is not None:
            tokens = self._tokenize_parts(msg.parts, msg.add_special)
            text = self.tokenizer.detokenize(tokens)
        else:
            assert msg.text is not None
            # special-token text ("<eos>") is its single id, as llama-server's and HF tokenizers do
            # (unless parse_special is off: a rerank's documents are plain text)
            text = msg.text
            tokens = self.tokenizer.tokenize(msg.text, add_special=msg.add_special, parse_special=msg.parse_special)
        pieces = tuple(self.tokenizer.special_text(t) for t in tokens) if msg.with_pieces else None
        return Tokenized(tuple(tokens), text, pieces)

    def _tokenize_parts(self, parts: tuple[str | int, ...], add_special: bool) -> list[int]:
        """Strings tokenized (BOS only before the first part) and token ids kept, in order."""
        tokens: list[int] = []
        for i, part in enumerate(parts):
            if isinstance(part, str):
                tokens += self.tokenizer.tokenize(part, add_special=add_special and i == 0, parse_special=True)
            elif isinstance(part, int) and not isinstance(part, bool) and self.tokenizer.has_id(part):
                tokens.append(part)
            else:
                raise InvalidRequestError(f"content must hold strings and token ids in [0, {self.tokenizer.n_vocab})")
        return tokens

    def _render(self, messages: tuple[dict[str, Any], ...], tools: Tools | None,
                template_kwargs: dict[str, Any] | None = None) -> tuple[str, list[str]]:
        """A conversation as the chat format renders it (the configured system prompt first), with
        each message content that holds control-token text set aside in a slot: (the rendered text
        with slots, the contents set aside, by slot number)."""
        chat = list(messages)
        if self.system_prompt and not any(m.get("role") == "system" for m in chat):
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        kept: list[str] = []
        chat = [self._set_aside(m, kept) for m in chat]
        if tools is not None:
            chat = tools.prepare(chat, self.template.takes_tools, self.template.renders_system)
        try:
            template_tools = tools.template_tools() if tools is not None and self.template.takes_tools else None
            return self.template.render(chat, tools=template_tools, template_kwargs=template_kwargs), kept
        except ChatTemplateError as e:
            raise InvalidRequestError(str(e)) from e

    def _set_aside(self, message: dict[str, Any], kept: list[str]) -> dict[str, Any]:
        """``message`` with its content (a string, or the text of its parts) put in a slot where
        it holds control-token text, so that the template renders around it."""
        control = self._control_text()

        def slot(text: Any) -> Any:
            if not isinstance(text, str) or not control.found_in(text):
                return text
            kept.append(text)
            return f"{_CONTENT_MARK}{len(kept) - 1}{_CONTENT_END}"

        content = message.get("content")
        if isinstance(content, str):
            return {**message, "content": slot(content)}
        if isinstance(content, list):
            return {**message, "content": [{**p, "text": slot(p.get("text"))} if isinstance(p, dict) and "text" in p
                                           else p for p in content]}
        return message

    def _control_text(self) -> TextFinder[str]:
        """Any thread: two that ask at once both build it, alike (about 0.2 s for Gemma's vocabulary)."""
        if self._control is None:
            self._control = TextFinder([*self.tokenizer.facts().control_texts, _CONTENT_MARK])
        return self._control

    def _tokenize_rendered(self, rendered: str, kept: list[str]) -> list[int]:
        """A rendered chat's tokens: the template's special-token text as those tokens, each slot's
        content as plain text, one BOS at most."""
        pieces = _CONTENT_SLOT.split(rendered)  # text, slot number, text, ...
        # Templates usually write the BOS text themselves; never add a second BOS. (A vocabulary
        # that adds none but has BOS text, as SmolLM2's "<|im_start|>", loses the first such text.)
        bos = self.tokenizer.bos_text
        has_bos = bool(bos) and pieces[0].startswith(bos)
        tokens = self.tokenizer.tokenize(pieces[0][len(bos):] if has_bos else pieces[0], add_special=has_bos,
                                         parse_special=True)
        for number, text in zip(pieces[1::2], pieces[2::2]):
            content = kept[int(number)] if int(number) < len(kept) else f"{_CONTENT_MARK}{number}{_CONTENT_END}"
            tokens += self.tokenizer.tokenize(content, add_special=False, parse_special=False)
            tokens += self.tokenizer.tokenize(text, add_special=False, parse_special=True)
        return tokens

    def _with_one_bos(self, text: str, parse_special: bool) -> list[int]:
        """``text``'s tokens after the BOS the vocabulary adds, if it adds one, and never two: a
        raw prompt that writes the BOS text itself keeps its own (llama.cpp would keep both, and warn)."""
        tokens = self.tokenizer.tokenize(text, add_special=True, parse_special=parse_special)
        bos = self.tokenizer.bos_id
        if self.tokenizer.adds_bos and tokens[:2] == [bos, bos]:
            del tokens[0]
        return tokens


def _restored(rendered: str, kept: list[str]) -> str:
    """A rendered chat with its slots' contents put back."""
    if not kept:
        return rendered
    return _CONTENT_SLOT.sub(lambda m: kept[int(m[1])] if int(m[1]) < len(kept) else m[0], rendered)
