"""Run the HTTP API (FastAPI app factory on uvicorn) from the settings."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from api.config import ApiConfig
from ops.settings import Settings


def api_config(settings: Settings) -> ApiConfig:
    return settings.api_config()


def run_api(settings: Settings) -> None:
    uvicorn.run(
        create_app(api_config(settings)),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )
