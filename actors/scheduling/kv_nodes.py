"""The prefix index's radix nodes (``llamactor.scheduling.prefix_index``): a ``Node`` is a physical
run of KV cells -- its tokens at positions ``[start, end)``, held by every seq_id in its
``seq_ids`` -- and these functions walk, split and cut such nodes; ``KvOp`` and ``Match`` are what
the index answers with. Pure bookkeeping, run on the batcher's thread through the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class KvOp:
    """``seq_rm(seq_id, p0, -1)`` (``p0 = 0``: the whole sequence), or with ``src`` set,
    ``seq_cp(src, seq_id, 0, p0)``: attach the first ``p0`` cells of ``src`` to ``seq_id``.
    ``save``: the tokens of a cached entry this ``seq_rm`` evicts, whose KV goes to the lower
    cache tier first (only when the index was made with ``offer_evicted``) if that pays
    (``tier_cost``): ``runs``, about how many contiguous runs its cells make, and ``returning``,
    whether its prefix was used again before, tell what saving it costs and may bring."""

    seq_id: int
    p0: int = 0
    src: int = -1
    save: tuple[int, ...] = ()
    scope: str | None = None  # the evicted entry's cache scope (with ``save``)
    runs: int = 0  # with ``save``
    returning: bool = False  # with ``save``

    def __post_init__(self) -> None:
        if self.seq_id < 0 or self.p0 < 0 or (self.src >= 0 and self.p0 == 0):
            raise ValueError(f"bad KV operation {self!r}")


@dataclass(frozen=True, slots=True)
class IdleEntry:
    """A cached entry no running sequence holds all of: ``own_cells`` held by it alone, last used
    at ``last_used``; ``n_tokens``, ``runs`` and ``returning`` as its evicting ``KvOp`` would carry."""

    seq_id: int
    own_cells: int
    last_used: float
    n_tokens: int
    runs: int
    returning: bool


@dataclass(frozen=True, slots=True)
class Match:
    n_tokens: int  # leading tokens whose KV is in the cache
    seq_id: int  # a sequence holding them (-1 when n_tokens == 0)


@dataclass(slots=True, eq=False)
class Node:
    tokens: list[int]
    start: int  # position of tokens[0]
    parent: Node | None
    seq_ids: set[int] = field(default_factory=set)
    children: list[Node] = field(default_factory=list)
    last_used: float = 0.0
    runs: int = 1  # contiguous runs of cells its tokens were computed into (about)
    reused: bool = False  # attached by a later sequence, or restored from a lower tier

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def path(node: Node) -> Iterator[Node]:
    """``node`` and its ancestors, the root excluded."""
    while node.parent is not None:
        yield node
        node = node.parent


def descendants(root: Node) -> Iterator[Node]:
    """Every node under ``root``."""
    stack = list(root.children)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def split(node: Node, at: int) -> Node:
    """Cut ``node`` after ``at`` tokens; return the head (same cells, now two nodes)."""
    assert 0 < at < len(node.tokens) and node.parent is not None
    head_runs = max(1, node.runs * at // len(node.tokens))
    head = Node(node.tokens[:at], node.start, node.parent, set(node.seq_ids), [node], node.last_used,
                head_runs, node.reused)
    node.runs = max(1, node.runs - head_runs)
    node.parent.children[node.parent.children.index(node)] = head
    node.tokens, node.start, node.parent = node.tokens[at:], node.start + at, head
    return head


def unlink(node: Node) -> int:
    """Take the childless ``node`` out of the tree; the cells it held, now free."""
    assert node.parent is not None and not node.children
    node.parent.children.remove(node)
    return len(node.tokens)


def cut(leaf: Node, seq_id: int, n: int) -> tuple[Node, int]:
    """Keep only the first ``n`` cells of ``seq_id`` (ending in ``leaf``), whose tail beyond ``n``
    it owns alone: its new leaf, and the cells freed."""
    node, freed = leaf, 0
    while node.start >= n:
        assert node.parent is not None and node.seq_ids == {seq_id}
        parent = node.parent
        freed += unlink(node)
        node = parent
    if node.end > n:
        assert node.seq_ids == {seq_id}
        freed += node.end - n
        node.runs = max(1, node.runs * (n - node.start) // len(node.tokens))
        del node.tokens[n - node.start:]
    return node, freed


def own_tail(leaf: Node, seq_id: int) -> int:
    """Cells that only ``seq_id`` (ending in ``leaf``) holds: all at the end of its path."""
    n = 0
    for node in path(leaf):
        if node.seq_ids != {seq_id}:
            break
        n += len(node.tokens)
    return n
