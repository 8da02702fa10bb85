"""The ``llamactor chat`` REPL: streamed answers, conversation history, slash commands.

Runs on the main thread; the answer streams from the batcher through a ``TextStream``. Ctrl-C
while an answer streams cancels that request (its sequence is freed) and returns to the prompt;
Ctrl-C at the prompt clears the line; Ctrl-D or /exit leaves. Line editing and history come
from readline where the platform has it.
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import click

import llamactor
from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import CancelledError, LlamactorError
from llamactor.base.sampling_defaults import SHOWN, model_sampling, sources

try:  # line editing and history for input(), where available
    import readline  # noqa: F401
except ImportError:  # pragma: no cover
    pass

HELP = """Commands:
  /help                 this list
  /reset                forget the conversation
  /system TEXT          set the system message (and reset); /system alone clears it
  /stats                the batcher's counters
  /set NAME VALUE       a sampling parameter: temperature, max_tokens, top_p, top_k, min_p, seed, ...
  /set                  the sampling in use, and where each value comes from
  /exit                 leave (Ctrl-D too). Ctrl-C stops the current answer."""


# The REPL's own sampling, under the operator's options and the GGUF's recommendation but over
# llamactor's defaults: the values SmolLM2's model card samples with. At llamactor's temperature
# 0.8 the bundled SmolLM2 strays from a fact it knows in a few sessions of fifty (README, "Models":
# the rates and examples/repl_capital.py, which measures them).
CHAT_DEFAULTS = {"temperature": 0.2, "top_p": 0.9}


def devices_line(info: EngineInfo) -> str:
    """The backend's devices and their free memory, and where the model's layers went."""
    devices = "; ".join(d.summary() for d in info.devices) or "none reported"
    if not info.gpu_offload:
        where = "a CPU build: no GPU offload"
    elif info.n_gpu_layers == 0:
        where = "no layers offloaded (--n-gpu-layers 0)"
    else:
        where = ("all" if info.n_gpu_layers < 0 else str(info.n_gpu_layers)) + " layers offloaded to the GPU"
    return f"Devices: {devices} ({where})."


class Repl:
    def __init__(self, llm: llamactor.LLM) -> None:
        self.llm = llm
        self.system: str | None = None
        self.history: list[dict[str, str]] = []
        self.overrides: dict[str, Any] = {}  # what /set changed
        # The sampling a question gets without /set: the operator's, the GGUF's, the REPL's, llamactor's.
        self.defaults = model_sampling(llm.config.sampling, llm.info.gguf_sampling, CHAT_DEFAULTS)
        self.sources = sources(llm.config.sampling, llm.info.gguf_sampling, CHAT_DEFAULTS, front_end_name="chat")

    def run(self) -> None:
        info = self.llm.info
        click.echo(f"llamactor chat — {info.description}, context {info.n_ctx_seq} tokens, "
                   f"chat format: {info.chat_template}. /help for commands, Ctrl-D to leave.")
        click.echo(devices_line(info))
        click.echo(f"Sampling: {self.sampling_line()} (/set NAME VALUE changes one).")
        if info.looks_like_base_model:
            click.echo("The GGUF has no chat template: this looks like a base (pretrained) model, never trained on "
                       "chat turns." + (" The conversation is sent as a plain User:/Assistant: transcript and each "
                                        "answer ends at the next 'User:'." if info.chat_template.startswith("transcript")
                                        else ""))
        try:
            while True:
                try:
                    line = input(">>> ")
                except KeyboardInterrupt:
                    click.echo()
                    continue
                except EOFError:
                    click.echo()
                    break
                line = line.strip()
                if not line:
                    continue
                if line.startswith("/"):
                    if not self.command(line):
                        break
                    continue
                self.answer(line)
        finally:
            self.llm.close()

    def command(self, line: str) -> bool:
        """Handle one slash command; False means leave."""
        name, _, arg = line[1:].partition(" ")
        if name in ("exit", "quit"):
            return False
        if name == "help":
            click.echo(HELP)
        elif name == "reset":
            self.history.clear()
            click.echo("(conversation cleared)")
        elif name == "system":
            self.system, self.history = (arg.strip() or None), []
            click.echo(f"(system message {'set' if self.system else 'cleared'}; conversation cleared)")
        elif name == "stats":
            click.echo(json.dumps(self.llm.stats(), indent=2))
        elif name == "set":
            self.set_param(arg)
        else:
            click.echo(f"unknown command /{name}; /help lists them")
        return True

    def sampling(self) -> SamplingParams:
        """What the next question is sampled with."""
        return self.defaults.replace(**self.overrides)

    def sampling_line(self) -> str:
        """``temperature 0.2 (chat), top_k 40, ...``: each value and, unless llamactor's own
        default, where it comes from (/set, the operator's options, the model's GGUF, the REPL)."""
        now = self.sampling()
        where = {**self.sources, **{k: "/set" for k in self.overrides}}
        return ", ".join(f"{name} {getattr(now, name)}" + ("" if where[name] == "llamactor" else f" ({where[name]})")
                         for name in SHOWN if name != "seed" or now.seed is not None)

    def set_param(self, arg: str) -> None:
        key, _, raw = arg.strip().partition(" ")
        if not key or not raw:
            click.echo(f"Sampling: {self.sampling_line()}." + ("" if key else " Usage: /set NAME VALUE."))
            return
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        try:
            self.defaults.replace(**{**self.overrides, key: value})
        except (LlamactorError, TypeError) as e:
            click.echo(f"error: {e}")
            return
        self.overrides[key] = value
        click.echo(f"({key} = {value!r})")

    def request_values(self) -> dict[str, Any]:
        """The values a question sends over the model's defaults: the REPL's own, then /set's."""
        return {**{name: getattr(self.defaults, name) for name in CHAT_DEFAULTS}, **self.overrides}

    def answer(self, text: str) -> None:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.history
        messages.append({"role": "user", "content": text})
        try:
            stream = self.llm.stream_chat(messages, **self.request_values())
        except LlamactorError as e:
            click.echo(f"error: {type(e).__name__}: {e}")
            return
        # Ctrl-C while streaming cancels the request instead of raising KeyboardInterrupt at some
        # arbitrary line; the cancel is sent from a helper thread, never inside the signal handler.
        previous = signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=stream.cancel).start())
        try:
            for piece in stream:
                click.echo(piece, nl=False)
            click.echo()
            reply = stream.completion.text
        except CancelledError:
            click.echo("\n(stopped)")
            return
        except LlamactorError as e:
            click.echo(f"\nerror: {type(e).__name__}: {e}")
            return
        finally:
            signal.signal(signal.SIGINT, previous)
        self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
