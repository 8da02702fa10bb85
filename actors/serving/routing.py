"""Which replica of a model gets a request: the routing policies (docs/architecture.md,
*Several models and replicas*).

Pure code, no threads and no I/O: the caller (``Replicas`` in-process, or the Ray Serve request
router) owns a ``RoutingPolicy``, tells it each replica's load when asking for a ranking, and
tells it where the request went. Replicas are named by any hashable id (an index in-process, a
Ray ``ReplicaID`` under Ray Serve), so replicas may come and go between calls.

- ``shortest_queue``: an idle replica first, then the fewest requests in flight
  (waiting + running); ties rotate, so equal replicas share the work.
- ``round_robin``: each replica in turn, whatever its load.
- ``prefix_affinity`` (Ray Serve LLM's prefix-aware router): the replica that recently served the
  longest part of this prompt, whose prefix cache most likely still holds its KV; shortest queue
  when the loads differ by more than ``imbalance_threshold`` requests, or when no replica holds a
  worthwhile part of the prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("shortest_queue", "round_robin", "prefix_affinity")
BLOCK_CHARS = 64  # the prefix record's granularity: a prompt is matched in blocks of this many characters


def routing_key(text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                token_ids: Sequence[int] | None = None) -> str:
    """The text a prompt is matched on: a conversation's next turn extends its previous turn's key.

    Chat messages are joined as ``role`` and ``content`` with separators the template would not
    produce, so the key of ``messages[:k]`` is a prefix of the key of ``messages``."""
    if text is not None:
        return text
    if messages is not None:
        return "".join(f"{m.get('role', '')}\x1f{m.get('content') or ''}\x1e" for m in messages
                       if isinstance(m, Mapping))
    if token_ids is not None:
        return ",".join(map(str, token_ids)) + ","
    return ""


class PrefixRecord:
    """Which replica recently served which prompt prefixes, as chained hashes of full blocks.

    The hash of block ``i`` covers blocks ``0..i`` (as vLLM's prefix-caching block hashes do), so
    one dict lookup per block tells whether a replica served that whole prefix. Entries are
    ``(block hash, replica)`` in least-recently-used order; the oldest go beyond ``max_entries``,
    as the replicas' own caches evict their least recently used prefixes."""

    def __init__(self, block_chars: int = BLOCK_CHARS, max_entries: int = 1 << 16) -> None:
        if block_chars < 1 or max_entries < 1:
            raise ValueError("block_chars and max_entries must be >= 1")
        self.block_chars = block_chars
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, Hashable], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _hashes(self, key: str) -> Iterable[int]:
        h = 0
        for start in range(0, len(key) - self.block_chars + 1, self.block_chars):
            h = hash((h, key[start:start + self.block_chars]))
            yield h

    def match(self, key: str, replicas: Iterable[Hashable]) -> dict[Hashable, int]:
        """Characters of ``key`` each replica served recently (a multiple of ``block_chars``)."""
        matched = {r: 0 for r in replicas}
        alive = list(matched)
        for i, h in enumerate(self._hashes(key)):
            alive = [r for r in alive if (h, r) in self._entries]
            if not alive:
                break
            for r in alive:
                matched[r] = (i + 1) * self.block_chars
        return matched

    def record(self, key: str, replica: Hashable) -> None:
        """``replica`` now holds ``key``'s KV (it is serving the request)."""
        for h in self._hashes(key):
            entry = (h, replica)
            self._entries[entry] = None
            self._entries.move_to_end(entry)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        """``replica`` lost its cache (unloaded, restarted, gone)."""
        for entry in [e for e in self._entries if e[1] == replica]:
            del self._entries[entry]


@dataclass(slots=True)
class RoutingPolicy:
    """One model's routing state. ``rank`` orders replicas best first; ``routed`` records the choice."""

    name: str = "shortest_queue"
    imbalance_threshold: int = 4  # prefix_affinity: in-flight spread beyond which load wins over cache
    min_match_ratio: float = 0.1  # prefix_affinity: the least share of the key worth following
    record: PrefixRecord = field(default_factory=PrefixRecord)
    _turn: int = 0  # rotation: round robin's next replica, and the tie-break of equal loads

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"routing policy must be one of {', '.join(POLICIES)}, got {self.name!r}")
        if self.imbalance_threshold < 0:
            raise ValueError(f"imbalance_threshold must be >= 0, got {self.imbalance_threshold}")
        if not 0.0 <= self.min_match_ratio <= 1.0:
            raise ValueError(f"min_match_ratio must be in [0, 1], got {self.min_match_ratio}")

    def rank(self, key: str, in_flight: Mapping[Hashable, int]) -> list[Hashable]:
        """All replicas of ``in_flight`` (replica -> requests waiting or running there), best first."""
        if not in_flight:
            return []
        replicas = list(in_flight)
        rotated = replicas[self._turn % len(replicas):] + replicas[:self._turn % len(replicas)]
        self._turn += 1
        if self.name == "round_robin":
            return rotated
        # sort is stable: among equal loads the rotation decides. Idle (0) sorts first.
        by_load = sorted(rotated, key=lambda r: in_flight[r])
        if self.name == "shortest_queue" or not key:
            return by_load
        loads = in_flight.values()
        if max(loads) - min(loads) > self.imbalance_threshold:
            return by_load
        matched = self.record.match(key, replicas)
        best = max(by_load, key=lambda r: matched[r])  # the first of the longest matches: least loaded
        if matched[best] == 0 or matched[best] < self.min_match_ratio * len(key):
            return by_load
        return [best] + [r for r in by_load if r != best]

    def routed(self, key: str, replica: Hashable) -> None:
        if self.name == "prefix_affinity" and key:
            self.record.record(key, replica)

    def forget(self, replica: Hashable) -> None:
        self.record.forget(replica)
