"""One fixed-size slot of the KV pool, as the bookkeeping sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.chain import BlockHash


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once, when the block is full and committed
    token_ids: tuple[int, ...] = ()  # stored with the hash to verify hits
    num_tokens: int = 0  # filled slots, set by the engine as it writes tokens
    # Intrusive links of the free queue; out of repr so printing a block does not walk the list.
    prev_free: Block | None = field(default=None, repr=False)
    next_free: Block | None = field(default=None, repr=False)

    def reset_hash(self) -> None:
        self.block_hash = None
        self.token_ids = ()
