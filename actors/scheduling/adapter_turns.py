"""Which LoRA adapter set the next step decodes under (pure: the scheduler calls it on the
batcher's thread).

llama.cpp applies adapters to a whole context, so one ``llama_decode`` runs under one set:
running sequences are grouped by their set, and each step serves one group. Groups take turns,
least recently served first -- round robin: a group new to the running set (or back in it) joins
behind the groups already waiting, ties going to the one whose oldest sequence came first -- so
no group is served twice while another waits, with ``k`` groups running each gets a step at
least every ``k`` steps, and every sequence decodes at the same rate whatever its group's size. With one group -- every request on the base model, the common case -- nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llamactor.base.adapters import AdapterSet
from llamactor.scheduling.sequence import Sequence


class AdapterTurns:
    """Turn order between the running sequences' adapter sets. Batcher thread only."""

    def __init__(self) -> None:
        self.step = 0
        self.last_served: dict[AdapterSet, int] = {}  # set -> the step it was last served at
        self.switches = 0  # steps under another set than the step before (llama.cpp re-plans its graph)
        self.previous: AdapterSet = ()

    def order(self, running: Iterable[Sequence]) -> Iterator[AdapterSet]:
        """The running sets, the one whose turn it is first (the scheduler serves the first that
        has work for this step), then the others in turn order."""
        first_seen: dict[AdapterSet, float] = {}
        for seq in running:
            first_seen[seq.adapters] = min(first_seen.get(seq.adapters, seq.submitted_at), seq.submitted_at)
        for gone in set(self.last_served) - set(first_seen):  # a set back later joins as new
            del self.last_served[gone]
        for new in set(first_seen) - set(self.last_served):  # it queues behind those already waiting
            self.last_served[new] = self.step
        yield from sorted(first_seen, key=lambda s: (self.last_served[s], first_seen[s]))

    def served(self, adapters: AdapterSet) -> None:
        """This step decodes ``adapters``' sequences."""
        self.step += 1
        self.last_served[adapters] = self.step
        self.switches += adapters != self.previous
        self.previous = adapters

    def running_sets(self, running: Iterable[Sequence]) -> int:
        """How many adapter sets the running sequences use (1 or 0: no turns to take)."""
        return len({s.adapters for s in running})


def group(running: Iterable[Sequence], adapters: AdapterSet) -> list[Sequence]:
    """The running sequences that decode under ``adapters``, in running order."""
    return [s for s in running if s.adapters == adapters]
