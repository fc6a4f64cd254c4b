"""TierReader: the Redis tier's read path. Finds a run of blocks through the index, decodes their
packs as they stream in (tier_fetch), then does the read's bookkeeping: the packs used become the
most recent and keep their TTL, and the index entries of corrupt or vanished packs are repaired.

On a Redis Cluster a pack that did not come may be on a shard that is down, not gone: only packs
their shard says are absent are repaired (the others may come back with their shard)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from kvstore.chain import BlockHash
from kvstore.layout import KVFormat
from kvstore.redis import nodes, scripts
from kvstore.redis.client import KV_ERRORS, KVClient, is_cluster
from kvstore.redis.fetch import PackFetcher
from kvstore.redis.keys import PACK_TTL_S, TierKeys
from kvstore.tiers.codec import decode_pack
from kvstore.tiers.quant import TierDtype
from kvstore.tiers.stored_block import StoredBlock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierRead:
    blocks: list[StoredBlock]  # the run
    blocks_read: int  # decoded, or dropped by the codec, from the packs fetched
    bytes_read: int
    packs_dropped: int  # corrupt or foreign packs, deleted


class TierReader:
    def __init__(
        self, client: KVClient, keys: TierKeys, fmt: KVFormat, tier_dtype: TierDtype, fetcher: PackFetcher
    ) -> None:
        self.client = client
        self.keys = keys
        self.fmt = fmt
        self.tier_dtype = tier_dtype
        self.fetcher = fetcher
        self.cluster = is_cluster(client)
        self._repair_script = scripts.TierScript(client, scripts.REPAIR)

    def locate(self, hashes: Sequence[BlockHash]) -> list[bytes | None]:
        """The pack key of each block, None where the index has none (one round trip)."""
        return cast("list[bytes | None]", self.client.hmget(self.keys.index, list(hashes)))

    def read_run(
        self, hashes: Sequence[BlockHash], token_ids: Sequence[Sequence[int]] | None, cause: str = "job"
    ) -> TierRead:
        """The valid blocks of hashes[0], hashes[1], ... up to the first one missing (RedisTier.get_run);
        `cause`: one of keys.READ_CAUSES, for the counters."""
        lead = leading(self.locate(hashes))
        stream = self.fetcher.stream(list(dict.fromkeys(lead)))
        bytes_read = 0
        opened: dict[bytes, dict[BlockHash, StoredBlock]] = {}  # pack key -> its valid blocks
        corrupt: list[bytes] = []
        missing: list[bytes] = []  # (hash, pack key): an index entry naming a pack that is gone
        used: list[bytes] = []  # packs the run came from, in order
        run: list[StoredBlock] = []
        blocks_read = 0
        for i, pack_key in enumerate(lead):
            if pack_key not in opened:
                streamed_key, data = next(stream)  # packs arrive in the order of their first use
                assert streamed_key == pack_key
                if data is None:  # evicted since the index was read (by us or by Redis), or deleted
                    missing += [hashes[i], pack_key]
                    break
                bytes_read += len(data)
                decoded = decode_pack(self.fmt, data, self.tier_dtype)
                blocks_read += len(decoded.blocks) + decoded.dropped
                opened[pack_key] = {b.block_hash: b for b in decoded.blocks}
                if decoded.reason is not None:  # its valid blocks still serve this read
                    corrupt.append(pack_key)
            block = opened[pack_key].get(hashes[i])
            if block is None:  # dropped by the codec, or never in the pack its index names
                if pack_key not in corrupt:
                    corrupt.append(pack_key)
                break
            if token_ids is not None and tuple(token_ids[i]) != block.token_ids:
                break
            run.append(block)
            if not used or used[-1] != pack_key:
                used.append(pack_key)
        stream.close()
        self._touch(used, len(run), len(hashes) - len(run), bytes_read, blocks_read, cause)
        if corrupt or missing:
            self._repair(corrupt, missing)
        return TierRead(run, blocks_read, bytes_read, len(corrupt))

    def _repair(self, corrupt: list[bytes], missing: list[bytes]) -> None:
        """Drop corrupt packs, and the traces of packs gone (on a cluster: their shard says so)."""
        try:
            if self.cluster and missing:
                absent = nodes.gone(self.client, missing[1::2])
                missing = [x for i, ok in enumerate(absent) if ok for x in missing[2 * i : 2 * i + 2]]
            if not corrupt and not missing:
                return
            _, dropped = self._repair_script(self.keys.namespace(), [len(corrupt), *corrupt, *missing])
            if dropped:
                nodes.unlink(self.client, dropped)
        except KV_ERRORS:  # e.g. OOM, a shard away: the next reader repairs it
            log.warning("repairing the Redis tier failed", exc_info=True)

    def _touch(
        self, used: list[bytes], hits: int, misses: int, bytes_read: int, blocks_read: int, cause: str
    ) -> None:
        """A read's bookkeeping: the packs used are the most recent now, their TTL renewed, the
        shared counters raised (blocks_fetched: the blocks of the packs fetched, used or not: a
        pack is read whole). Best effort: a Redis at maxmemory may refuse it, the read stands."""
        pipe = self.client.pipeline(transaction=False)
        if used:
            now = time.time()
            pipe.zadd(self.keys.lru, {key: now - j * 1e-6 for j, key in enumerate(used)}, xx=True)
            if not self.cluster:
                for key in used:
                    pipe.expire(key, PACK_TTL_S)
        c = self.keys.counters
        counts = (
            ("hits", hits),
            ("misses", misses),
            ("bytes_read", bytes_read),
            (f"bytes_read_{cause}", bytes_read),
            ("blocks_fetched", blocks_read),
        )
        for name, value in counts:
            if value:
                pipe.hincrby(c, name, value)
        try:
            pipe.execute()
            if self.cluster and used:  # packs on their own shards, each alone
                nodes.run(self.client, [("EXPIRE", key, PACK_TTL_S) for key in used])
        except KV_ERRORS:
            log.warning("updating the Redis tier's LRU and counters failed", exc_info=True)


def leading(located: list[bytes | None]) -> list[bytes]:
    """The pack keys up to the first block the index does not hold."""
    lead = []
    for pack_key in located:
        if pack_key is None:
            break
        lead.append(pack_key)
    return lead
