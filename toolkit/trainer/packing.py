"""Sequence packing: a batch's samples -> rows of at most ``seq_len`` tokens -> micro-batches per rank.

Several samples share one row; each sample's position ids restart at 0, which is how the model keeps attention
inside a sample: transformers' mask builder (``masking_utils.find_packed_sequence_indices``) turns position-id
resets into a block-diagonal causal mask when no attention mask is passed. Rows are filled by first-fit decreasing
(sorted by length, each sample into the first row with room), so every row but the last few is nearly full.
A micro-batch is ``micro_batch_size`` rows padded only to its longest row (not to ``seq_len``).

Rows need not be ``seq_len`` wide. SDPA with a block-diagonal mask computes every (query, key) pair of a row, the
masked ones included, so a row of width W costs attention in W^2 however few of its pairs are real. Given the
model's :class:`RowCost`, :func:`plan_micro_batches` tries row widths from the longest sample up to ``seq_len`` and
packs at the one with the least estimated compute (linear layers per token position, padding included, plus
attention per pair). Short samples in a long ``seq_len`` (an RL batch of 40-token replies in 512-token rows) then
go into narrow rows, several per micro-batch so that a micro-batch keeps the token budget the user sized
(``micro_batch_size`` rows of ``seq_len``) and the number of forwards does not grow: the README job's train step
takes 30-40% less time. Long samples still fill ``seq_len``.

With several ranks, rows are dealt round-robin by size so ranks get similar token counts, and every rank gets the
same number of micro-batches (FSDP's collectives need the same number of forwards on every rank); a rank short of
rows gets empty micro-batches (one padding token, no loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from toolkit.batches import Batch


@dataclass
class MicroBatch:
    """One forward/backward of the train step. Every tensor is ``[rows, length]``.

    ``sample_index`` is the sample's index in the batch (-1 on padding). ``loss_mask`` / ``ce_mask`` /
    ``ref_kl_mask`` are False on padding and on the first token of each sample. ``real_tokens`` counts non-padding
    tokens. ``temperature``, ``top_p`` and ``top_k`` (0: none) are the batch's sampling (``Batch.sampling``): the
    trainer's logprobs are taken under that distribution.
    """

    input_ids: torch.Tensor  # int64
    position_ids: torch.Tensor  # int64
    loss_mask: torch.Tensor  # bool
    ce_mask: torch.Tensor  # bool
    inference_logprobs: torch.Tensor  # float32
    advantages: torch.Tensor  # float32
    ref_kl_mask: torch.Tensor  # bool
    ref_logprobs: torch.Tensor  # float32
    ref_topk_ids: torch.Tensor  # int64 [rows, length, K] (K = 0 without top-k distillation)
    ref_topk_logprobs: torch.Tensor  # float32 [rows, length, K]
    sample_index: torch.Tensor  # int64
    real_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def processed_tokens(self) -> int:
        """Tokens the model runs on, padding included (rows x length)."""
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        """Copy of this micro-batch with every tensor on ``device``."""
        moved = {k: v.to(device, non_blocking=True) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return MicroBatch(
            real_tokens=self.real_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, **moved
        )


# The batch's per-token arrays a micro-batch carries, with their dtype in the micro-batch (padding holds 0).
_DTYPES = {
    "input_ids": np.int64,
    "loss_mask": bool,
    "ce_mask": bool,
    "inference_logprobs": np.float32,
    "advantages": np.float32,
    "ref_kl_mask": bool,
    "ref_logprobs": np.float32,
    "ref_topk_ids": np.int64,  # these two have a last axis of K
    "ref_topk_logprobs": np.float32,
}


@dataclass(frozen=True)
class RowCost:
    """Estimated compute of a forward over packed rows, to choose their width (:func:`plan_micro_batches`).

    ``per_token``: FLOPs per token position of the linear layers (projections, MLP, LM head), padding included;
    ``per_pair``: FLOPs per (query, key) pair of attention over all layers. Forward only: the backward costs about
    twice each term, which leaves the choice unchanged.
    """

    per_token: float
    per_pair: float

    def rows(self, count: int, width: int) -> float:
        """FLOPs of ``count`` rows ``width`` tokens wide."""
        return count * width * (self.per_token + self.per_pair * width)

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> RowCost:
        """The cost of ``model`` (a transformers causal LM, before sharding): 2 FLOPs per weight of every
        ``nn.Linear`` per token, and 4 x head_dim x heads x layers per attended pair (QK^T and the weighted sum of
        V, 2 FLOPs per multiply-add), from the model's config."""
        c = model.config
        heads = int(c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        return cls(per_token=2.0 * linear, per_pair=4.0 * head_dim * heads * int(c.num_hidden_layers))


def pack_rows(lengths: list[int] | np.ndarray, seq_len: int) -> list[list[int]]:
    """First-fit-decreasing packing of samples (token ``lengths``) into rows of at most ``seq_len`` tokens.

    Returns sample indices per row, rows sorted by total tokens (longest first). Raises ValueError if a sample
    is longer than ``seq_len`` (it would have to be split, which breaks its attention context). O(n log n): a
    max-tree over the rows' free room finds the first row with room for each sample.
    """
    lengths = [int(x) for x in lengths]
    too_long = [i for i, n in enumerate(lengths) if n > seq_len]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"sample {i} has {lengths[i]} tokens > trainer.seq_len={seq_len} ({len(too_long)} such samples); "
            "raise seq_len or lower the orchestrator's token limits"
        )
    size = 1
    while size < max(1, len(lengths)):
        size *= 2
    tree = [0] * (2 * size)  # leaf size + r: free room of row r (0 for rows not opened; samples have >= 1 token)
    rows: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        need = lengths[i]
        if tree[1] >= need > 0:
            node = 1
            while node < size:  # leftmost leaf with room
                node = 2 * node if tree[2 * node] >= need else 2 * node + 1
            r = node - size
            rows[r].append(i)
        else:
            r = len(rows)
            rows.append([i])
            node = size + r
            tree[node] = seq_len
        tree[node] -= need
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    free = [tree[size + r] for r in range(len(rows))]
    order = sorted(range(len(rows)), key=lambda r: (free[r], r))
    return [rows[r] for r in order]


def row_width(
    lengths: list[int] | np.ndarray, *, seq_len: int, micro_batch_size: int, world_size: int, cost: RowCost
) -> int:
    """The row width (<= ``seq_len``) at which packing ``lengths`` costs the least estimated compute.

    Candidates: the longest sample times 1, 1.25, 1.5, 2, 3, 4, 6, 8, ... and ``seq_len``. Each is packed
    (:func:`pack_rows`) and costed as the busiest rank's micro-batches (:func:`rows_per_micro_batch` rows each),
    each padded to its longest row (what the trainer runs). A width that would take more forwards than
    ``seq_len``-wide rows is not taken (a forward has a fixed cost the FLOP count leaves out, large on a GPU). Ties go
    to the wider row (fewer, fuller rows). Raises ValueError like :func:`pack_rows`.
    """
    longest = max((int(x) for x in lengths), default=1)
    if longest > seq_len:
        pack_rows(lengths, seq_len)  # raises, naming the sample
    widths = {seq_len}
    f = 1.0
    while longest * f < seq_len:
        widths.add(max(1, int(longest * f)))
        f = f * 1.25 if f < 1.5 else (f + 1 if f < 4 else f * 1.5)
    best, best_cost, most_forwards = seq_len, float("inf"), None
    for width in sorted(widths, reverse=True):  # seq_len first: its forwards are the bound
        rows = pack_rows(lengths, width)
        used = [sum(int(lengths[i]) for i in row) for row in rows]
        per_mb = rows_per_micro_batch(micro_batch_size, seq_len, width)
        forwards = math.ceil(math.ceil(len(used) / world_size) / per_mb)
        if most_forwards is None:
            most_forwards = forwards
        elif forwards > most_forwards:
            continue
        busiest = max(
            sum(cost.rows(len(c), max(c)) for m in range(0, len(mine), per_mb) if (c := mine[m : m + per_mb]))
            for mine in (used[rank::world_size] for rank in range(world_size))
        )
        if busiest < best_cost:
            best, best_cost = width, busiest
    return best


def _build(batch: Batch, rows: list[list[int]]) -> MicroBatch:
    """Tensors of one micro-batch from its rows (sample indices), padded to the longest row."""
    lengths = batch.lengths
    width = max(1, max((int(sum(lengths[i] for i in row)) for row in rows), default=1))
    n = max(1, len(rows))
    topk = batch.ref_topk_ids.shape[1]
    out = {
        k: np.zeros((n, width, topk) if k.startswith("ref_topk") else (n, width), dtype) for k, dtype in _DTYPES.items()
    }
    pos = np.zeros((n, width), np.int64)
    sidx = np.full((n, width), -1, np.int64)
    real = 0
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            sl = batch.sample_slice(i)
            k = sl.stop - sl.start
            for name in _DTYPES:
                out[name][r, at : at + k] = getattr(batch, name)[sl]
            pos[r, at : at + k] = np.arange(k)
            sidx[r, at : at + k] = i
            # The first token of a sample would be "predicted" from the previous sample's last token: never train it.
            out["loss_mask"][r, at] = out["ce_mask"][r, at] = out["ref_kl_mask"][r, at] = False
            at += k
        # Padding is its own segment (positions restart at 0) so it never shares a block with real tokens.
        pos[r, at:] = np.arange(width - at)
        real += at
    tensors = {k: torch.from_numpy(v) for k, v in {**out, "position_ids": pos, "sample_index": sidx}.items()}
    sp = batch.sampling
    return MicroBatch(real_tokens=real, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or 0, **tensors)


def plan_micro_batches(
    batch: Batch,
    *,
    seq_len: int,
    micro_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    cost: RowCost | None = None,
) -> list[MicroBatch]:
    """Micro-batches of ``rank`` (of ``world_size``) for ``batch``; every rank gets the same count.

    ``seq_len``: max tokens per packed row; ``micro_batch_size``: rows per micro-batch; ``cost``: the model's
    :class:`RowCost`, to pack into the cheapest row width (:func:`row_width`) instead of ``seq_len``-wide rows, with
    as many narrower rows per micro-batch as fill ``micro_batch_size`` rows of ``seq_len`` tokens
    (:func:`rows_per_micro_batch`): the same number of forwards or fewer, within the same token budget each.
    Deterministic: every rank computes the same plan from the same batch and keeps its share. Raises ValueError
    on a sample longer than ``seq_len`` or non-positive sizes.
    """
    if seq_len < 1 or micro_batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"bad packing sizes seq_len={seq_len} micro_batch_size={micro_batch_size} rank={rank}/{world_size}"
        )
    width, per_mb = seq_len, micro_batch_size
    if cost is not None:
        width = row_width(
            batch.lengths, seq_len=seq_len, micro_batch_size=micro_batch_size, world_size=world_size, cost=cost
        )
        per_mb = rows_per_micro_batch(micro_batch_size, seq_len, width)
    rows = pack_rows(batch.lengths, width)
    mine = rows[rank::world_size]
    per_rank = math.ceil(len(rows) / world_size)  # rank 0 has the most rows
    count = max(1, math.ceil(per_rank / per_mb))
    return [_build(batch, mine[m * per_mb : (m + 1) * per_mb]) for m in range(count)]


def rows_per_micro_batch(micro_batch_size: int, seq_len: int, width: int) -> int:
    """Rows of ``width`` tokens in one micro-batch: as many as keep its tokens within ``micro_batch_size`` rows of
    ``seq_len`` (the memory the user sized), so narrower rows do not mean more forwards; at least
    ``micro_batch_size``."""
    return max(micro_batch_size, micro_batch_size * seq_len // max(1, width))
