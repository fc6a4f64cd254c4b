"""KeptTails: the last, partial block of each finished turn, kept in the pool for the next turn.

Only full blocks are hashed and shareable, so a finished turn's partial last block (up to
block_size - 1 computed tokens) would be freed and recomputed by the session's next turn, whose
prompt starts with exactly those tokens. Instead the block keeps its reference here, filed under
the hash of the block before it (its chain position), and the next sequence whose tokens at that
position start with its tokens takes it over whole: it writes on into the same block, so nothing
is shared and nothing is copied. Tails are bounded in number and given back first whenever the
pool runs short, so they never stand in the way of an admission or a decode. A tail may also come
from Redis (adopt(): a turn moved here, whose previous turn ran elsewhere and wrote its tail
through, kvstore/tiers/tail.py); `on_change(parent, held)` tells the thread-safe view of what this
worker holds (ResidentBlocks) which parents have a tail, so a prefetch never fetches one kept here."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kvstore.chain import BlockHash
from kvstore.pool.block import Block
from kvstore.pool.block_pool import BlockPool

MAX_WANTED = 4096


class KeptTails:
    def __init__(self, pool: BlockPool, max_tails: int) -> None:
        self.pool = pool
        self.max_tails = max_tails
        self._tails: OrderedDict[BlockHash, tuple[Block, tuple[int, ...]]] = OrderedDict()
        self._wanted: set[str] = set()
        self._fetched: set[BlockHash] = set()  # parents whose tail came from Redis (adopt)
        self.on_change: Callable[[BlockHash, bool], None] | None = None
        self.kept = self.taken = self.dropped = self.adopted = 0

    def __len__(self) -> int:
        return len(self._tails)

    def want(self, request_id: str) -> None:
        """Keep this request's tail when it finishes (a session turn: a next turn will come).
        Called from a submitting thread: a set's add is atomic, and the engine reads it later."""
        if len(self._wanted) >= MAX_WANTED:  # ids of requests that never ran: a tail lost, no more
            self._wanted.clear()
        self._wanted.add(request_id)

    def wants(self, request_id: str) -> bool:
        return request_id in self._wanted

    def forget(self, request_id: str) -> None:
        self._wanted.discard(request_id)

    def holds(self, parent: BlockHash) -> bool:
        return parent in self._tails

    def keep(self, parent: BlockHash, block: Block, tokens: tuple[int, ...]) -> bool:
        """File `block` (holding exactly `tokens`, one reference: the caller's, now ours)."""
        if self.max_tails <= 0 or block.ref_cnt != 1 or not 0 < len(tokens) < self.pool.block_size:
            return False
        old = self._tails.pop(parent, None)
        if old is not None:
            self._drop(old[0])
        self._tails[parent] = (block, tokens)
        self._fetched.discard(parent)
        self.kept += 1
        self._changed(parent, True)
        while len(self._tails) > self.max_tails:
            self._pop_oldest()
        return True

    def adopt(self, parent: BlockHash, block: Block, tokens: tuple[int, ...]) -> bool:
        """keep() a tail fetched from Redis (its bytes written into `block` already)."""
        if not self.keep(parent, block, tokens):
            return False
        self._fetched.add(parent)
        self.adopted += 1
        return True

    def matched(self, parent: BlockHash, tokens: list[int]) -> int:
        """How many of `tokens` take() would give (0: none); changes nothing."""
        kept = self._tails.get(parent)
        if kept is None:
            return 0
        tail = kept[1]
        return len(tail) if len(tokens) >= len(tail) and tuple(tokens[: len(tail)]) == tail else 0

    def take(self, parent: BlockHash, tokens: list[int]) -> tuple[Block, int, bool] | None:
        """The tail under `parent` if `tokens` (what follows the parent, the last prompt token
        excluded: it is always computed) start with all of its tokens; the caller owns it then.
        (block, tokens matched, whether it came from Redis)."""
        matched = self.matched(parent, tokens)
        if not matched:
            return None
        block = self._tails.pop(parent)[0]
        fetched = parent in self._fetched
        self._fetched.discard(parent)
        self.taken += 1
        self._changed(parent, False)
        return block, matched, fetched

    def make_room(self, need: int) -> None:
        """Give back the oldest tails until the pool has `need` free blocks (or none is left)."""
        while self._tails and self.pool.num_free_blocks < need:
            self._pop_oldest()

    def clear(self) -> None:
        while self._tails:
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        parent, (block, _) = self._tails.popitem(last=False)
        self._fetched.discard(parent)
        self._drop(block)
        self._changed(parent, False)

    def _drop(self, block: Block) -> None:
        self.dropped += 1
        self.pool.free([block])

    def _changed(self, parent: BlockHash, held: bool) -> None:
        if self.on_change is not None:
            self.on_change(parent, held)
