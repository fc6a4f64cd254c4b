"""A real engine whose KV pool is the bound, read the way the api reads a worker's heartbeat
(figures_of, the heartbeat's EngineFigures, into the scaling signal and policy): it runs fewer
sequences than its seats, the rest wait in it, and the policy asks for more workers where the
seats alone would not; the oldest unstarted sequence's wait reaches the policy as lateness."""

from __future__ import annotations

import dataclasses
import random

from api.routing.fleet import WorkerView
from api.scale.policy import ScalePolicy, raw_desired
from api.scale.signal import fleet_load
from broker.messages import WorkerStatus
from broker.sampling import SamplingParams
from broker.worker_registry import decode_status, encode_status
from tests.workers._helpers import NO_EOS, TinyModel, make_engine, random_prompt
from workers.engine.requests.request import GenerationRequest
from workers.process.status import figures_of

POLICY = ScalePolicy(min_workers=1, max_workers=8, target_seat_use=0.8)


def test_a_full_pool_reads_as_a_full_worker(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=12, max_num_seqs=8)  # 16-token blocks
    now = [100.0]
    engine.scheduler.clock = lambda: now[0]
    rng = random.Random(43)
    for i in range(6):  # 40-token prompts (3 blocks each, 4 with their outputs): the pool fits 3-4
        params = SamplingParams(max_tokens=30, **NO_EOS)
        engine.add_request(GenerationRequest(f"r{i}", random_prompt(rng, 40), params))
    for _ in range(3):
        engine.step()
        engine.check_integrity()
    now[0] += 3.0  # the ones left waiting have waited 3 s in the engine

    figures = figures_of(engine.stats())
    assert 0 < figures.num_running < 6 and figures.num_running + figures.num_waiting == 6, figures
    assert figures.pool_blocks_used > 0.75 * figures.pool_blocks_total, figures
    assert figures.oldest_waiting_s == 3.0
    sent = WorkerStatus("w1@t", "q", "tiny", 6, 0, 0, 0.0, figures, concurrency=8, seats=8)
    status = decode_status(encode_status(sent))  # as the heartbeat carries it through Redis
    assert status == sent
    load = fleet_load([WorkerView("w1@t", True, status)], {"interactive": figures.num_waiting}, None)

    assert load.seats_usable is not None and load.seats_usable < 5  # the pool, not the 8 seats
    seats_only = dataclasses.replace(load, seats_usable=None, engine_wait_s=0.0)
    assert raw_desired(POLICY, seats_only) == 1  # 6 / 6.4: one worker is plenty, by seats
    assert raw_desired(POLICY, dataclasses.replace(load, engine_wait_s=0.0)) >= 2  # by pool room
    assert raw_desired(POLICY, dataclasses.replace(load, seats_usable=None)) == 2  # late: + 1
