"""The torch paths of the ranking engine, on any device: ``"sort"`` (a row sort) and ``"count"`` (sort-free counting,
on the CPU), chosen per batch by :func:`choose_engine` when no compiled path serves it, and the block helpers the
dense per-positive counts share (:func:`torch_lwlrap._ranking.dense_label_counts`).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from torch_lwlrap._engine_config import chunk_elements
from torch_lwlrap._types import RankingSums


#: Without a compiled path, ``"auto"`` ranks CPU tensors with the sort-free ``"count"`` path while
#: ``positives / (N * log2(C))`` stays below this, else with ``"sort"``: counting costs a pass over the row per
#: positive, sorting about ``log2(C)`` passes. The crossover measured by ``benchmarks/crossover.py`` on 2 CPU cores
#: lies between 6 and 15 for C from 80 to 10,000.
COUNT_MAX_DENSITY = 8.0


def choose_engine(num_samples: int, num_classes: int, num_positives: int) -> str:
    """The path ``"auto"`` takes for a batch with these sizes."""
    if num_classes <= 2:
        return "count"
    density = num_positives / (max(num_samples, 1) * math.log2(num_classes))
    return "count" if density < COUNT_MAX_DENSITY else "sort"


def _label_counts(positive: Tensor, known: Optional[Tensor], sums: RankingSums) -> None:
    """Count into zeroed ``sums`` the positives per class and per sample and the known labels per sample (int64),
    a block of rows at a time.

    torch casts a whole bool tensor to the accumulation dtype before summing it (8 bytes per label for int64):
    blocks of rows keep that copy small.
    """
    num_samples, num_classes = positive.shape
    if known is None:
        sums.sample_known_count.fill_(num_classes)
    rows = _block_rows(num_classes, positive.device)
    for start in range(0, num_samples, rows):
        block = positive[start : start + rows]
        sums.class_label_count.add_(block.sum(0, dtype=torch.int64))
        torch.sum(block, 1, dtype=torch.int64, out=sums.sample_label_count[start : start + rows])
        if known is not None:
            out = sums.sample_known_count[start : start + rows]
            torch.sum(known[start : start + rows], 1, dtype=torch.int64, out=out)


def _sort_path(preds: Tensor, positive: Tensor, known: Optional[Tensor], ties: str, sums: RankingSums) -> None:
    if preds.device.type != "cpu":
        _sort_path_dense(preds, positive, known, ties, sums)
        return
    # CPU: sort each row, then look up only the positives' scores in it. Blocks without a positive are skipped.
    num_samples, num_classes = preds.shape
    rows_per_block = _block_rows(num_classes, preds.device)
    for start in range(0, num_samples, rows_per_block):
        stop = min(start + rows_per_block, num_samples)
        known_block = None if known is None else known[start:stop]
        # Unknown labels: -inf for "max" (sorted first, taken off below), NaN for "index" (sorted first).
        fill = float("-inf") if ties == "max" else float("nan")
        scores = _masked_scores(preds[start:stop].contiguous(), known_block, fill)
        found = _block_positives(scores, positive[start:stop])
        if found is None:
            continue
        unknown = None if known_block is None else num_classes - known_block.sum(1, dtype=torch.int64)
        if ties == "max":
            ascending = torch.sort(scores, dim=1).values
            rank = num_classes - torch.searchsorted(ascending, found.table, side="left")
            if unknown is not None:
                rank -= torch.where(found.table == float("-inf"), unknown.unsqueeze(1), 0)
            rank = rank.view(-1).index_select(0, found.cells)
        else:
            # Stable descending sort: tied scores keep column order; the rank is the position in it.
            order = torch.sort(scores, dim=1, descending=True, stable=True).indices
            position = torch.empty_like(order).scatter_(
                1, order, torch.arange(1, num_classes + 1, device=order.device).expand_as(order)
            )
            rank = position.view(-1).index_select(0, found.rows * num_classes + found.cols)
            if unknown is not None:
                rank -= unknown.index_select(0, found.rows)
        _add_precisions(sums, start, found, _positive_hits(found.table, found.per_row, ties), rank)


def _sort_path_dense(preds: Tensor, positive: Tensor, known: Optional[Tensor], ties: str, sums: RankingSums) -> None:
    # Whole-matrix formulation without host syncs, for devices other than the CPU.
    num_samples, num_classes = preds.shape
    rows = _block_rows(num_classes, preds.device)
    position = torch.arange(num_classes, device=preds.device)
    for start in range(0, num_samples, rows):
        stop = min(start + rows, num_samples)
        scores = preds[start:stop]
        # Descending and stable: among tied scores the lower column comes first (the "index" rule).
        sorted_scores, order = torch.sort(scores, dim=1, descending=True, stable=True)
        positive_sorted = positive[start:stop].gather(1, order)
        hits = positive_sorted.cumsum(1, dtype=torch.int32)
        if known is None:
            seen = position.to(torch.int32) + 1
        else:
            seen = known[start:stop].gather(1, order).cumsum(1, dtype=torch.int32)
        if ties == "max":
            # Each label takes the counts at the last position of its tie group.
            last_of_group = torch.ones_like(positive_sorted)
            last_of_group[:, :-1] = sorted_scores[:, 1:] != sorted_scores[:, :-1]
            group_end = torch.where(last_of_group, position, num_classes - 1)
            group_end = group_end.flip(1).cummin(1).values.flip(1)
            hits = hits.gather(1, group_end)
            seen = seen.expand_as(hits).gather(1, group_end)
        precision = torch.where(
            positive_sorted, hits.to(torch.float64) / seen.clamp(min=1).to(torch.float64), 0.0
        )
        # Back to column order: deterministic reductions, no atomics.
        precision = torch.zeros_like(precision).scatter_(1, order, precision)
        sums.class_precision_sum.add_(precision.sum(0))
        sums.sample_precision_sum[start:stop] = precision.sum(1)


def _count_path(preds: Tensor, positive: Tensor, known: Optional[Tensor], ties: str, sums: RankingSums) -> None:
    # For each positive, count the row's scores ranked at or above it. The row's positives are laid out in "slots"
    # (first, second, ... positive of the row, in column order); one pass per slot compares rows with their slot's
    # score, writing 0/1 floats that are summed (much faster on CPU than reducing bools). Positives in slots that
    # few rows use are counted on a gathered copy of their row instead.
    num_samples, num_classes = preds.shape
    rows_per_block = _block_rows(num_classes, preds.device)
    rows_per_pass = rows_per_block
    if preds.device.type == "cpu":
        per_pass = chunk_elements("TORCH_PATH_CPU_PASS_ELEMENTS")
        rows_per_pass = max(1, min(rows_per_block, per_pass // max(num_classes, 1)))
    count_dtype = torch.float32 if num_classes < (1 << 24) else torch.float64  # 0/1 sums stay exact
    for start in range(0, num_samples, rows_per_block):
        stop = min(start + rows_per_block, num_samples)
        known_block = None if known is None else known[start:stop]
        # Unknown labels become NaN, which compares False: they are never ranked above a positive.
        scores = _masked_scores(preds[start:stop].contiguous(), known_block, float("nan"))
        found = _block_positives(scores, positive[start:stop])
        if found is None:
            continue
        block_rows = stop - start
        # Slot m is used by the rows with more than m positives.
        rows_using_slot = block_rows - torch.bincount(found.per_row).cumsum(0)
        num_passes = int((rows_using_slot >= _PASS_MIN_SHARE * block_rows).sum())
        rank = torch.empty(found.rows.shape, dtype=torch.int64, device=scores.device)
        in_pass = found.slots < num_passes
        if num_passes:
            at_or_above = torch.empty((num_passes, block_rows), dtype=count_dtype, device=scores.device)
            above = torch.empty_like(at_or_above) if ties == "index" else None
            buffer = torch.empty((min(rows_per_pass, block_rows), num_classes), dtype=count_dtype, device=scores.device)
            for first in range(0, block_rows, rows_per_pass):
                last = min(first + rows_per_pass, block_rows)
                part, written = scores[first:last], buffer[: last - first]
                for slot in range(num_passes):
                    threshold = found.table[first:last, slot : slot + 1]
                    torch.ge(part, threshold, out=written)
                    torch.sum(written, 1, out=at_or_above[slot, first:last])
                    if above is not None:
                        torch.gt(part, threshold, out=written)
                        torch.sum(written, 1, out=above[slot, first:last])
            counted = in_pass.nonzero().squeeze(1)
            where = (found.slots * block_rows + found.rows).index_select(0, counted)
            at_or_above_rank = at_or_above.view(-1).index_select(0, where).to(torch.int64)
            if above is None:
                rank[counted] = at_or_above_rank
            else:
                # A score tied with no other has the same rank under both rules; a tied one is counted again on
                # its gathered row.
                strictly = above.view(-1).index_select(0, where).to(torch.int64)
                rank[counted] = strictly + 1
                in_pass[counted[at_or_above_rank - strictly > 1]] = False
        gathered = (~in_pass).nonzero().squeeze(1)
        if gathered.numel():
            rank[gathered] = _gathered_ranks(
                scores,
                found.rows.index_select(0, gathered),
                found.cols.index_select(0, gathered),
                found.value.index_select(0, gathered),
                ties,
                rows_per_pass,
                count_dtype,
            )
        _add_precisions(sums, start, found, _positive_hits(found.table, found.per_row, ties), rank)


#: Count path: a slot gets its own pass over the block when at least this share of the block's rows use it; the
#: rows of rarer slots are gathered and counted one positive at a time.
_PASS_MIN_SHARE = 0.5


def _block_rows(num_classes: int, device: torch.device) -> int:
    budget = chunk_elements("TORCH_PATH_CPU_CHUNK_ELEMENTS" if device.type == "cpu" else "TORCH_PATH_CHUNK_ELEMENTS")
    return max(1, budget // max(num_classes, 1))


def _masked_scores(scores: Tensor, known: Optional[Tensor], fill: float) -> Tensor:
    return scores if known is None else scores.masked_fill(~known, fill)


def _true_indices(mask: Tensor) -> Tensor:
    """Row-major flat indices of the True entries of a bool tensor, as ``mask.reshape(-1).nonzero()[:, 0]``.

    On CPU, torch's ``nonzero`` costs per element scanned: scan 8-byte words first, then the bytes of the words
    that are not zero (labels are sparse).
    """
    flat = mask.reshape(-1)
    size = flat.numel()
    if flat.device.type != "cpu" or size < 1024:
        return flat.nonzero().squeeze(1)
    head = min((-flat.storage_offset()) % 8, size)
    tail = head + (size - head) // 8 * 8
    body = flat[head:tail]
    words = body.view(torch.int64).nonzero().squeeze(1)
    inside = body.view(-1, 8).index_select(0, words).nonzero()
    found = words.index_select(0, inside[:, 0]).mul_(8).add_(inside[:, 1]).add_(head)
    return torch.cat([flat[:head].nonzero().squeeze(1), found, flat[tail:].nonzero().squeeze(1).add_(tail)])


class _Positives(NamedTuple):
    """The positives of a block of rows, in row-major order."""

    rows: Tensor  #: (P,) int64, row in the block
    cols: Tensor  #: (P,) int64, column
    value: Tensor  #: (P,) the positive's score
    slots: Tensor  #: (P,) int64, position among the row's positives (column order)
    cells: Tensor  #: (P,) int64, ``rows * K + slots``: flat index into a ``(rows, K)`` table
    table: Tensor  #: (rows, K) the scores of the positives by slot, padded with NaN (which compares False)
    per_row: Tensor  #: (rows,) int64, positives per row


def _block_positives(scores: Tensor, positive: Tensor) -> Optional[_Positives]:
    """The positives of a block of rows (``scores`` contiguous), or None without any."""
    num_rows, num_classes = scores.shape
    flat = _true_indices(positive)
    if flat.numel() == 0:
        return None
    rows = flat.div(num_classes, rounding_mode="floor")
    cols = flat - rows * num_classes
    per_row = torch.bincount(rows, minlength=num_rows)
    first = per_row.cumsum(0) - per_row
    slots = torch.arange(rows.numel(), device=rows.device) - first.index_select(0, rows)
    width = int(per_row.max())
    cells = rows * width + slots
    # Flat index_select / index_copy_: much cheaper than advanced indexing on CPU.
    value = scores.reshape(-1).index_select(0, flat)
    table = torch.full((num_rows * width,), float("nan"), dtype=scores.dtype, device=scores.device)
    table = table.index_copy_(0, cells, value).view(num_rows, width)
    return _Positives(rows, cols, value, slots, cells, table, per_row)


def _positive_hits(table: Tensor, per_row: Tensor, ties: str) -> Tensor:
    """``L`` for every slot of ``table``: how many of the row's positives rank at or above it (its own included).

    Padding is NaN: it compares False, sorts last ascending and first descending.
    """
    width = table.shape[1]
    if width <= 16:
        this, other = table.unsqueeze(2), table.unsqueeze(1)
        if ties == "max":
            ahead = other >= this
        else:
            slot = torch.arange(width, device=table.device)
            ahead = (other > this) | ((other == this) & (slot <= slot.unsqueeze(1)))
        return ahead.sum(2)
    if ties == "max":
        # searchsorted needs the padding sorted as the largest value: +inf, which is never below a positive.
        ascending = torch.sort(table.masked_fill(table.isnan(), float("inf")), dim=1).values
        return per_row.unsqueeze(1) - torch.searchsorted(ascending, table, side="left")
    # Stable descending sort: tied scores keep slot (column) order; the padding comes first.
    order = torch.sort(table, dim=1, descending=True, stable=True).indices
    position = torch.empty_like(order).scatter_(
        1, order, torch.arange(1, width + 1, device=order.device).expand_as(order)
    )
    return position - (width - per_row.unsqueeze(1))


def _gathered_ranks(
    scores: Tensor, rows: Tensor, cols: Tensor, value: Tensor, ties: str, rows_per_chunk: int, count_dtype: torch.dtype
) -> Tensor:
    """Ranks of single positives, each counted on a gathered copy of its row."""
    rank = torch.empty(rows.shape, dtype=torch.int64, device=rows.device)
    column = torch.arange(scores.shape[1], device=scores.device)
    for start in range(0, rows.numel(), rows_per_chunk):
        part = slice(start, start + rows_per_chunk)
        row_scores = scores.index_select(0, rows[part])
        threshold = value[part].unsqueeze(1)
        if ties == "max" and row_scores.dtype == count_dtype:
            # 0/1 written over the copy and summed as floats: faster than reducing bools.
            torch.ge(row_scores, threshold, out=row_scores)
            rank[part] = row_scores.sum(1).to(torch.int64)
        elif ties == "max":
            rank[part] = (row_scores >= threshold).sum(1)
        else:
            ahead = (row_scores > threshold) | ((row_scores == threshold) & (column <= cols[part].unsqueeze(1)))
            rank[part] = ahead.sum(1)
    return rank


def _add_precisions(sums: RankingSums, start: int, found: _Positives, hits_table: Tensor, rank: Tensor) -> None:
    hits = hits_table.reshape(-1).index_select(0, found.cells)
    precision = hits.to(torch.float64) / rank.to(torch.float64)
    sums.class_precision_sum.index_add_(0, found.cols, precision)
    sums.sample_precision_sum[start:].index_add_(0, found.rows, precision)


# ---------------------------------------------------------------------------------------------------------------
# Per-positive counts
