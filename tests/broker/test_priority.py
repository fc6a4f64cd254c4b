"""Bands (broker/priority.py): each class keeps to its own bands, priority orders within a class,
and the band lists are the ones kombu's Redis channel itself pushes to and BRPOPs."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from kombu.transport import redis as kombu_redis

from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import encode_job
from broker.messages import GenerateJob


@pytest.mark.parametrize(
    ("job_class", "prio", "expected"),
    [
        ("interactive", 0, 2),
        ("interactive", -1, 1),
        ("interactive", -(2**31), 0),
        ("interactive", 2, 4),
        ("interactive", 2**31 - 1, 4),
        ("batch", 0, 7),
        ("batch", -(2**31), 5),
        ("batch", -1, 6),
        ("batch", 99, 9),
    ],
)
def test_band(job_class: priority.JobClass, prio: int, expected: int) -> None:
    assert priority.band(job_class, prio) == expected


def test_every_interactive_band_is_served_before_every_batch_band() -> None:
    prios = range(-10, 11)
    assert max(priority.band("interactive", p) for p in prios) < min(priority.band("batch", p) for p in prios)


class _Channel:
    """Just enough of kombu's Redis channel to call its own key mapping."""

    sep = kombu_redis.Channel.sep
    priority_steps: ClassVar[list[int]] = list(priority.PRIORITY_STEPS)
    priority = kombu_redis.Channel.priority
    _q_for_pri = kombu_redis.Channel._q_for_pri


def test_queue_keys_are_kombus() -> None:
    app = make_celery(BrokerConfig(), send_only=True)
    options: dict[str, Any] = app.conf.broker_transport_options
    assert tuple(options["priority_steps"]) == priority.PRIORITY_STEPS
    assert kombu_redis.Channel.sep == priority.SEP
    channel = _Channel()
    for band in priority.PRIORITY_STEPS:
        key = priority.queue_key(keys.SHARED_QUEUE, band)
        assert key == channel._q_for_pri(keys.SHARED_QUEUE, band)
        assert priority.split_key(key) == (keys.SHARED_QUEUE, band)
    assert priority.queue_keys("q")[0] == "q"
    app.close()


def test_job_band_from_the_wire_and_the_struct() -> None:
    job = GenerateJob(model="m", prompt="x", job_class="batch", priority=-1)
    assert priority.job_band(job) == priority.job_band(encode_job(job)) == 6
    assert priority.job_band(encode_job(GenerateJob(model="m", prompt="x"))) == 2


@pytest.mark.parametrize(("payload", "band"), [({"properties": {"priority": 7}}, 7), ({}, 0), (None, 0)])
def test_message_band(payload: Any, band: int) -> None:
    assert priority.message_band(payload) == band
