"""A program that never closes its tree still exits, and its tree is stopped first, as ``close``
stops it (``llamactor.handles.llm``'s exit hook; the actors run on daemon threads): a request still
decoding then ends with ``BatcherUnavailableError`` rather than with the process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

PROGRAM = """
import llamactor
llm = llamactor.start(n_parallel=2)
print(llm.ask("Hello", max_tokens=4, temperature=0, ignore_eos=True).usage.completion_tokens, flush=True)
pending = llm.submit("Tell me a long story.", max_tokens=4000, ignore_eos=True)  # decoding at exit
pending.add_done_callback(lambda f: print(type(f.exception()).__name__, flush=True))
"""


def test_a_program_that_never_closes_its_tree_exits_once_the_tree_is_stopped() -> None:
    # (before the hook, the actors' threads kept such a program alive for ever: the timeout here)
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["4", "BatcherUnavailableError"]
