"""What Ollama's model routes say of the models served (pure): ``/api/tags`` and ``/api/ps``
entries and the ``/api/show`` body, from a model's name, its configuration and what its GGUF
header says (``llamactor.native.gguf_header``; None where the file is not on this node, as on a
Ray ingress).

Models are listed as ``name:latest``: Open WebUI appends ``:latest`` to every name it routes and
looks it up in ``/api/tags``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from llamactor.base.chat_template import TRANSCRIPT_STOP, TRANSCRIPT_TEMPLATE
from llamactor.base.config import Config
from llamactor.base.sampling_defaults import gguf_sampling, model_sampling
from llamactor.native.gguf_header import GgufFile


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def tag_entry(name: str, gguf: GgufFile | None) -> dict[str, Any]:
    """A model as ``/api/tags`` lists it."""
    out: dict[str, Any] = {"name": tagged(name), "model": tagged(name), "size": gguf.size if gguf else 0,
                           "digest": gguf.digest if gguf else "",
                           "details": gguf.details() if gguf else {"parent_model": "", "format": "gguf"}}
    if gguf:
        out["modified_at"] = datetime.fromtimestamp(gguf.mtime).astimezone().isoformat(timespec="microseconds")
    return out


def ps_entry(name: str, gguf: GgufFile | None, offloaded: bool, expires_at: datetime,
             context_length: int) -> dict[str, Any]:
    """A loaded model as ``/api/ps`` lists it: when it would be unloaded, its context window;
    ``offloaded``: its layers are on a GPU (its size counts as VRAM)."""
    listed = tag_entry(name, gguf)
    listed.pop("modified_at", None)
    return {**listed, "expires_at": expires_at.isoformat(timespec="microseconds"),
            "size_vram": listed["size"] if offloaded else 0, "context_length": context_length}


def show_body(name: str, config: Config, gguf: GgufFile | None, operator: bool = True) -> dict[str, Any]:
    """``/api/show``: a Modelfile as Ollama would write it, the parameters, the template, the
    model's details and key-values, its capabilities. The Modelfile (it names the model's file on
    the server) and the operator's system prompt only for the ``operator`` (an admin; keyless,
    the local user): a tenant's body has neither (Ollama omits both when empty)."""
    meta = gguf.metadata if gguf else {}
    template = config.chat_template or meta.get("tokenizer.chat_template") or TRANSCRIPT_TEMPLATE
    stops = list(config.sampling.stop) + (list(TRANSCRIPT_STOP) if template == TRANSCRIPT_TEMPLATE else [])
    s = model_sampling(config.sampling, gguf_sampling(meta)[0])  # what a request without options gets
    params = [("num_ctx", config.n_ctx), ("temperature", s.temperature), ("top_k", s.top_k), ("top_p", s.top_p),
              ("min_p", s.min_p), ("repeat_penalty", s.repeat_penalty), ("repeat_last_n", s.repeat_last_n),
              *(("stop", stop) for stop in stops)]
    lines = [f"{k:<30} {json_value(v)}" for k, v in params]
    capabilities = ["completion"] + (["tools"] if "tools" in template else []) + (
        ["thinking"] if any(t in template for t in ("<think>", "enable_thinking", "reasoning_content")) else [])
    modelfile = "\n".join([f"# Modelfile of {tagged(name)}, served by llamactor", "",
                           f"FROM {gguf.path if gguf else config.model or ''}", f'TEMPLATE """{template}"""',
                           *([f'SYSTEM """{config.system_prompt}"""'] if config.system_prompt else []),
                           *(f"PARAMETER {line}" for line in lines)]) + "\n"
    entry = tag_entry(name, gguf)
    out: dict[str, Any] = {"parameters": "\n".join(lines), "template": template, "details": entry["details"],
                           "model_info": gguf.model_info() if gguf else {}, "capabilities": capabilities}
    if gguf:
        out["modified_at"] = entry["modified_at"]
    if isinstance(meta.get("general.license"), str):
        out["license"] = meta["general.license"]
    if operator:
        out["modelfile"] = modelfile
        if config.system_prompt:
            out["system"] = config.system_prompt
    return out


def json_value(value: Any) -> str:
    """A parameter value as Ollama's ``%#v`` prints it: strings quoted, numbers bare."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
