"""From a ``Generate`` message to prompt token ids, and the shared system-prompt prefixes.

``prompt_tokens`` and ``inspect`` run on the batcher's preparation pool (``llamactor.tree.prompt_prep``:
llama.cpp's tokenizer only reads the vocabulary), the rest on the batcher thread. A prompt that
cannot fit in the per-sequence context is refused before it is tokenized: no token stands for
more bytes than the vocabulary's longest token text. A configured system
prompt is prefixed to raw prompts as text and to chat conversations as a system message; both
forms are prefilled once at start on reserved sequences (``shared_prefix_tokens``), so requests
starting with either attach its KV by ``seq_cp`` instead of recomputing it.
"""

from __future__ import annotations

from typing import Any

from llamactor.base.errors import ContextExceededError, InvalidRequestError
from llamactor.base.completion import Tokenized
from llamactor.base.messages import Generate, Tokenize
from llamactor.base.tools import Tools
from llamactor.base.chat_template import ChatTemplate, ChatTemplateError
from llamactor.native.tokenizer import Tokenizer

_SPLIT_MARK = "\x00llamactor-split\x00"


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, system_prompt: str | None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.system_prompt = system_prompt
        self._system_tokens = tokenizer.tokenize(system_prompt, add_special=True) if system_prompt else []

    def shared_prefix_tokens(self) -> list[list[int]]:
        """Token prefixes worth prefilling once: the raw and the chat-templated system prompt."""
        if not self.system_prompt:
            return []
        rendered = self.template.render([{"role": "system", "content": self.system_prompt},
                                         {"role": "user", "content": _SPLIT_MARK}])
        chat = self._tokenize_rendered(rendered.split(_SPLIT_MARK)[0])
        return [self._system_tokens, chat] if chat != self._system_tokens else [self._system_tokens]

    def prompt_tokens(self, msg: Generate, n_ctx_seq: int | None = None) -> tuple[list[int], int]:
        """The request's full prompt, and where its continuation starts (scoring; else its length).
        ``InvalidRequestError`` if it is empty or holds unknown token ids; ``ContextExceededError``,
        before any tokenizing, if its text cannot fit in ``n_ctx_seq`` tokens (None: not checked)."""
        if msg.token_ids is not None:
            tokens = list(msg.token_ids)
            self.tokenizer.check_ids(tokens)
        elif msg.messages is not None:
            rendered = self._render(msg.messages, msg.tools, msg.chat_template_kwargs)
            self._check_room(n_ctx_seq, rendered, msg.continuation)
            tokens = self._tokenize_rendered(rendered)
        else:
            assert msg.text is not None
            if not msg.text and msg.continuation is None:  # scoring may start from BOS alone
                raise InvalidRequestError("prompt must not be empty")
            self._check_room(n_ctx_seq, msg.text, msg.continuation, len(self._system_tokens))
            if self.system_prompt:
                tokens = self._system_tokens + self.tokenizer.tokenize(msg.text, add_special=False)
            else:
                tokens = self.tokenizer.tokenize(msg.text, add_special=True)
        if not tokens:
            raise InvalidRequestError("prompt must not be empty")
        n_context = len(tokens)
        if msg.continuation is not None:
            tokens += self._continuation_tokens(msg.continuation)
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

    def _continuation_tokens(self, continuation: str | tuple[int, ...]) -> list[int]:
        """A scored continuation on its own: no BOS, special-token text kept as text (lm-eval's
        ``loglikelihood`` tokenizes context and continuation apart, then joins the ids)."""
        if isinstance(continuation, str):
            tokens = self.tokenizer.tokenize(continuation, add_special=False)
        else:
            tokens = list(continuation)
            self.tokenizer.check_ids(tokens)
        if not tokens:
            raise InvalidRequestError("a scored continuation must not be empty")
        return tokens

    def inspect(self, msg: Tokenize) -> Tokenized:
        """What the model sees of ``msg``'s prompt (the tokenizer and template endpoints). No
        context cap: counting a text's tokens is asked of texts of any length (the body limit bounds it)."""
        if msg.token_ids is not None:
            tokens = list(msg.token_ids)
            self.tokenizer.check_ids(tokens)
            text = self.tokenizer.detokenize(tokens)
        elif msg.messages is not None:
            text = self._render(msg.messages, msg.tools, msg.chat_template_kwargs)
            tokens = self._tokenize_rendered(text)
        elif msg.parts is not None:
            tokens = self._tokenize_parts(msg.parts, msg.add_special)
            text = self.tokenizer.detokenize(tokens)
        else:
            assert msg.text is not None
            # special-token text ("<eos>") is its single id, as llama-server's and HF tokenizers do
            text = msg.text
            tokens = self.tokenizer.tokenize(msg.text, add_special=msg.add_special, parse_special=True)
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
                template_kwargs: dict[str, Any] | None = None) -> str:
        """A conversation as the chat format renders it (the configured system prompt first)."""
        chat = list(messages)
        if self.system_prompt and not any(m.get("role") == "system" for m in chat):
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        if tools is not None:
            chat = tools.prepare(chat, self.template.takes_tools, self.template.renders_system)
        try:
            template_tools = tools.template_tools() if tools is not None and self.template.takes_tools else None
            return self.template.render(chat, tools=template_tools, template_kwargs=template_kwargs)
        except ChatTemplateError as e:
            raise InvalidRequestError(str(e)) from e

    def _tokenize_rendered(self, text: str) -> list[int]:
        # Templates usually write the BOS text themselves; never add a second BOS.
        bos = self.tokenizer.bos_text
        has_bos = bool(bos) and text.startswith(bos)
        return self.tokenizer.tokenize(text[len(bos):] if has_bos else text, add_special=has_bos, parse_special=True)
