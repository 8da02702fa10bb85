"""Our routing policies (``llamactor.serving.routing``) as a Ray Serve request router.

Ray Serve calls ``choose_replicas`` on the caller's (the ingress replica's) event loop with the
replicas that can take the request; we rank them with a ``RoutingPolicy``, one replica per rank,
so Ray tries them in our order (skipping any whose queue is full). Loads are Ray's cached queue
lengths of each replica (its requests waiting + running).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from llamactor.base.messages import Generate
from llamactor.serving.routing import RoutingPolicy, routing_key


def _key(pending_request: PendingRequest | None) -> str:
    """The routing key of a ``ReplicaServer.run(msgs, stream)`` call: its first message's prompt."""
    msgs = pending_request.args[0] if pending_request is not None and pending_request.args else None
    msg = msgs[0] if isinstance(msgs, list) and msgs else None
    return routing_key(msg.text, msg.messages, msg.token_ids) if isinstance(msg, Generate) else ""


class LlamactorRequestRouter(RequestRouter):
    """``request_router_kwargs``: ``policy`` (shortest_queue | round_robin | prefix_affinity) and
    ``imbalance_threshold``."""

    def initialize_state(self, policy: str = "shortest_queue", imbalance_threshold: int = 4, **_: Any) -> None:
        self._policy = RoutingPolicy(policy, imbalance_threshold)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        loads: dict[Hashable, int] = {rid: self.replica_queue_len_cache.get(rid) or 0 for rid in by_id}
        return [[by_id[rid]] for rid in self._policy.rank(_key(pending_request), loads)]  # type: ignore[index]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._policy.routed(_key(pending_request), replica_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._policy.forget(replica_id)
