"""Background work at low priority, interactive requests at high: the interactive ones take the
next free sequence, ahead of the queued batch jobs; the batch jobs still finish (they age).

Run it with `make chat` done once (the default model installed): `.venv/bin/python examples/priorities.py`.
"""

import llamactor

with llamactor.start(n_parallel=2) as llm:
    batch = [llm.submit(f"Summary {i}: the harbour report says", max_tokens=48, priority="low") for i in range(12)]
    interactive = llm.submit("User: What time does the ferry leave?\nAssistant:", max_tokens=24, stop="\nUser:",
                             priority="high")
    c = interactive.result()
    print(f"interactive: waited {c.timings.queue_ms:.0f} ms for a sequence, {c.timings.ttft_ms:.0f} ms to first token")
    done = [f.result() for f in batch]
    print(f"batch: {len(done)} done, longest wait {max(d.timings.queue_ms for d in done):.0f} ms")
    print({k: llm.stats()[k] for k in ("schedule_policy", "preemptions", "pending_by_priority")})
