"""Fixtures of the KV tier tests: a real redis-server, a tiny block format, blocks cut from a real
pool tensor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import torch

from kvstore.chain import hash_blocks, root_hash
from kvstore.layout import KVFormat, KVLayout
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers.stored_block import StoredBlock
from ops.redis.server import RedisServer

TINY_LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
MakeBlocks = Callable[..., list[StoredBlock]]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # persist=False starts it with --save '' --appendonly no
    with RedisServer(Path(tmp_path_factory.mktemp("kv-redis")), persist=False) as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def tiny_fmt() -> KVFormat:
    """8 KiB blocks: 2 layers, K and V, 16 tokens, 2 kv heads, head dim 16, float32."""
    return KVFormat.from_layout(TINY_LAYOUT, "tiny-test")


@pytest.fixture
def make_blocks() -> MakeBlocks:
    """make_blocks(n, seed=0, first_token=300, layout=TINY_LAYOUT): a chain of n full blocks whose
    KV is cut from a random pool tensor, as the engine copies it out."""

    def make(
        n: int, seed: int = 0, first_token: int = 300, layout: KVLayout = TINY_LAYOUT
    ) -> list[StoredBlock]:
        gen = torch.Generator().manual_seed(seed)
        cache = KVCache(layout, num_blocks=n, device="cpu")
        cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=gen).to(layout.dtype))
        bs = layout.block_size
        # ids in [256, 65536): every pack of the same block count encodes to the same size
        tokens = [first_token + (seed * 7919 + i) % 30000 for i in range(n * bs)]
        hashes = hash_blocks(tokens, bs, ("tiny-test",))
        parents = [root_hash(("tiny-test",)), *hashes[:-1]]
        blocks = []
        for b in range(n):
            kv = cache.tensor[:, :, b * bs : (b + 1) * bs].contiguous()  # [layers, 2, bs, heads, dim]
            kv_bytes = kv.view(torch.uint8).numpy().tobytes()
            blocks.append(StoredBlock(hashes[b], parents[b], tuple(tokens[b * bs : (b + 1) * bs]), kv_bytes))
        return blocks

    return make
