"""``/health`` and ``/metrics``: what probes and scrapers read (uvicorn's event loop). Without
tenants' keys both are open; with them, ``/metrics`` is for admin keys (the middleware) and
``/health`` tells anyone else only its status. Published stats never wait for an actor; under
Ray Serve they are remote calls, so both read them off the loop. The detailed ``/health`` names
each replica's backend devices (CPU, CUDA0 ...) with their free memory, as its batcher last read it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llamactor.http.state import State, model_status

router = APIRouter()


@router.get("/health")
async def health(request: Request, state: State) -> JSONResponse:
    """Ready when every loaded replica is (a model that is not loaded loads on its first request)."""
    if state.router is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    replicas = await asyncio.to_thread(state.replica_stats)
    models: dict[str, Any] = {name: {"status": "unloaded", "replicas": []} for name in state.model_names}
    for name, i, s in replicas:
        models[name]["replicas"].append({"replica": i, "status": s.get("state"), "running": s.get("running"),
                                         "pending": s.get("pending"), "devices": s.get("devices"),
                                         "batch_invariant": s.get("batch_invariant")})
    for entry in models.values():
        entry["status"] = model_status({r["status"] for r in entry["replicas"]})
    ready = not state.draining and all(m["status"] in ("ready", "degraded", "unloaded") for m in models.values())
    status = "draining" if state.draining else "ready" if ready else "unavailable"
    tenant = request.state.tenant
    if state.tenant_keys and not (tenant is not None and tenant.admin):  # liveness alone: supervisors need no key
        return JSONResponse({"status": status}, status_code=200 if ready else 503)
    return JSONResponse({"status": status, "running": sum(r.get("running") or 0 for _, _, r in replicas),
                         "pending": sum(r.get("pending") or 0 for _, _, r in replicas), "models": models},
                        status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    body = await asyncio.to_thread(state.metrics.render)  # under Ray Serve, rendering asks the replicas
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
