"""Run the HTTP API (FastAPI app factory on uvicorn) from the settings."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from api.config import ApiConfig
from api.tenants import parse_pairs
from ops.settings import Settings


def api_config(settings: Settings) -> ApiConfig:
    return ApiConfig(
        redis_url=settings.redis_url,
        kv_redis_url=settings.kv_redis_url,
        served_models=(settings.served_model,),
        api_key=settings.api_key,
        api_keys=parse_pairs(settings.api_keys),
        api_keys_file=settings.api_keys_file,
        tenant_max_jobs=settings.tenant_max_jobs,
        job_timeout_s=float(settings.job_time_limit_s),
        job_ttl_s=settings.job_ttl_s,
        routing=settings.routing,  # type: ignore[arg-type]  # ApiConfig validates it
    )


def run_api(settings: Settings) -> None:
    uvicorn.run(
        create_app(api_config(settings)),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )
