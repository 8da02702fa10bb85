"""``--keys FILE``: the tenants' API keys, a TOML file of ``[[keys]]`` tables (``KeyTable``), read
at start and again on SIGHUP without a restart (the daemon's main thread, between requests: the
new table replaces the old one whole, so a request sees one or the other). A file that cannot be
read or is wrong at start ends the daemon with a reason; at a reload it is logged and the keys in
force stay. A key is never logged: the log names tenants.

    [[keys]]
    key_sha256 = "9f86d0..."        # or key = "sk-..." (sha256sum of the key: the file need not hold it)
    tenant = "alice"
    weight = 2                      # fair share against other backlogged tenants
    requests_per_minute = 600
    tokens_per_minute = 200000
    max_running = 8                 # sequences at once
    max_priority = "normal"         # "high" requests are lowered to this
    admin = true                    # /metrics, the detailed /health, model load/unload
    cache_scope = "team-a"          # tenants of one scope share cached prefixes
"""

from __future__ import annotations

import signal
import tomllib

from llamactor.base.errors import InvalidRequestError
from llamactor.base.logging import get_logger
from llamactor.base.tenants import KeyTable
from llamactor.http.state import ServerState, with_api_key

log = get_logger("llamactor.daemon")


def load_keys(path: str) -> KeyTable:
    """The file's keys; ``InvalidRequestError`` naming the file (and the table) if it is wrong."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise InvalidRequestError(f"{path}: {e}") from e
    return KeyTable.from_toml(data, path)


def reload_on_sighup(state: ServerState, path: str, api_key: str | None) -> None:
    """Main thread: read ``path`` again whenever the process gets SIGHUP."""
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reload_keys(state, path, api_key))


def reload_keys(state: ServerState, path: str, api_key: str | None, event: str = "keys_reloaded") -> None:
    """Read ``path`` again into ``state`` (logged as ``event``); a wrong file keeps the keys in force."""
    try:
        state.keys = with_api_key(load_keys(path), api_key)
    except InvalidRequestError as e:
        log.error("keys_reload_failed", file=path, reason=str(e))
        return
    log.info(event, file=path, tenants=sorted(t.name for t in state.keys.tenants))
