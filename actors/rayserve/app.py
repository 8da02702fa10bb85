"""``build_app``: a Ray Serve application of llamactor models; ``serve_on_ray``: run it.

    ingress ("llamactor-ingress", the OpenAI FastAPI app)
      └─ DeploymentHandle per model ─> "llamactor-<name>": N replicas, each a ReplicaServer
                                        holding one actor tree, routed by LlamactorRequestRouter

Each model's ``replicas`` become the deployment's ``num_replicas`` (or its ``autoscaling`` table
becomes Ray's ``autoscaling_config``); a replica reserves ``n_threads`` CPUs, so Ray places replicas
where cores are free. ``RAY_ADDRESS`` names a cluster to join; without it a local Ray starts.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from llamactor.base.config import Config
from llamactor.base.logging import get_logger
from llamactor.base.tenants import KeyTable
from llamactor.http.server import create_app
from llamactor.http.state import ServerState
from llamactor.base.logging import configure_from_env
from llamactor.serving.model_specs import ModelSpec
from llamactor.rayserve.remote import RemoteReplicas, RemoteRouter
from llamactor.rayserve.replica import ReplicaServer
from llamactor.rayserve.request_router import LlamactorRequestRouter

log = get_logger("llamactor.rayserve")
APP_NAME = "llamactor"
INGRESS_MAX_ONGOING = 4096


@serve.ingress()  # the app is built per ingress replica, after __init__ (it holds the handles)
class Ingress:
    def __init__(self, specs: list[ModelSpec], handles: list[DeploymentHandle], api_key: str | None,
                 max_body_bytes: int, keys: KeyTable | None = None, transport: Config | None = None,
                 bind_host: str = "127.0.0.1") -> None:
        configure_from_env()  # this Ray worker process is ours: its entry point
        self.state = ServerState([s.name for s in specs], api_key, max_body_bytes, keys, transport=transport,
                                 bind_host=bind_host)
        self.state.router = RemoteRouter([RemoteReplicas(s, h) for s, h in zip(specs, handles, strict=True)])

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.state)


def model_deployment(spec: ModelSpec) -> Any:
    """The Ray Serve deployment of one model, bound to its spec."""
    scaling: dict[str, Any] = ({"autoscaling_config": dict(spec.autoscaling)} if spec.autoscaling
                               else {"num_replicas": spec.replicas})
    deployment: Any = serve.deployment(
        ReplicaServer, name=f"llamactor-{spec.name}", **scaling,
        # a replica takes what its tree would queue; Ray's own default (5) would starve the batch
        max_ongoing_requests=spec.config.n_parallel + spec.config.max_queue,
        ray_actor_options={"num_cpus": spec.config.n_threads},
        request_router_config=RequestRouterConfig(
            # Union[str, Callable] in Ray's source; its pydantic model types the argument as a dict for mypy
            request_router_class=LlamactorRequestRouter,  # type: ignore[arg-type]
            request_router_kwargs={"policy": spec.policy, "imbalance_threshold": spec.imbalance_threshold}))
    return deployment.bind(spec)


def build_app(specs: list[ModelSpec], *, api_key: str | None = None, max_body_bytes: int = 4 << 20,
              keys: KeyTable | None = None, transport: Config | None = None, bind_host: str = "127.0.0.1") -> Any:
    """The application to ``serve.run``: the ingress over one deployment per model."""
    ingress: Any = serve.deployment(Ingress, name="llamactor-ingress", max_ongoing_requests=INGRESS_MAX_ONGOING,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(specs, [model_deployment(s) for s in specs], api_key, max_body_bytes, keys, transport,
                        bind_host)


def serve_on_ray(specs: list[ModelSpec], *, host: str, port: int, api_key: str | None,
                 max_body_bytes: int, keys: KeyTable | None = None, transport: Config | None = None) -> int:
    """``llamactor serve --ray``: deploy, wait for SIGTERM/SIGINT, then remove the app (and stop
    the local Ray instance if this process started it). ``keys``: the tenants' keys, read once
    (a SIGHUP does not reach the ingress replicas: redeploy to change them)."""
    import ray

    cluster = os.environ.get("RAY_ADDRESS")
    if cluster:
        ray.init(address=cluster)
    else:
        ray.init(include_dashboard=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, whose own SIGTERM handler aborts
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(specs, api_key=api_key, max_body_bytes=max_body_bytes, keys=keys, transport=transport,
                            bind_host=host), name=APP_NAME, route_prefix="/")
        for spec in specs:
            log.info("model_ready", model=spec.name, replicas=spec.replicas, ray=True)
        log.info("serving", address=f"http://{host}:{port}", models=[s.name for s in specs], ray=True,
                 cluster=cluster or "local")
        stop.wait()
        log.info("draining", ray=True)
    finally:
        if cluster:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
    log.info("stopped", exit_code=0)
    return 0
