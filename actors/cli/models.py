"""``llamactor models``: the models of a folder (``--models-dir``, read from the GGUF headers), or
of a running daemon with their status (``--url``: its ``GET /models``), as a table or JSON.

    llamactor models --models-dir ~/models
    llamactor models --url http://127.0.0.1:8000 --api-key KEY

Runs on the main thread; nothing is loaded.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click

from llamactor.base.errors import LlamactorError
from llamactor.serving.model_dir import scan_models_dir


def human_size(n: int) -> str:
    """Bytes as the largest unit that keeps a number >= 1 (1 decimal): 98362432 -> "93.8 MiB"."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop returns


def folder_rows(models_dir: str) -> list[dict[str, Any]]:
    """Each file of the folder: ``name``, ``kind`` (model, adapter, projector), ``size``, ``path``."""
    found = scan_models_dir(models_dir)
    return [{"name": f.name, "kind": f.kind, "size": f.size, "path": f.path} for f in found.models + found.skipped]


def daemon_rows(url: str, api_key: str | None) -> list[dict[str, Any]]:
    """The daemon's ``GET /models``: ``name``, ``status``, ``size``, ``path`` of each model."""
    request = urllib.request.Request(url.rstrip("/") + "/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            data = json.load(response)["data"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        raise click.ClickException(f"cannot list the models of {url}: {e}") from e
    return [{"name": m["id"], "status": (m.get("status") or {}).get("value", "loaded" if m.get("loaded") else "?"),
             "size": m.get("size") or 0, "path": m.get("path") or ""} for m in data]


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[human_size(r[c]) if c == "size" else str(r[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = [[c.upper() for c in columns], *cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines)


@click.command("models")
@click.option("--models-dir", envvar="LLAMACTOR_MODELS_DIR", type=click.Path(exists=True, file_okay=False),
              default=None, help="List the GGUF files of this folder as `serve --models-dir` would serve them.")
@click.option("--url", envvar="LLAMACTOR_URL", default=None,
              help="A running daemon's address: list its models with their status (GET /models).")
@click.option("--api-key", envvar="LLAMACTOR_API_KEY", default=None, help="The daemon's API key, if it asks for one.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def models(models_dir: str | None, url: str | None, api_key: str | None, as_json: bool) -> None:
    """The models of a folder (name, kind, size, path), or of a daemon (name, status, size, path)."""
    if (models_dir is None) == (url is None):
        raise click.UsageError("give --models-dir DIR or --url URL")
    try:
        rows = folder_rows(models_dir) if models_dir else daemon_rows(str(url), api_key)
    except LlamactorError as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(table(rows, ["name", "kind", "size", "path"] if models_dir else ["name", "status", "size", "path"]))
