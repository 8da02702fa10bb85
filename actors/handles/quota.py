"""``QuotaClient``: a model client whose requests wait for their tenant's rate limits instead of
being refused: what a daemon's batch job runs its lines through, so that a tenant's batch lines
spend the same requests and tokens per minute as its interactive requests (one ``Limiter``), and
a job over them slows down rather than failing lines. Everything else goes to the model's client.

Called on a job's worker thread (a request may block there, in ``Limiter.submit``, until the
buckets refill, or until the job's ``stop`` is set).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.logging import get_logger
from llamactor.base.messages import CallerMessage, Generate
from llamactor.base.tenants import Tenant
from llamactor.base.tool_format import ToolCallFormat
from llamactor.handles.delivery import Future
from llamactor.handles.limits import RateLimiter, WaitForLimits
from llamactor.handles.model import ModelClient

log = get_logger("llamactor.jobs")


class QuotaClient(ModelClient):
    def __init__(self, model: ModelClient, limiter: RateLimiter, stop: threading.Event, what: str) -> None:
        """``what`` names the work in the log (a batch id)."""
        self.model, self.quota, self.what = model, limiter, what
        self.config, self.name = model.config, model.name
        self.rate_wait = WaitForLimits(stop, self._log_wait)  # the tenant's buckets refill, or the job stops

    @property
    def limiter(self) -> RateLimiter:  # type: ignore[override]
        return self.quota

    def _log_wait(self, tenant: Tenant, seconds: float) -> None:
        log.info("job_waits_for_rate_limit", batch_id=self.what, tenant=tenant.name, wait_s=round(seconds, 2))

    # -- the model's own -----------------------------------------------------------------------

    def send(self, msg: CallerMessage) -> Future[Any]:
        return self.model.send(msg)

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Any]]:
        return self.model.send_n(msgs)

    def cancel(self, request_id: str) -> None:
        self.model.cancel(request_id)

    @property
    def loaded(self) -> bool:
        return self.model.loaded

    @property
    def info(self) -> EngineInfo:
        return self.model.info

    def tool_format(self) -> ToolCallFormat:
        return self.model.tool_format()

    def sampling_defaults(self) -> SamplingParams:
        return self.model.sampling_defaults()

    def load(self) -> None:
        self.model.load()

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        return self.model.replica_stats(exact=exact)
