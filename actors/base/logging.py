"""structlog configuration, done once by an entry point (CLI, daemon, ``start()`` if nobody did).

Console rendering when stderr is a terminal, JSON lines otherwise (journald, supervisord,
log shippers). Event names are stable snake_case (``request_finished``, ``batcher_stats``);
context such as ``request_id`` is bound with ``structlog.contextvars`` where the work happens.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "console", "json"]
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(fmt: LogFormat | str = "auto", level: str = "info") -> None:
    """Configure structlog (and stdlib logging, which pykka and uvicorn use) for this process."""
    level_no = _LEVELS.get(level.lower())
    if level_no is None:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        raise ValueError(f"log format must be auto, console or json, got {fmt!r}")
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # pykka and uvicorn log through the standard library: render their lines the same way, so a
    # JSON log stream stays one JSON object per line (tracebacks included).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, timestamper],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    *([structlog.processors.format_exc_info] if fmt == "json" else []), renderer],
    ))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(level_no, logging.WARNING))


def configure_default() -> None:
    """For library use: quiet unless ``$LLAMACTOR_LOG_LEVEL`` asks; never overrides the app's setup."""
    if not structlog.is_configured():
        configure(os.environ.get("LLAMACTOR_LOG_FORMAT", "auto"), os.environ.get("LLAMACTOR_LOG_LEVEL", "warning"))
