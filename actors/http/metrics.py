"""Prometheus metrics of the daemon: per-request counters and histograms, batcher gauges at scrape.

Each app owns its own ``CollectorRegistry`` (several apps may live in one test process). The
batchers' own counters are read from each replica's stats when Prometheus scrapes, not copied on
every step, and carry ``model`` and ``replica`` labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import compile_path

from llamactor.base.completion import Completion

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


LABELS = ["model", "replica"]
UNMATCHED = "unmatched"  # the one path label of every request that no route answers


class RouteTemplates:
    """The request counter's ``path`` label: the template of the route a path matches
    (``/v1/files/{file_id}``), never the raw path -- a label per raw path would let any caller
    grow the series without bound. Matched here, from the paths alone, so that a request refused
    before routing (a wrong key, a foreign Origin) is labelled the same way."""

    def __init__(self, templates: Iterable[str] = ()) -> None:
        self.templates = [(compile_path(t)[0], t) for t in dict.fromkeys(templates)]

    def label(self, path: str) -> str:
        return next((t for regex, t in self.templates if regex.match(path)), UNMATCHED)


ReplicaStats = list[tuple[str, int, dict[str, Any]]]  # (model, replica, published stats + in_flight/served)


def _families(family: type[GaugeMetricFamily] | type[CounterMetricFamily], replicas: ReplicaStats, part: str | None,
              table: dict[str, tuple[str, str]]) -> Iterator[Any]:
    """One metric family per ``table`` key (key -> (metric name, help)), a sample per replica whose
    stats (or their ``part``) hold that key."""
    for key, (name, doc) in table.items():
        metric = family(name, doc, labels=LABELS)
        for model, replica, stats in replicas:
            values = stats.get(part, {}) if part else stats
            if key in values:
                metric.add_metric([model, str(replica)], values[key])
        yield metric


# Speculation (docs/architecture.md, *Speculation*), named after vLLM's spec_decode series;
# absent from a batcher that does not draft.
SPECULATION_SERIES = {
    "proposed_draft_tokens": ("llamactor_spec_decode_proposed_tokens", "Tokens drafters (a prediction, n-gram "
                              "lookup) proposed, verified or not: the budget verifies what pays"),
    "draft_tokens": ("llamactor_spec_decode_draft_tokens", "Drafted tokens (a prediction's, n-gram lookup's) "
                     "verified in steps"),
    "accepted_draft_tokens": ("llamactor_spec_decode_accepted_tokens",
                              "Drafted tokens the model agreed with: output without a step of their own"),
    "rejected_draft_tokens": ("llamactor_spec_decode_rejected_tokens",
                              "Drafted tokens the model disagreed with: computed, then rolled back")}


class _BatcherCollector(Collector):
    def __init__(self, stats: Callable[[], ReplicaStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        s = self._stats()
        yield from _families(GaugeMetricFamily, s, None, {
            "running": ("llamactor_running_sequences", "Sequences being decoded"),
            "pending": ("llamactor_pending_requests", "Requests waiting for a sequence"),
            "kv_usage": ("llamactor_kv_cache_usage_ratio", "Share of KV cache cells in use"),
            "free_seq_ids": ("llamactor_free_seq_ids", "Sequence ids free in the pool"),
            "adapter_sets_running": ("llamactor_lora_sets_running", "LoRA adapter sets among the running sequences"),
            "embedding_waiting": ("llamactor_embedding_inputs_waiting", "Embedding inputs queued for a step"),
            "embedding_inputs_per_step": ("llamactor_embedding_inputs_per_step", "Mean inputs packed per embedding step"),
            "embedding_packing_efficiency": ("llamactor_embedding_packing_efficiency",
                                             "Mean tokens per embedding step / embedding_n_batch")})
        yield from _families(CounterMetricFamily, s, None, {
            "steps": ("llamactor_steps", "Decode steps (one llama_decode each)"),
            "step_sequences": ("llamactor_step_sequences", "Sequences summed over steps (/ steps = mean batch size)"),
            "restarts": ("llamactor_batcher_restarts", "Times the supervisor restarted the batcher"),
            "quarantined": ("llamactor_requests_quarantined", "Requests suspected of two batcher crashes, failed "
                            "with poison_request instead of replayed a third time"),
            "tokens_cached": ("llamactor_prompt_tokens_cached", "Prompt tokens attached from cached KV, not computed"),
            "prompt_tokens_computed": ("llamactor_prompt_tokens_computed", "Prompt tokens computed by llama_decode"),
            "preemptions": ("llamactor_preemptions", "Running sequences preempted for KV room (resumed later)"),
            "kv_flushes": ("llamactor_kv_flushes", "Batch-invariant mode: KV cache emptied at once for room or a seq_id"),
            "adapter_switches": ("llamactor_lora_switches", "Steps decoded under another LoRA adapter set than the one before"),
            "tokens_recomputed": ("llamactor_tokens_recomputed", "Tokens recomputed when resuming preempted sequences"),
            "watchdog_trips": ("llamactor_watchdog_trips", "Steps aborted by the watchdog (each restarts the batcher)"),
            "embedding_inputs": ("llamactor_embedding_inputs", "Embedding inputs computed"),
            "embedding_tokens": ("llamactor_embedding_tokens", "Tokens of the embedding inputs computed"),
            "embedding_steps": ("llamactor_embedding_steps", "Embedding steps (one llama_decode each)"),
            "grammar_rows": ("llamactor_grammar_rows", "Tokens drawn for grammar-constrained requests"),
            "grammar_rows_masked": ("llamactor_grammar_rows_masked",
                                    "Constrained draws the grammar refused, drawn again under the full mask"),
            "rows_dropped": ("llamactor_overlap_rows_dropped", "Overlapped steps: rows of sequences that ended while "
                             "their row was in flight (computed, not used)"),
            "steps_planned_ahead": ("llamactor_overlap_steps_planned_ahead", "Overlapped steps launched as laid out "
                                    "while the step before computed"),
            "tokens_sampled_in_graph": ("llamactor_tokens_sampled_in_graph",
                                        "Tokens drawn inside llama.cpp's decode graph (sample_in_graph)"),
            "graph_chain_changes": ("llamactor_graph_chain_changes", "Sampler chains attached to or detached from a "
                                    "sequence id: each makes llama.cpp re-plan its graph on the next decode"),
            "graph_chains_adopted": ("llamactor_graph_chains_adopted", "Parked sampler chains a new request took "
                                     "over instead of a re-plan")})
        yield from _families(CounterMetricFamily, s, None, SPECULATION_SERIES)
        yield from _families(CounterMetricFamily, s, "prefix_cache", {
            "lookups": ("llamactor_prefix_cache_lookups", "Admissions that looked for a cached prefix"),
            "hits": ("llamactor_prefix_cache_hits", "Admissions that attached a cached prefix"),
            "hit_tokens": ("llamactor_prefix_cache_hit_tokens", "Prompt tokens attached from the prefix cache"),
            "evicted_entries": ("llamactor_prefix_cache_evictions", "Cached prefixes dropped under KV pressure"),
            "evicted_cells": ("llamactor_prefix_cache_evicted_cells", "KV cells freed by evicting or trimming")})
        yield from _families(GaugeMetricFamily, s, "prefix_cache", {
            "entries": ("llamactor_prefix_cache_entries", "Cached prefixes held"),
            "cells": ("llamactor_prefix_cache_cells", "KV cells held by cached prefixes alone"),
            "pinned_cells": ("llamactor_prefix_cache_pinned_cells", "KV cells of pinned prefixes (the system prompt)")})
        by_priority = GaugeMetricFamily("llamactor_pending_requests_by_priority", "Requests waiting, by base priority",
                                        labels=[*LABELS, "priority"])
        oldest = GaugeMetricFamily("llamactor_oldest_waiting_effective_priority",
                                   "Effective (aged) priority of the request waiting longest", labels=LABELS)
        ready = GaugeMetricFamily("llamactor_ready", "1 when the replica's batcher is up", labels=LABELS)
        in_flight = GaugeMetricFamily("llamactor_router_in_flight_requests",
                                      "Requests the router has sent to the replica and not seen finish", labels=LABELS)
        served = CounterMetricFamily("llamactor_router_requests", "Requests the router sent to the replica",
                                     labels=LABELS)
        for model, replica, stats in s:
            labels = [model, str(replica)]
            for priority, n in stats.get("pending_by_priority", {}).items():
                by_priority.add_metric([*labels, priority], n)
            if stats.get("oldest_waiting_priority") is not None:
                oldest.add_metric(labels, stats["oldest_waiting_priority"])
            ready.add_metric(labels, 1 if stats.get("state") == "ready" else 0)
            in_flight.add_metric(labels, stats.get("in_flight", 0))
            served.add_metric(labels, stats.get("served", 0))
        yield from (by_priority, oldest, ready, in_flight, served)


class Metrics:
    def __init__(self, stats: Callable[[], ReplicaStats]) -> None:
        self.registry = CollectorRegistry()
        self.routes = RouteTemplates()  # the app's, once it is made (server.create_app)
        self.requests = Counter("llamactor_http_requests", "HTTP requests by route template and status",
                                ["path", "status"], registry=self.registry)
        # request series carry the dialect the request came in (openai, responses, anthropic, ollama)
        by = ["model", "dialect"]
        self.prompt_tokens = Counter("llamactor_prompt_tokens", "Prompt tokens of finished requests", by,
                                     registry=self.registry)
        self.generated_tokens = Counter("llamactor_generated_tokens", "Tokens generated", by, registry=self.registry)
        self.accepted_predicted = Counter("llamactor_accepted_prediction_tokens", "Drafted tokens the model agreed "
                                          "with, in finished requests' usage", by, registry=self.registry)
        self.rejected_predicted = Counter("llamactor_rejected_prediction_tokens", "Drafted tokens the model "
                                          "disagreed with, in finished requests' usage", by, registry=self.registry)
        self.ttft = Histogram("llamactor_time_to_first_token_seconds", "Submit to first token", by,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.latency = Histogram("llamactor_request_latency_seconds", "Submit to last token", by,
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        # Per tenant (the tenants of the keys file: a bounded set; "default" without one)
        self.tenant_requests = Counter("llamactor_tenant_requests", "Requests finished (a completion, a rerank), by tenant", ["tenant"],
                                       registry=self.registry)
        self.tenant_prompt_tokens = Counter("llamactor_tenant_prompt_tokens", "Prompt tokens, by tenant", ["tenant"],
                                            registry=self.registry)
        self.tenant_generated_tokens = Counter("llamactor_tenant_generated_tokens", "Tokens generated, by tenant",
                                               ["tenant"], registry=self.registry)
        self.tenant_refused = Counter("llamactor_tenant_rate_limited", "Requests answered 429 (quota or full "
                                      "queue), by tenant", ["tenant"], registry=self.registry)
        self.tenant_ttft = Histogram("llamactor_tenant_time_to_first_token_seconds", "Submit to first token, by tenant",
                                     ["tenant"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_BatcherCollector(stats))

    def observer(self, model: str, dialect: str, tenant: str) -> Callable[[Completion], None]:
        """What counts each finished completion of ``model`` asked for in ``dialect`` by ``tenant``."""
        prompt, generated = self.prompt_tokens.labels(model, dialect), self.generated_tokens.labels(model, dialect)
        drafted = self.accepted_predicted.labels(model, dialect), self.rejected_predicted.labels(model, dialect)
        ttft, latency = self.ttft.labels(model, dialect), self.latency.labels(model, dialect)
        counts = (self.tenant_requests.labels(tenant), self.tenant_prompt_tokens.labels(tenant),
                  self.tenant_generated_tokens.labels(tenant), self.tenant_ttft.labels(tenant))

        def observe(completion: Completion) -> None:
            prompt.inc(completion.usage.prompt_tokens)
            generated.inc(completion.usage.completion_tokens)
            drafted[0].inc(completion.usage.accepted_prediction_tokens)
            drafted[1].inc(completion.usage.rejected_prediction_tokens)
            ttft.observe(completion.timings.ttft_ms / 1000)
            latency.observe(completion.timings.total_ms / 1000)
            requests, tenant_prompt, tenant_generated, tenant_ttft = counts
            requests.inc()
            tenant_prompt.inc(completion.usage.prompt_tokens)
            tenant_generated.inc(completion.usage.completion_tokens)
            tenant_ttft.observe(completion.timings.ttft_ms / 1000)
        return observe

    def count_rerank(self, model: str, dialect: str, tenant: str, prompt_tokens: int) -> None:
        """A finished rerank or score request (no completion of its own): one of the tenant's
        requests, however many queries and documents it held, and the prompt tokens it computed
        (its ``Reranking.prompt_tokens``), counted as a completion's are, by model and dialect and by tenant."""
        self.prompt_tokens.labels(model, dialect).inc(prompt_tokens)
        self.tenant_requests.labels(tenant).inc()
        self.tenant_prompt_tokens.labels(tenant).inc(prompt_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
