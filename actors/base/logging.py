"""Logging: library modules log through stdlib loggers; only entry points configure output.

Library modules (batcher, supervisor, router, HTTP app ...) get their logger with
``get_logger("llamactor.batcher")``. Their events (stable snake_case names such as
``request_finished`` with key=value context, ``request_id`` bound through
``structlog.contextvars`` where the work happens) become records of the stdlib logger of that
name. So, used as a library, llamactor follows the host application's logging: nothing is shown
unless the host configures stdlib logging (``logging.basicConfig(level=logging.INFO)`` shows the
info lines; with no configuration at all, Python's last-resort handler prints warnings and errors
to stderr, so a crashed batcher is not silent, while info lines such as ``batcher_started``
stay quiet). Nothing here configures structlog or the root logger unless an entry point asks.

``configure(fmt, level)`` is for entry points only (the ``llamactor`` CLI, the daemon it runs,
Ray Serve worker processes through ``configure_from_env()``): it owns the process, so it may
configure structlog globally and replace the root logger's handlers. ``configure_library_logging``
is the opt-in for library users who want llamactor's own lines on stderr without touching
their root logger; ``$LLAMACTOR_LOG_LEVEL`` (and ``$LLAMACTOR_LOG_FORMAT``) does the same when
set, applied once when the first llamactor logger is created.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

LogFormat = Literal["auto", "console", "json"]
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
NAMESPACE = "llamactor"  # every library logger is named "llamactor.<part>"
_ENV_LOCK = threading.Lock()
_env_applied = False


class _Event(dict[str, Any]):
    """A structlog event dict as a stdlib ``record.msg``: ``ProcessorFormatter`` (entry points)
    copies it as a dict and renders it as JSON or console; a host's plain formatter calls
    ``str()`` on it and gets ``batcher_started n_parallel=2 n_ctx=1024``."""

    def __str__(self) -> str:
        context = " ".join(f"{k}={v!r}" for k, v in self.items()
                           if k not in ("event", "exc_info") and not k.startswith("_"))
        return f"{self.get('event', '')} {context}".rstrip()


def _to_stdlib(logger: WrappedLogger, method_name: str,
               event_dict: EventDict) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Last processor: the arguments of the stdlib ``logger.<method>(msg, **kwargs)`` call.

    Like ``structlog.stdlib.ProcessorFormatter.wrap_for_formatter`` (``_logger``/``_name`` mark
    the record as structlog's), but the message also reads well with a host's own formatter, and
    an exception goes on the record too so that formatter prints its traceback."""
    exc_info = event_dict.get("exc_info")
    if exc_info is True:  # log.exception(...): resolve now, on the thread that caught it
        exc_info = event_dict["exc_info"] = sys.exc_info()
    elif isinstance(exc_info, BaseException):
        exc_info = event_dict["exc_info"] = (type(exc_info), exc_info, exc_info.__traceback__)
    kwargs: dict[str, Any] = {"extra": {"_logger": logger, "_name": method_name}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (_Event(event_dict),), kwargs


# filter_by_level first: a disabled level costs one isEnabledFor check, nothing is rendered.
_PROCESSORS: list[Processor] = [structlog.stdlib.filter_by_level, structlog.contextvars.merge_contextvars,
                                _to_stdlib]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The logger of a library module (call at import; the logger is thread-safe).

    A structlog ``BoundLogger`` over ``logging.getLogger(name)`` with its own processors, so it
    never depends on (or triggers) structlog's process-global configuration: where its records
    go and at which level is the stdlib configuration's business (the host's, or ``configure``)."""
    _apply_env_once()
    return structlog.stdlib.BoundLogger(logging.getLogger(name), _PROCESSORS, {})


def _formatter(fmt: str) -> logging.Formatter:
    """Renders llamactor's records (structured) and foreign ones (pykka, uvicorn) alike."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        raise ValueError(f"log format must be auto, console or json, got {fmt!r}")
    return structlog.stdlib.ProcessorFormatter(
        # add_logger_name reads the record of a foreign line: before remove_processors_meta drops it
        processors=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    # tracebacks inside the JSON object: a JSON log stays one object per line
                    *([structlog.processors.format_exc_info] if fmt == "json" else []), renderer],
    )


def _level(level: str) -> int:
    level_no = _LEVELS.get(level.lower())
    if level_no is None:
        raise ValueError(f"log level must be one of {', '.join(_LEVELS)}, got {level!r}")
    return level_no


def configure(fmt: LogFormat | str = "auto", level: str = "info") -> None:
    """Entry points only (CLI, daemon, Ray worker processes), on the main thread at start-up:
    configure logging for the whole process.

    llamactor's loggers log at ``level``, everything else (pykka, uvicorn) at warning or above;
    one stderr handler on the root logger renders all of it, console lines on a terminal and
    JSON lines otherwise (journald, supervisord, log shippers). structlog itself is routed into
    the same handler, for any other structlog logger in the process."""
    global _env_applied
    level_no = _level(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(fmt))
    with _ENV_LOCK:
        _env_applied = True  # the entry point's choice wins over $LLAMACTOR_LOG_LEVEL from now on
    structlog.configure(processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger,
                        logger_factory=structlog.stdlib.LoggerFactory(), cache_logger_on_first_use=True)
    _own_handlers(logging.getLogger(NAMESPACE), None, level_no)  # drop an env/opt-in handler: root's prints
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(level_no, logging.WARNING))


def configure_from_env() -> None:
    """``configure`` with ``$LLAMACTOR_LOG_FORMAT`` / ``$LLAMACTOR_LOG_LEVEL`` (auto / warning):
    for processes llamactor's code is the entry point of (Ray Serve replicas and ingress)."""
    configure(os.environ.get("LLAMACTOR_LOG_FORMAT", "auto"), os.environ.get("LLAMACTOR_LOG_LEVEL", "warning"))


def configure_library_logging(level: str = "info", fmt: LogFormat | str = "auto",
                              stream: TextIO | None = None) -> logging.Handler:
    """Opt-in for library use, from any thread: show llamactor's own log lines at ``level`` on
    ``stream`` (stderr), without touching the root logger or structlog's configuration.

    The handler sits on the ``llamactor`` logger, which stops propagating (no line twice through a
    host's root handler); returned so the host can remove it. Calling again replaces it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_formatter(fmt))
    _own_handlers(logging.getLogger(NAMESPACE), handler, _level(level))
    return handler


def _own_handlers(logger: logging.Logger, handler: logging.Handler | None, level_no: int) -> None:
    """Replace the handler we put on ``logger`` (never one the host put there) by ``handler``."""
    for old in [h for h in logger.handlers if getattr(h, "_llamactor", False)]:
        logger.removeHandler(old)
    if handler is not None:
        handler._llamactor = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = handler is None
    logger.setLevel(level_no)


def _apply_env_once() -> None:
    """``$LLAMACTOR_LOG_LEVEL`` set: the user asked for llamactor's lines (an explicit opt-in,
    like ``configure_library_logging``); it applies to llamactor's loggers only."""
    global _env_applied
    with _ENV_LOCK:
        if _env_applied:
            return
        _env_applied = True
    level = os.environ.get("LLAMACTOR_LOG_LEVEL")
    if level and level.lower() in _LEVELS:
        configure_library_logging(level, os.environ.get("LLAMACTOR_LOG_FORMAT", "auto"))
