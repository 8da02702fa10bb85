"""The texts of the *speculation* workload: code blocks to edit and reports to summarize.

Deterministic and distinct per index (names from ``prompts``), so each stream edits its own block
and every run sees the same inputs.
"""

from __future__ import annotations

from llamactor.bench.prompts import ANIMALS, TOWNS, TRADES

EDIT_INSTRUCTION = ("Rewrite the following Python code with the default number of retries changed from 3 to 5. "
                    "Reply with the complete code and nothing else.")
COPY_INSTRUCTION = ("Summarize the following report in a few sentences, quoting its most important sentences "
                    "word for word.")

BLOCK = '''import json
import time
from dataclasses import dataclass, field


@dataclass
class {Trade}Order:
    """An order for the {trade} of {town}: what was asked, by whom, and when it is due."""

    customer: str
    items: list[str] = field(default_factory=list)
    due_days: int = {days}
    paid: bool = False

    def total(self, prices: dict[str, float]) -> float:
        return sum(prices.get(item, 0.0) for item in self.items)


def load_{trade}_orders(path: str, retries: int = 3) -> list[{Trade}Order]:
    """Read the {town} orders file, trying again while it is being written."""
    for attempt in range(retries):
        try:
            with open(path) as f:
                rows = json.load(f)
            return [{Trade}Order(**row) for row in rows]
        except json.JSONDecodeError:
            time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"could not read {{path}} after {{retries}} tries")


def overdue(orders: list[{Trade}Order], today: int) -> list[str]:
    """The customers of the {animal} market whose orders are past due and still unpaid."""
    return [order.customer for order in orders if not order.paid and order.due_days < today]
'''

SENTENCES = (
    "The {trade} of {town} opened a second workshop near the river in the spring.",
    "Orders from the {animal} market doubled after the new road was finished.",
    "The town council agreed to lower the rent of the old hall to {n} silver coins a month.",
    "Three apprentices joined the workshop, and two of them came from {other}.",
    "A late frost damaged the harvest, so the price of grain rose by a fifth.",
    "The {trade} now delivers to {other} every Tuesday and every Friday.",
    "Customers complained that deliveries were often a day late in the autumn.",
    "The council will review the market rules at its next meeting in {town}.",
)


def code_block(i: int) -> str:
    """The ``i``-th block to edit: about 300 tokens of Python."""
    trade = TRADES[i % len(TRADES)]
    return BLOCK.format(Trade=trade.title(), trade=trade, town=TOWNS[i % len(TOWNS)],
                        animal=ANIMALS[i % len(ANIMALS)], days=7 + i)


def report_text(i: int) -> str:
    """The ``i``-th report to summarize: eight sentences about a town's trade."""
    names = {"trade": TRADES[i % len(TRADES)], "town": TOWNS[i % len(TOWNS)], "animal": ANIMALS[i % len(ANIMALS)],
             "other": TOWNS[(i + 5) % len(TOWNS)], "n": 12 + i}
    return " ".join(sentence.format(**names) for sentence in SENTENCES)
