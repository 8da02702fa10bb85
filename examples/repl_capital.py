"""How often the chat REPL holds a fact: "What is the capital of France?" asked in fresh sessions.

Each session is a new ``llamactor chat`` process fed the question on stdin, as a user types it:
its own random seed, the REPL's default sampling (and whatever options follow ``--``, e.g.
``-- --temperature 0.8`` for another setting), the bundled SmolLM2-135M-Instruct unless
``--model`` is among them. Prints each answer and the count of those naming Paris.

    .venv/bin/python examples/repl_capital.py --sessions 50 --jobs 2
    .venv/bin/python examples/repl_capital.py --sessions 50 -- --temperature 0.8 --min-p 0.05
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys

QUESTION = "What is the capital of France?"


def one_session(options: list[str]) -> str:
    """The REPL's answer to QUESTION in a fresh process (the text between the prompts)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "llamactor.cli", "chat", "--log-level", "error", *options],
                          input=f"{QUESTION}\n/exit\n", capture_output=True, text=True, timeout=300, env=env,
                          check=True)
    # stdout: the banner lines, then ">>> " and the streamed answer, then ">>> " again
    return done.stdout.split(">>> ")[1].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2, help="sessions at once")
    parser.add_argument("options", nargs="*", help="`llamactor chat` options, after --")
    args = parser.parse_args()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        answers = list(pool.map(lambda _: one_session(args.options), range(args.sessions)))
    for answer in answers:
        print(repr(answer))
    hits = sum("paris" in a.lower() for a in answers)
    print(f"Paris in {hits} of {len(answers)} fresh sessions (llamactor chat {' '.join(args.options)})")


if __name__ == "__main__":
    main()
