"""``llamactor.scheduling.interactive_watch``: others' work believed once it lasts, held for a
while, and the job's own ended lines never mistaken for it. The runner acting on it, on a fake
client: tests/jobs/test_jobs.py; on the real daemon: tests/http/test_frontend_jobs.py."""

from __future__ import annotations

import pytest

from llamactor.scheduling.interactive_watch import InteractiveWatch

pytestmark = pytest.mark.pure


def test_other_callers_work_counts_only_once_it_lasts_two_steps_and_then_holds_for_a_while() -> None:
    watch = InteractiveWatch(confirm_steps=2, hold_s=3.0)
    assert not watch.observe(2, 100, 10.0)   # a first sighting may be a step-old count of our own lines
    assert not watch.observe(1, 101, 10.1)
    assert not watch.observe(0, 101, 10.2)   # gone at the next look: it was
    assert not watch.observe(1, 102, 10.3)
    assert not watch.observe(1, 102, 11.0)   # however long a step takes, a step-old count is not believed
    assert watch.observe(1, 104, 11.5)       # still there two steps later: others have work
    assert watch.observe(0, 110, 13.0)       # held after they finish, for the next arrival
    assert not watch.observe(0, 120, 14.6)


def test_lines_the_job_saw_end_count_as_its_own_in_stats_as_old_as_when_they_ended() -> None:
    watch = InteractiveWatch(confirm_steps=2, hold_s=3.0)
    for step in range(100, 120, 2):  # a line ends every other step, and each snapshot still counts one
        watch.saw_end(1, step)
        assert not watch.observe(1, step, step / 10)  # (without saw_end: believed from step 102 on)
    watch.saw_end(1, 130)
    assert not watch.observe(2, 130, 13.0)  # one more than the line that ended: a first sighting
    assert watch.observe(1, 132, 13.2)      # a newer snapshot no longer counts the ended line: others'
    restarted = InteractiveWatch(confirm_steps=0, hold_s=0.0)
    restarted.saw_end(1, 500)
    assert restarted.observe(1, 3, 1.0)  # a restarted batcher counts from zero: old ends no longer match
