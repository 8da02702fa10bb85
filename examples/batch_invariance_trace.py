"""``batch_invariance.py --part trace``: the first graph tensor in which one of the target's rows
(its last prompt row, then each decode row) parts from the same row computed alone.

llama.cpp's ``cb_eval`` callback hands over every tensor of the graph as it is computed; during
the target's decodes its column (the target's token) of each per-token float32
tensor is kept, in graph order (``attn_norm-0``, ``Qcur-0``, ..., ``result_output``). Tensors laid
out by KV cell (``kq``, ``kq_soft_max``) are skipped: a cell's place there is not a difference.
"""

from __future__ import annotations

import ctypes
import pathlib

import llama_cpp
import numpy as np

from batch_invariance import SLOT, Ctx, Entry, Setup, Target, _row, alone, batched

_ggml = ctypes.CDLL(str(pathlib.Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
_ggml.ggml_get_name.restype = ctypes.c_char_p
_ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
_ggml.ggml_get_data.restype = ctypes.c_void_p
_ggml.ggml_get_data.argtypes = [ctypes.c_void_p]
_ggml.ggml_op_desc.restype = ctypes.c_char_p
_ggml.ggml_op_desc.argtypes = [ctypes.c_void_p]
_NE, _NB, _SRC = 16, 48, 152  # offsets of ne[4], nb[4] and src[10] in struct ggml_tensor (ggml.h)


def _src_name(t: int) -> str:
    name = (_ggml.ggml_get_name(t) or b"").decode()
    return "_" if name.startswith("node_") else name


class Recorder:
    """Keeps the armed decode's per-token tensors: (name, the target's column) in graph order."""

    def __init__(self) -> None:
        self.armed, self.col, self.n = False, 0, 1
        self.seen: list[tuple[str, np.ndarray]] = []
        self.last = ""  # the last named tensor: unnamed ones (node_N) are called after it
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t: int, ask: bool, user_data: int) -> bool:
        if ask:
            return self.armed  # True: llama.cpp computes up to this tensor and calls again
        name = (_ggml.ggml_get_name(t) or b"").decode()
        op = (_ggml.ggml_op_desc(t) or b"").decode()
        if name.startswith("node_"):  # numbered by graph position, which differs between graphs
            srcs = [ctypes.c_void_p.from_address(t + _SRC + 8 * i).value for i in range(2)]
            args = ", ".join(_src_name(a) for a in srcs if a)
            name = f"{op}({args}) after {self.last}"
        else:
            self.last = name = f"{name}:{op}"
        ne = list((ctypes.c_int64 * 4).from_address(t + _NE))
        nb = list((ctypes.c_uint64 * 4).from_address(t + _NB))
        f32 = ctypes.c_int32.from_address(t).value == 0
        contiguous = nb[0] == 4 and nb[1] == 4 * ne[0] and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]
        if not f32 or not contiguous or name.startswith("kq-") or name.startswith("kq_soft_max"):
            return True
        data = np.ctypeslib.as_array((ctypes.c_float * int(np.prod(ne))).from_address(_ggml.ggml_get_data(t)))
        if ne[1] == self.n and ne[2] == ne[3] == 1:
            col = data.reshape(ne[1], ne[0])[self.col]
        elif ne[2] == self.n and ne[3] == 1:
            col = data.reshape(ne[2], ne[1], ne[0])[self.col].ravel()
        else:
            return True
        self.seen.append((name, col.copy()))
        return True


class TraceCtx(Ctx):
    """A context that records the decodes which carry the target's last prompt token (step -1)
    and its continuation tokens (steps 0 ..), by step."""

    def __init__(self, path: str, setup: Setup, first_pos: int) -> None:
        self.rec = Recorder()
        self.first_pos = first_pos
        self.steps: dict[int, list[tuple[str, np.ndarray]]] = {}  # decode step: its tensors
        super().__init__(path, setup, self.rec.callback)

    def decode(self, entries: list[Entry]) -> list[np.ndarray]:
        hit = [i for i, e in enumerate(entries) if e[2] == SLOT and e[1] >= self.first_pos - 1]
        self.rec.armed, self.rec.col, self.rec.n = bool(hit), hit[0] if hit else 0, len(entries)
        self.rec.seen = self.steps.setdefault(entries[hit[0]][1] - self.first_pos, []) if hit else []
        try:
            return super().decode(entries)
        finally:
            self.rec.armed = False


def first_parting(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]) -> str:
    """The first tensor (by name and occurrence) whose values differ, and the next two."""
    def keyed(seen: list[tuple[str, np.ndarray]]) -> dict[tuple[str, int], np.ndarray]:
        count: dict[str, int] = {}
        out = {}
        for name, col in seen:
            count[name] = count.get(name, 0) + 1
            out[(name, count[name])] = col
        return out
    kb = keyed(b)
    parted = [f"{name} ({float(np.abs(col - kb[(name, i)]).max()):.1g})" for (name, i), col in keyed(a).items()
              if (name, i) in kb and kb[(name, i)].shape == col.shape and not np.array_equal(col, kb[(name, i)])]
    return ", ".join(parted[:3]) + (f" ... {len(parted)} tensors" if len(parted) > 3 else "") if parted else "none"


def trace(name: str, path: str) -> None:
    """Alone vs each variant that parted in the other parts, compared tensor by tensor."""
    apart = (lambda c, t: batched(c, t, prefill_apart=True))
    together = (lambda c, t: batched(c, t))
    variants = [("batch of 8 (prefill apart)", Setup(), apart),
                ("batch of 8 (prefill apart)", Setup(extra_bufts=False), apart),
                ("8 copies in own streams", Setup(unified=False), lambda c, t: batched(c, t, copies=True)),
                ("40 cells of another sequence first", Setup(), lambda c, t: alone(c, t, filler=40)),
                ("40 cells of another sequence first", Setup(flash=True), lambda c, t: alone(c, t, filler=40)),
                ("batch of 8 (prefill apart)", Setup(unified=False, extra_bufts=False, flash=True), apart),
                ("batch of 8 (prefill together)", Setup(extra_bufts=False, flash=True), together)]
    for label, setup, run in variants:
        ctx = TraceCtx(path, setup, 0)
        t = Target(ctx)
        ctx.first_pos = len(t.prompt)
        plain = Ctx(path, setup)
        same = np.array_equal(alone(plain, t).decode, alone(ctx, t).decode)  # the callback changes nothing
        plain.close()
        ref, ctx.steps = ctx.steps, {}
        run(ctx, t)
        found = [(k, first_parting(ref[k], ctx.steps[k])) for k in sorted(ref)]
        first = next((f"{'prompt row' if k < 0 else f'step {k}'}: {where}" for k, where in found if where != "none"),
                     "none")
        _row(name, "trace", f"{label}, {setup.label()}{'' if same else ' (TRACE CHANGED THE RESULT)'}", ("", first))
        ctx.close()
