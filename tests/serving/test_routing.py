"""The routing policies and the prefix record: pure logic, no engine (see test_router.py for the real one)."""

from __future__ import annotations

import pytest

from llamactor.serving.routing import PrefixRecord, RoutingPolicy, routing_key

pytestmark = pytest.mark.pure

LONG_HISTORY = "User: tell me about the sea, at length and with care.\nAssistant: " * 8


def test_shortest_queue_puts_an_idle_replica_first_then_the_fewest_in_flight() -> None:
    policy = RoutingPolicy("shortest_queue")
    assert policy.rank("", {0: 3, 1: 0, 2: 1})[0] == 1
    assert policy.rank("", {0: 3, 1: 2, 2: 5}) == [1, 0, 2]


def test_shortest_queue_rotates_among_equally_loaded_replicas() -> None:
    policy = RoutingPolicy("shortest_queue")
    firsts = [policy.rank("", {0: 0, 1: 0, 2: 0})[0] for _ in range(6)]
    assert sorted(firsts) == [0, 0, 1, 1, 2, 2]


def test_round_robin_takes_each_replica_in_turn_whatever_its_load() -> None:
    policy = RoutingPolicy("round_robin")
    assert [policy.rank("", {0: 9, 1: 0})[0] for _ in range(4)] == [0, 1, 0, 1]


def test_prefix_affinity_sends_the_next_turn_to_the_replica_that_served_the_previous_one() -> None:
    policy = RoutingPolicy("prefix_affinity")
    first_turn = routing_key(messages=[{"role": "user", "content": LONG_HISTORY}])
    served_by = policy.rank(first_turn, {0: 0, 1: 0})[0]
    policy.routed(first_turn, served_by)
    next_turn = routing_key(messages=[{"role": "user", "content": LONG_HISTORY},
                                      {"role": "assistant", "content": "It is wide."},
                                      {"role": "user", "content": "And deep?"}])
    assert next_turn.startswith(first_turn)
    other = 1 - served_by
    # balanced within the threshold, even with the other replica idle: the cache wins
    assert policy.rank(next_turn, {served_by: 2, other: 0})[0] == served_by
    # beyond the threshold the shortest queue wins
    assert policy.rank(next_turn, {served_by: 9, other: 0})[0] == other


def test_prefix_affinity_without_a_worthwhile_match_is_the_shortest_queue() -> None:
    policy = RoutingPolicy("prefix_affinity")
    policy.routed("x" * 64 + LONG_HISTORY, 0)
    assert policy.rank("y" * 64 + LONG_HISTORY, {0: 0, 1: 1})[0] == 0
    assert policy.rank("y" * 64 + LONG_HISTORY, {0: 2, 1: 1})[0] == 1
    # a match of less than min_match_ratio of the prompt is not worth following
    policy.routed("z" * 64, 1)
    assert policy.rank("z" * 64 + "q" * 6400, {0: 0, 1: 1})[0] == 0


def test_the_prefix_record_matches_whole_blocks_and_forgets_the_least_recently_used() -> None:
    record = PrefixRecord(block_chars=4, max_entries=3)
    record.record("abcdefgh", "r0")  # two blocks
    assert record.match("abcdefgX", ["r0", "r1"]) == {"r0": 4, "r1": 0}
    assert record.match("abcdefghij", ["r0"]) == {"r0": 8}
    record.record("wxyz", "r1")  # a third entry: nothing evicted yet
    record.record("ABCD", "r1")  # a fourth: the oldest ("abcd" on r0) goes
    assert len(record) == 3
    assert record.match("abcdefgh", ["r0"]) == {"r0": 0}  # the chain starts at the evicted block
    record.forget("r1")
    assert record.match("wxyz", ["r1"]) == {"r1": 0} and len(record) == 1


def test_a_chat_key_extends_the_key_of_the_conversation_so_far() -> None:
    turn = [{"role": "user", "content": "hi"}]
    assert routing_key(messages=[*turn, {"role": "assistant", "content": "hello"}]).startswith(routing_key(messages=turn))
    assert routing_key(token_ids=[1, 2, 3]).startswith(routing_key(token_ids=[1, 2]))
    assert not routing_key(token_ids=[1, 23]).startswith(routing_key(token_ids=[1, 2]))


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="shortest_queue"):
        RoutingPolicy("random")
