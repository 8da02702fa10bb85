"""``llamactor batch INPUT.jsonl -o OUTPUT.jsonl``: a batch job in this process (``llamactor.jobs.run_batch``).

The input and output are OpenAI's batch file formats. A progress bar (tqdm: done / total, tok/s,
ETA) on a terminal, one plain line per percent otherwise. Ctrl-C stops cleanly (what was in
flight is cancelled; the journal keeps every finished line); the same command again resumes.
Exit status: 0 when every line finished (failed lines are in the error file), 130 when stopped.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import click

from llamactor.base.errors import LlamactorError
from llamactor.cli.options import engine_options, sampling_options, tree_options
from llamactor.jobs.local import run_batch
from llamactor.jobs.runner import LineCounts
from llamactor.jobs.database import StoreLockedError


class ProgressView:
    """tqdm on a terminal; otherwise a line on stderr each time the finished share passes a percent."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.bar: Any = None
        self.last_percent = -1

    def __call__(self, p: LineCounts) -> None:
        rate = p.tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=p.total, initial=p.finished, unit="req", file=sys.stderr, dynamic_ncols=True)
            self.bar.update(p.finished - self.bar.n)
            self.bar.set_postfix(failed=p.failed, tok_s=f"{rate:.1f}", refresh=False)
            return
        percent = p.finished * 100 // max(p.total, 1)
        if percent != self.last_percent:
            self.last_percent = percent
            click.echo(f"batch: {p.finished}/{p.total} done ({p.failed} failed), {rate:.1f} tok/s", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command()
@click.argument("input_path", metavar="INPUT.jsonl", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="The output file (OpenAI's batch output lines, in input order).")
@click.option("--errors", "errors_path", type=click.Path(dir_okay=False), default=None,
              help="Failed lines (default: OUTPUT.errors.jsonl, written only when some line failed).")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False), default=None,
              help="The resumable journal (default: OUTPUT.jsonl.journal).")
@click.option("--max-in-flight", type=click.IntRange(1), default=None, help="Lines in flight at once.",
              show_default="--n-parallel")
@engine_options
@sampling_options
def batch(input_path: str, output_path: str, errors_path: str | None, journal_path: str | None,
          max_in_flight: int | None, **opts: Any) -> None:
    """Run every request of INPUT.jsonl (OpenAI batch input: custom_id, method, url, body) and
    write OUTPUT.jsonl. Rerun the same command after Ctrl-C or a crash to resume."""
    start_options = tree_options(opts)
    stop = threading.Event()
    view = ProgressView(sys.stderr.isatty())

    def interrupt(_sig: int, _frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C: do not wait for the cancellations
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, interrupt)
    started = time.monotonic()
    try:
        result = run_batch(input_path, output_path, errors_path=errors_path, journal_path=journal_path,
                           max_in_flight=max_in_flight, on_progress=view, stop=stop, **start_options)
    except StoreLockedError as e:
        raise click.ClickException(str(e)) from e
    except LlamactorError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    finally:
        signal.signal(signal.SIGINT, previous)
        view.close()
    if not result.finished:
        click.echo(f"stopped: {result.completed + result.failed}/{result.total} done; run the same command "
                   "again to resume", err=True)
        sys.exit(130)
    where = f"; failed lines in {result.errors_path}" if result.errors_path else ""
    click.echo(f"done: {result.completed} of {result.total} requests in {time.monotonic() - started:.1f} s, "
               f"written to {result.output_path}{where}", err=True)
