"""The Redis tier's read of a session turn's partial last block (kvstore/tiers/tail.py): every
length the prompt allows is looked up in the tier's index in one round trip, the longest present
is read as any block is (verified tokens, a corrupt pack dropped)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.chain import BlockHash
from kvstore.redis.client import KV_ERRORS
from kvstore.tiers.tail import Tail, candidates, padded

if TYPE_CHECKING:
    from kvstore.redis.tier import RedisTier

log = logging.getLogger(__name__)


def get_tail(tier: RedisTier, parent: BlockHash, following: Sequence[int]) -> Tail | None:
    """The longest tail stored under `parent` whose tokens start `following` (the prompt's tokens
    after that block, its last one excluded); None when there is none (or Redis is away)."""
    bs = tier.fmt.block_size
    wanted = candidates(parent, following, bs)
    if not wanted:
        return None
    try:
        located: Any = tier.client.hmget(tier.keys.index, [h for h, _ in wanted])
    except KV_ERRORS as exc:  # a tail missed costs its tokens' compute, nothing more
        log.warning("looking up a session's tail in the Redis tier failed: %s", exc)
        return None
    for (block_hash, length), where in reversed(list(zip(wanted, located, strict=True))):
        if where is None:
            continue
        run = tier.get_run([block_hash], [padded(following[:length], bs)], cause="tail")
        return Tail.of(run[0], length) if run else None
    return None
