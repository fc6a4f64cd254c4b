"""Run the HTTP API (FastAPI app factory on uvicorn) from the settings."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.config import ApiConfig
from ops.settings import Settings
from ops.tokenizer import LazyTokenizer


def api_config(settings: Settings) -> ApiConfig:
    return settings.api_config()


def build_app(settings: Settings) -> FastAPI:
    """The app, with the served model's tokenizer for /tokenize and /detokenize (loaded on their
    first call: see ops/tokenizer.py)."""
    tokenizer = LazyTokenizer(settings.model, settings.cache_dir, settings.max_model_len)
    return create_app(api_config(settings), tokenizer)


def run_api(settings: Settings) -> None:
    uvicorn.run(
        build_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        timeout_keep_alive=settings.api_keep_alive_s,
        timeout_graceful_shutdown=10,
    )
