"""``llamactor top [URL]``: the live view of a daemon's engine in a terminal (rich), for SSH
sessions: what ``/ui/engine`` shows, read from the same ``GET /engine/events`` stream.

Runs on the command's main thread: one streaming HTTP request (httpx), each event parsed into an
``EngineSnapshot`` and drawn by ``render`` (pure: snapshot and the recent ones' ``History`` ->
rich renderable), the recent ones as sparklines (``sparklines``), the page's charts in a terminal.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Generator, Iterator

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from llamactor.cli.sparklines import SERIES, History, sparkline
from llamactor.http.live_snapshot import EngineSnapshot, Figures

ONCE_OVER_S = 1.0
SPARK_WIDTH = 60  # columns of each sparkline: the last five minutes, or as much of them as top has seen
MODEL_COLUMNS = ("running", "waiting", "tokens_per_s", "steps", "kv_used", "kv_cached", "kv_free", "prefix_hits",
                 "restarts")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def totals(f: Figures) -> Table:
    table = Table(title="engine", show_header=True, expand=False)
    for name in ("running", "waiting", "tokens/s", "steps/s", "seqs/step", "KV used", "KV cached", "KV free",
                 "restarts"):
        table.add_column(name, justify="right")
    table.add_row(*map(str, (f.running, f.waiting, f.tokens_per_s, f.steps_per_s, f.batch_size, f.kv_used,
                             f.kv_cached, f"{f.kv_free}/{f.kv_size}", f.restarts)))
    return table


def step_and_cache(f: Figures) -> Table:
    table = Table(title="rows per step · prefix cache", show_header=True)
    for name in ("decode", "prefill", "scoring", "embedding", "lookups", "hits", "tokens reused", "RAM tier",
                 "disk tier"):
        table.add_column(name, justify="right")
    table.add_row(*map(str, (f.rows_decode, f.rows_prefill, f.rows_scoring, f.rows_embedding, f.prefix_lookups,
                             f.prefix_hits, f.prefix_hit_tokens, f"{f.ram_entries} · {_mib(f.ram_bytes)} MiB",
                             f"{f.disk_entries} · {_mib(f.disk_bytes)} MiB")))
    return table


def models(snapshot: EngineSnapshot) -> Table:
    table = Table(title="models", show_header=True)
    table.add_column("model")
    table.add_column("state")
    for name in MODEL_COLUMNS:
        table.add_column(name, justify="right")
    for model in snapshot.models:
        rows = [(model.name, model.state, model.figures)]
        if len(model.replicas) > 1:
            rows += [(f"  #{r.replica}", r.state, r.figures) for r in model.replicas]
        for name, state, f in rows:
            table.add_row(name, state, *(str(getattr(f, c)) for c in MODEL_COLUMNS))
    return table


def tenants(snapshot: EngineSnapshot) -> Table:
    """The tenants' shares of the engine: each one's sequences, and its part of those running as a bar."""
    table = Table(title="tenants", show_header=True)
    table.add_column("tenant")
    table.add_column("running", justify="right")
    table.add_column("waiting", justify="right")
    table.add_column("share")
    running = sum(t.running for t in snapshot.tenants)
    for t in snapshot.tenants:
        share = t.running / running if running else 0.0
        table.add_row(t.name, str(t.running), str(t.waiting), f"{'█' * round(20 * share):<20} {100 * share:.0f}%")
    return table


def jobs(snapshot: EngineSnapshot) -> Table:
    table = Table(title="batch jobs", show_header=True)
    for name in ("batch", "status", "endpoint", "done"):
        table.add_column(name)
    for job in snapshot.jobs:
        table.add_row(job.id, job.status, job.endpoint, f"{job.completed + job.failed}/{job.total}"
                      + (f" ({job.failed} failed)" if job.failed else ""))
    return table


def curves(history: History) -> Table:
    """Each series of the recent snapshots as a sparkline, with its newest and highest value."""
    seconds = len(history.samples) * history.interval_s
    table = Table(title=f"the last {seconds / 60:.1f} min" if seconds >= 60 else f"the last {seconds:.0f} s",
                  show_header=True)
    table.add_column("")
    table.add_column("")
    table.add_column("now", justify="right")
    table.add_column("max", justify="right")
    for label, field, top in SERIES:
        values = history.series(field)
        shown = (lambda v: f"{100 * v:.1f}%") if top == 1.0 else (lambda v: f"{v:g}")
        table.add_row(label, sparkline(values, SPARK_WIDTH, top), shown(values[-1] if values else 0),
                      shown(max(values, default=0)))
    return table


def render(snapshot: EngineSnapshot, history: History | None = None) -> Group:
    """The whole view of one snapshot, and the curves of the recent ones (``history``)."""
    f = snapshot.figures
    parts = [totals(f), *([curves(history)] if history is not None else []), step_and_cache(f), models(snapshot)]
    if snapshot.tenants:
        parts.append(tenants(snapshot))
    if snapshot.jobs:
        parts.append(jobs(snapshot))
    return Group(*parts)


def snapshots(url: str, api_key: str | None, interval_s: float) -> Generator[EngineSnapshot, None, None]:
    """The daemon's snapshots as they come (a refused key or a dead daemon: ClickException)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.stream("GET", url.rstrip("/") + "/engine/events", params={"interval_s": interval_s},
                          headers=headers, timeout=httpx.Timeout(10, read=None)) as response:
            if response.status_code != 200:
                response.read()
                raise click.ClickException(f"{url} answered {response.status_code}: {_words(response)}")
            for line in response.iter_lines():
                if line.startswith("data:"):
                    yield EngineSnapshot.model_validate(json.loads(line[5:]))
    except httpx.HTTPError as e:
        raise click.ClickException(f"cannot read {url}: {e}") from e


def first_over_a_second(stream: Iterator[EngineSnapshot], history: History) -> EngineSnapshot | None:
    """The first snapshot whose rates cover a second at least, every one before it in ``history``."""
    for snapshot in stream:
        history.add(snapshot.figures)
        if snapshot.interval_s >= ONCE_OVER_S:
            return snapshot
    return None


def _words(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except ValueError:
        return response.text


@click.command()
@click.argument("url", default="http://127.0.0.1:8000", required=False)
@click.option("--api-key", envvar="LLAMACTOR_API_KEY", default=None,
              help="An admin key of the daemon, once it has keys (sent as 'Authorization: Bearer KEY').")
@click.option("--interval", "interval_s", type=float, default=0.5, show_default=True,
              help="Seconds between updates.")
@click.option("--once", is_flag=True, help="Print one view (rates over a second) and exit.")
def top(url: str, api_key: str | None, interval_s: float, once: bool) -> None:
    """The live view of a daemon's engine at URL (default http://127.0.0.1:8000): running and
    waiting sequences, rows per step, KV cells, the prefix cache and its tiers, models, tenants,
    batch jobs, and the last five minutes of tokens/s, sequences, KV use, cache hits and rows per
    step as sparklines."""
    stream, history = snapshots(url, api_key, interval_s), History(interval_s)
    if once:  # the first snapshot whose rates cover a second at least (the first has none)
        snapshot = first_over_a_second(stream, history)
        stream.close()
        if snapshot is None:
            raise click.ClickException(f"{url} ended the stream (draining?)")
        Console().print(render(snapshot, history))
        return
    with contextlib.suppress(KeyboardInterrupt), Live(Text("connecting..."), refresh_per_second=8,
                                                      screen=sys.stdout.isatty()) as live:
        for snapshot in stream:  # Ctrl-C ends it
            history.add(snapshot.figures)
            live.update(render(snapshot, history))
