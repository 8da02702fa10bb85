"""Telling an actor of the tree that may be gone: the one pykka call the tree's timers, pools and
actors share (the messages themselves, in ``llamactor.base.messages``, know nothing of pykka)."""

from __future__ import annotations

from typing import Any

import pykka


def tell_quietly(ref: pykka.ActorRef[Any], message: Any) -> None:
    """``tell``, except that a dead recipient (the tree is stopping or restarting) is not an error.
    Runs on whichever thread calls it (an actor's, a timer's, the preparation pool's)."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        pass
