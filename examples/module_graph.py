"""The package's module graph at the grain a reader meets it: one box per top-level module or
sub-package of ``llamactor`` (``llamactor.native`` is one), with the arrows between boxes, how many
levels they stack into, and how many run upward against the layer list.

Built from ``tests/test_layers.py``'s own graph (every import statement, deferred ones included),
so it counts what the layer test checks. Run from the repository root:

    .venv/bin/python examples/module_graph.py          # totals, then the boxes by level
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_layers import graph, layer_of  # noqa: E402


def box_of(module: str) -> str:
    """``llamactor.x.y`` -> ``llamactor.x``; ``llamactor.native.*`` -> ``llamactor.native``."""
    return ".".join(module.split(".")[:2])


def box_graph() -> dict[str, set[str]]:
    boxes: dict[str, set[str]] = {}
    for module, targets in graph().items():
        boxes.setdefault(box_of(module), set()).update(box_of(t) for t in targets)
    for box, targets in boxes.items():
        targets.discard(box)
    return boxes


def levels(boxes: dict[str, set[str]]) -> dict[str, int]:
    """Each box's level: 0 for a box that imports no other, else one above the highest it imports."""
    @cache
    def level(box: str) -> int:
        return 1 + max((level(t) for t in boxes[box]), default=-1)
    return {box: level(box) for box in boxes}


def main() -> None:
    boxes = box_graph()
    level = levels(boxes)
    arrows = [(a, b) for a, targets in boxes.items() for b in targets]
    upward = [(a, b) for a, b in arrows if layer_of(b) > layer_of(a)]
    print(f"boxes {len(boxes)}  levels {max(level.values()) + 1}  arrows {len(arrows)}  upward {len(upward)}")
    for n in sorted(set(level.values()), reverse=True):
        print(f"  level {n}: " + ", ".join(sorted(b for b in boxes if level[b] == n)))
    for a, b in upward:
        print(f"  upward: {a} -> {b}")


if __name__ == "__main__":
    main()
