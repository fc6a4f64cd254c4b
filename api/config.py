"""ApiConfig: everything the HTTP edge needs, fixed at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from api.scale.policy import ScalePolicy
from broker.celery_app import BrokerConfig
from broker.defaults import DEFAULTS, Routing

__all__ = ["ApiConfig", "Routing"]


@dataclass(frozen=True, slots=True)
class ApiConfig:
    redis_url: str = DEFAULTS.redis_url  # or a Sentinel address (broker/redis/connect.py)
    accept_replicas: int = DEFAULTS.accept_replicas  # under Sentinel: WAIT for them before a 202
    accept_wait_ms: int = DEFAULTS.accept_wait_ms
    served_models: tuple[str, ...] = (DEFAULTS.model,)  # a request naming another model gets 404
    api_key: str | None = None  # None: no auth; else "Authorization: Bearer <key>" is required
    job_timeout_s: float = float(DEFAULTS.job_time_limit_s)  # the longest a request waits for its job
    max_body_bytes: int = 4 * 1024 * 1024
    job_ttl_s: int = DEFAULTS.job_ttl_s  # how long job metadata (and so GET /v1/jobs/{id}) lives
    routing: Routing = DEFAULTS.routing  # or "round-robin" / "shared" (baselines for the benchmark)
    prefetch_hints: bool = DEFAULTS.prefetch_hints  # see api/routing/router.py choose_queue
    session_move_after_turns: int = DEFAULTS.session_move_after_turns  # see api/routing/router.py _Choice
    session_move_every_turns: int = DEFAULTS.session_move_every_turns  # api/routing/hints.py Move
    redis_tier: bool = True  # whether workers run the Redis tier: routing counts a loaded prefix cheap
    route_max_waiting: int = 8  # a worker with more sequences waiting than this is not routed to
    api_keys: tuple[tuple[str, str], ...] = ()  # (key, tenant) pairs; see api/tenants.py
    api_keys_file: Path | None = None  # one "key tenant" per line, re-read when it changes
    api_keys_reload_s: float = DEFAULTS.api_keys_reload_s  # the file is looked at this often at most
    metrics_token: str | None = DEFAULTS.metrics_token  # None: /metrics is open (a scraper's network)
    tenant_max_jobs: int = DEFAULTS.tenant_max_jobs  # unfinished jobs per tenant (over it: 429); 0 = no cap
    dispatch_headroom: int = DEFAULTS.dispatch_headroom  # per worker: the window is the rest (api/dispatch/)
    fair_quota: int = DEFAULTS.fair_quota  # released jobs per unit of weight a tenant always gets
    batch_expiry_s: int = DEFAULTS.batch_expiry_s  # a batch unfinished this long after creation expires
    batch_lease_ttl_s: float = DEFAULTS.batch_lease_ttl_s  # api/batches/lease.py
    # A chat's max_tokens when it names none. None (the default): the worker decides, with its
    # Settings.default_max_tokens capped by the room the context leaves.
    default_max_tokens: int | None = None
    tool_call_parser: str = DEFAULTS.tool_call_parser  # how the model writes tool calls (api/tool_calls/)
    files_dir: Path = DEFAULTS.cache_dir / "files"  # /v1/files contents (api/files/store.py)
    files_max_bytes: int = int(DEFAULTS.files_max_bytes)
    files_max_lines: int = DEFAULTS.files_max_lines
    files_batch_expiry_s: int = DEFAULTS.files_batch_expiry_s  # docs/files.md#retention; 0: kept
    batch_output_expiry_s: int = DEFAULTS.batch_output_expiry_s
    batch_retention_s: int = DEFAULTS.batch_retention_s
    response_ttl_s: int = DEFAULTS.response_ttl_s  # stored responses and conversations (docs/api.md)
    files_sweep_interval_s: float = DEFAULTS.files_sweep_interval_s  # api/files/sweeper.py
    files_orphan_grace_s: int = DEFAULTS.files_orphan_grace_s
    tenant_max_files: int = DEFAULTS.tenant_max_files  # quotas (api/files/quota.py); 0: no cap
    tenant_max_file_bytes: int = int(DEFAULTS.tenant_max_file_bytes)
    tenant_max_batches: int = DEFAULTS.tenant_max_batches
    # the scaling policy behind kvferry_desired_workers (api/scale/policy.py)
    scale_min_workers: int = DEFAULTS.scale_min_workers
    scale_max_workers: int = DEFAULTS.scale_max_workers
    scale_wait_target_s: float = DEFAULTS.scale_wait_target_s
    scale_in_hold_s: float = DEFAULTS.scale_in_hold_s
    scale_spare_seats: int = DEFAULTS.scale_spare_seats
    scale_growth_lead_s: float = DEFAULTS.scale_growth_lead_s

    def __post_init__(self) -> None:
        if self.routing not in get_args(Routing):
            raise ValueError(f"routing must be cache-aware, round-robin or shared, got {self.routing!r}")
        if not self.served_models:
            raise ValueError("served_models must name at least one model")
        if self.job_timeout_s <= 0 or self.max_body_bytes <= 0 or self.job_ttl_s <= 0:
            raise ValueError("job_timeout_s, max_body_bytes and job_ttl_s must be positive")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no auth) or a non-empty string")
        if self.metrics_token is not None and not self.metrics_token:
            raise ValueError("metrics_token must be None (open /metrics) or a non-empty string")
        if self.tenant_max_jobs < 0:
            raise ValueError("tenant_max_jobs must be >= 0 (0: no cap)")
        if self.response_ttl_s <= 0:
            raise ValueError("response_ttl_s must be positive (every stored response expires)")
        if self.batch_lease_ttl_s <= 0 or self.api_keys_reload_s <= 0:
            raise ValueError("batch_lease_ttl_s and api_keys_reload_s must be positive")
        if self.session_move_after_turns < 0 or self.session_move_every_turns < 0:
            raise ValueError("session_move_after_turns and session_move_every_turns must be >= 0 (0: off)")
        if self.dispatch_headroom < 0 or self.fair_quota < 0:
            raise ValueError("dispatch_headroom and fair_quota must be >= 0")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be None or positive")
        if self.files_max_bytes <= 0 or self.files_max_lines <= 0:
            raise ValueError("files_max_bytes and files_max_lines must be positive")
        retention = (self.files_batch_expiry_s, self.batch_output_expiry_s, self.batch_retention_s)
        quotas = (self.tenant_max_files, self.tenant_max_file_bytes, self.tenant_max_batches)
        if min(*retention, *quotas, self.files_orphan_grace_s) < 0 or self.files_sweep_interval_s <= 0:
            raise ValueError("retention times and quotas must be >= 0 (0: none), files_sweep_interval_s > 0")

    @property
    def scale_policy(self) -> ScalePolicy:
        return ScalePolicy(
            self.scale_min_workers,
            self.scale_max_workers,
            self.scale_wait_target_s,
            scale_in_hold_s=self.scale_in_hold_s,
            spare_seats=self.scale_spare_seats,
            growth_lead_s=self.scale_growth_lead_s,
        )

    @property
    def broker(self) -> BrokerConfig:
        return BrokerConfig(redis_url=self.redis_url)
