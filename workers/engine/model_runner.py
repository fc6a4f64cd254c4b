"""ModelRunner: the device side. Turns a scheduled batch into one forward over the paged pool."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from kvstore.pool.kv_cache import KVCache
from workers.engine.kernels import paged_attention
from workers.engine.kernels import paged_decode as kernel
from workers.engine.kernels.fused_decoder import FusedDecoder
from workers.engine.kernels.packed_linear import pack_linears
from workers.engine.kernels.paged_attention import (
    AttentionMetadata,
    DecodeBucket,
    DecodeTable,
    PrefillSegment,
)
from workers.engine.scheduling.scheduler import ScheduledSeq


@dataclass(frozen=True, slots=True)
class StepLogits:
    """sample: fp32 logits [sampling seqs, vocab], in batch order of the sequences whose `samples`
    is True. prompt: for each sequence whose prompt logits are asked for (needs_prompt_logits),
    its first position in this step and the hidden states [positions, hidden] of the prompt
    positions that predict a prompt token (the model's logits() turns them into logits)."""

    sample: torch.Tensor
    prompt: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)  # id(seq) -> (pos, hidden)


class ModelRunner:
    def __init__(
        self,
        model: PreTrainedModel,
        kv_cache: KVCache,
        packed: bool = False,
        decode_kernel: bool = False,
        fused_decode: bool = False,
    ) -> None:
        paged_attention.register()
        model.set_attn_implementation(paged_attention.ATTN_IMPLEMENTATION)
        if packed:
            pack_linears(model)
        self.model = model
        self.decoder = getattr(model, model.base_model_prefix)
        self.kv_cache = kv_cache
        self.block_size = kv_cache.layout.block_size
        self.device = kv_cache.tensor.device
        self._offsets = torch.arange(self.block_size, device=self.device)
        # Decodes read in place by the CPU kernel where it applies and builds; else gather + SDPA.
        self.decode_kernel = (
            decode_kernel
            and self.device.type == "cpu"
            and self.model.dtype == torch.float32  # the activations (bf16 CPU engines: linears only)
            and kv_cache.tensor.dtype in kernel.POOL_DTYPES
            and kv_cache.layout.head_dim in kernel.HEAD_DIMS
            and kernel.available()
        )
        # Every step runs the whole decoder stack in one C++ call where the model allows it, up to
        # the row count measured at start-up (fused_crossover.py).
        self.fused = FusedDecoder.build(model, kv_cache) if fused_decode and self.decode_kernel else None

    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        """Pool slots of positions [start, end) of a sequence with this block table."""
        first, last = start // self.block_size, (end - 1) // self.block_size + 1
        table = torch.tensor(block_ids[first:last], device=self.device)
        slots = (table[:, None] * self.block_size + self._offsets).flatten()  # [blocks * bs]
        base = first * self.block_size
        return slots[start - base : end - base]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [rows, vocab] of hidden states [rows, hidden]."""
        return self.model.lm_head(hidden).float()

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> StepLogits:
        """Forward every scheduled token; the logits that pick tokens, and the prompt positions'
        hidden states where a sequence asks for its prompt's logprobs."""
        # Rows: prefill chunks (>1 token) first, then single-token steps, batched together.
        prefills = [s for s in batch if s.num_new_tokens > 1]
        # Longest context first, so that decodes of similar length sit in adjacent rows (buckets).
        singles = sorted(
            (s for s in batch if s.num_new_tokens == 1), key=lambda s: -s.seq.num_computed_tokens
        )
        ordered = prefills + singles

        input_ids: list[int] = []
        positions: list[int] = []
        sample_rows: dict[int, int] = {}  # id(seq) -> row
        prompt_rows: dict[int, tuple[int, int, int]] = {}  # id(seq) -> (first row, count, position)
        for item in ordered:
            seq, n = item.seq, item.num_new_tokens
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            if item.samples:
                sample_rows[id(seq)] = len(input_ids) + n - 1
            predicting = min(end, seq.num_prompt_tokens - 1) - start  # positions before the last prompt token
            if seq.needs_prompt_logits and predicting > 0:
                prompt_rows[id(seq)] = (len(input_ids), predicting, start)
            input_ids.extend(seq.token_slice(start, end))
            positions.extend(range(start, end))
        ids = torch.tensor(input_ids, device=self.device)
        pos = torch.tensor(positions, device=self.device)
        if self.fused is not None and self.fused.takes(len(input_ids)):
            # Each row attends over its own context: its sequence's table, length pos + 1.
            blocks = self._row_tables(ordered)
            slots = blocks.gather(1, (pos // self.block_size)[:, None])[:, 0] * self.block_size
            chunks = torch.tensor([s.num_new_tokens for s in prefills], dtype=torch.long)
            hidden = self.fused.forward(ids, pos, slots + pos % self.block_size, blocks, pos + 1, chunks)
        else:
            meta = self._metadata(prefills, singles)
            hidden = self.decoder(
                input_ids=ids[None],
                position_ids=pos[None],
                use_cache=False,
                **{paged_attention.METADATA_KWARG: meta},
            ).last_hidden_state[0]  # [T, hidden]
        prompt = {key: (pos, hidden[row : row + n]) for key, (row, n, pos) in prompt_rows.items()}
        rows = [sample_rows[id(s.seq)] for s in batch if s.samples]
        if not rows:
            return StepLogits(hidden.new_empty(0, 0, dtype=torch.float32), prompt)
        return StepLogits(self.model.lm_head(hidden[rows]).float(), prompt)  # [N, vocab]

    def _row_tables(self, ordered: list[ScheduledSeq]) -> torch.Tensor:
        """[rows, W] each row's block table (its sequence's, up to its chunk's end), padded with
        block 0."""
        nbs = [self._num_blocks(s.seq.num_computed_tokens + s.num_new_tokens) for s in ordered]
        width = max(nbs)
        rows: list[list[int]] = []
        for item, nb in zip(ordered, nbs, strict=True):
            rows.extend([item.seq.block_ids[:nb] + [0] * (width - nb)] * item.num_new_tokens)
        return torch.tensor(rows, device=self.device)

    def _metadata(self, prefills: list[ScheduledSeq], singles: list[ScheduledSeq]) -> AttentionMetadata:
        """The paged attention's view of the step, for transformers' modules."""
        slot_parts: list[torch.Tensor] = []
        segments: list[PrefillSegment] = []
        row = 0
        for item in prefills + singles:
            seq, n = item.seq, item.num_new_tokens
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            slot_parts.append(self._slots(seq.block_ids, start, end))
            if n > 1:
                segments.append(self._prefill_segment(seq.block_ids, row, start, end))
            row += n
        num_prefill_tokens = sum(s.num_new_tokens for s in prefills)
        table = self._decode_table(singles, num_prefill_tokens) if self.decode_kernel and singles else None
        return AttentionMetadata(
            kv_cache=self.kv_cache,
            block_size=self.block_size,
            slot_mapping=torch.cat(slot_parts),
            prefills=tuple(segments),
            num_prefill_tokens=num_prefill_tokens,
            decodes=() if table is not None else self._decode_buckets(singles, num_prefill_tokens),
            decode_table=table,
        )

    def _num_blocks(self, num_tokens: int) -> int:
        return (num_tokens - 1) // self.block_size + 1

    def _decode_buckets(self, singles: list[ScheduledSeq], first_row: int) -> tuple[DecodeBucket, ...]:
        """Split the decodes (longest context first) wherever a context is at most half the
        bucket's longest and needs fewer blocks: each bucket pads to its own longest, so no short
        context pays for the batch's longest gather (8 decodes at ~100 beside 8 at ~600: ~40% less
        K/V gathered)."""
        lengths = [s.seq.num_computed_tokens + 1 for s in singles]
        blocks = [self._num_blocks(n) for n in lengths]
        buckets: list[DecodeBucket] = []
        start = 0
        while start < len(singles):
            end = start + 1
            while end < len(singles) and (2 * lengths[end] > lengths[start] or blocks[end] == blocks[start]):
                end += 1
            buckets.append(self._decode_bucket(singles[start:end], lengths[start:end], first_row + start))
            start = end
        return tuple(buckets)

    def _block_table(self, singles: list[ScheduledSeq], lengths: list[int], nb: int) -> torch.Tensor:
        """[len(singles), nb] each context's blocks, padded with block 0."""
        table = [s.seq.block_ids[: self._num_blocks(n)] for s, n in zip(singles, lengths, strict=True)]
        return torch.tensor([t + [0] * (nb - len(t)) for t in table], device=self.device)

    def _decode_table(self, singles: list[ScheduledSeq], row: int) -> DecodeTable:
        lengths = [s.seq.num_computed_tokens + 1 for s in singles]
        blocks = self._block_table(singles, lengths, self._num_blocks(max(lengths)))
        return DecodeTable(row, blocks, torch.tensor(lengths, device=self.device))

    def _decode_bucket(self, singles: list[ScheduledSeq], lengths: list[int], row: int) -> DecodeBucket:
        nb = self._num_blocks(lengths[0])
        blocks = self._block_table(singles, lengths, nb)
        width = nb * self.block_size
        if lengths[-1] == width:  # every context fills its blocks exactly: nothing to mask
            return DecodeBucket(row, blocks, None)
        lens = torch.tensor(lengths, device=self.device)
        real = torch.arange(width, device=self.device)[None, :] < lens[:, None]
        return DecodeBucket(row, blocks, real[:, None, None, :])

    def _prefill_segment(self, block_ids: list[int], row: int, start: int, end: int) -> PrefillSegment:
        n = end - start
        if start == 0:
            return PrefillSegment(row, n, n, None, None)
        # Bottom-right causal: query j (position start + j) sees keys [0, start + j]; the slots of
        # the last block past `end` are masked with the rest of the future.
        nb = self._num_blocks(end)
        q_pos = torch.arange(start, end, device=self.device)[:, None]
        k_pos = torch.arange(nb * self.block_size, device=self.device)[None, :]
        blocks = torch.tensor(block_ids[:nb], device=self.device)
        return PrefillSegment(row, n, end, blocks, k_pos <= q_pos)
