"""Run the HTTP API (FastAPI app factory on uvicorn) from the settings."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from api.config import ApiConfig
from ops.settings import Settings


def api_config(settings: Settings) -> ApiConfig:
    return ApiConfig(
        redis_url=settings.redis_url,
        served_models=(settings.served_model,),
        api_key=settings.api_key,
        job_timeout_s=float(settings.job_time_limit_s),
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
