"""The Celery app Flower loads under Sentinel (`celery -A ops.stack.flower_app flower`): kombu's
sentinel transport needs its master name and the sentinels' password as transport options, which
no broker URL carries; this app builds them from the KVFERRY_* settings like every other part."""

from __future__ import annotations

from broker.celery_app import make_celery
from ops.settings import Settings

app = make_celery(Settings.from_env().broker_config(), name="kvferry-flower", send_only=True)
