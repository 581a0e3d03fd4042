"""The torch paths of the learning-to-rank metrics, on any device: graded DCG, the rank correlations of two score
rows and the Kendall distance at k, each per row of a chunk and without host-device syncs.

Every function takes checked ``(n, C)`` rows (:mod:`torch_lwlrap._checks`) and returns per-row float64 values;
the callers sum them. The CPU takes the compiled kernels of :mod:`torch_lwlrap._ltr_numba` where it can; these paths
serve every other device, and the CPU under ``use_engine("sort")`` or without numba.

Kendall's counts are those of scipy's ``kendalltau``: for rows ``x`` and ``y``, the pairs ordered oppositely
(``dis``), the pairs tied in ``x`` (``xtie``), in ``y`` (``ytie``) and in both (``ntie``). ``dis`` is the number of
inversions of ``y`` read in the order of ``(x, y)``, counted by a bottom-up merge sort whose merges are batched
``searchsorted`` calls: ``O(C log^2 C)`` work per row and ``log2 C`` steps, never the ``C^2`` pairs.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap._options import GAINS

__all__ = [
    "GAINS",
    "average_ranks",
    "correlation_rows",
    "dense_ranks",
    "distance_rows",
    "gains",
    "kendall_counts",
    "ndcg_rows",
    "top_k_mask",
]



def _group_bounds(sorted_rows: Tensor) -> Tuple[Tensor, Tensor]:
    """``(start, end)`` int64 ``(n, L)``: for each position of rows sorted ascending, the first and one past the last
    position of its group of equal values."""
    n, length = sorted_rows.shape
    position = torch.arange(length, device=sorted_rows.device).expand(n, length)
    new = torch.ones_like(sorted_rows, dtype=torch.bool)
    new[:, 1:] = sorted_rows[:, 1:] != sorted_rows[:, :-1]
    start = torch.where(new, position, 0).cummax(1).values
    last = torch.ones_like(new)
    last[:, :-1] = new[:, 1:]
    end = torch.where(last, position + 1, length).flip(1).cummin(1).values.flip(1)
    return start, end


def average_ranks(rows: Tensor) -> Tensor:
    """float64 ``(n, C)``: each entry's average rank (1-based, ascending; scipy's ``rankdata``) minus ``(C + 1) / 2``,
    so that each row sums to 0."""
    num_classes = rows.shape[1]
    values, order = torch.sort(rows, dim=1, stable=True)
    start, end = _group_bounds(values)
    centered = (start + end + 1).to(torch.float64) / 2 - (num_classes + 1) / 2
    return torch.empty_like(centered).scatter_(1, order, centered)


def dense_ranks(rows: Tensor) -> Tensor:
    """int64 ``(n, C)``: each entry's number of distinct smaller values in its row."""
    values, order = torch.sort(rows, dim=1, stable=True)
    new = torch.zeros_like(values, dtype=torch.int64)
    new[:, 1:] = (values[:, 1:] != values[:, :-1]).to(torch.int64)
    return torch.empty_like(new).scatter_(1, order, new.cumsum(1))


def _tied_pairs(rows: Tensor) -> Tensor:
    """int64 ``(n,)``: the pairs of equal entries of each row."""
    values = torch.sort(rows, dim=1).values
    start, _ = _group_bounds(values)
    position = torch.arange(rows.shape[1], device=rows.device)
    return (position - start).sum(1)


def _inversions(sequence: Tensor) -> Tensor:
    """int64 ``(n,)``: the pairs ``i < j`` with ``sequence[i] > sequence[j]`` (strictly) of each int64 row."""
    n, length = sequence.shape
    if length < 2:
        return torch.zeros(n, dtype=torch.int64, device=sequence.device)
    width = 1
    while width < length:
        width *= 2
    if width > length:  # padded with larger, increasing values: no inversion involves them
        top = sequence.amax(1, keepdim=True)
        pad = top + 1 + torch.arange(width - length, device=sequence.device)
        sequence = torch.cat([sequence, pad], 1)
    total = torch.zeros(n, dtype=torch.int64, device=sequence.device)
    block = 1
    while block < width:
        pairs = sequence.reshape(n, width // (2 * block), 2, block)
        left = pairs[:, :, 0].reshape(-1, block).contiguous()
        right = pairs[:, :, 1].reshape(-1, block).contiguous()
        left_at_or_below = torch.searchsorted(left, right, right=True)  # left entries <= each right entry
        total += (block - left_at_or_below).reshape(n, -1).sum(1)
        right_below = torch.searchsorted(right, left, right=False)  # right entries < each left entry
        position = torch.arange(block, device=sequence.device)
        merged = torch.empty(left.shape[0], 2 * block, dtype=sequence.dtype, device=sequence.device)
        merged.scatter_(1, position + right_below, left)
        merged.scatter_(1, position + left_at_or_below, right)
        sequence = merged.reshape(n, width)
        block *= 2
    return total


def kendall_counts(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dis, xtie, ytie, ntie)``, int64 ``(n,)`` each, of int64 rows ``x`` and ``y`` with entries in
    ``[0, 2**31)``: pairs ordered oppositely, tied in ``x``, tied in ``y``, tied in both."""
    xtie, ytie = _tied_pairs(x), _tied_pairs(y)
    joint = torch.sort(x * (1 << 31) + y, dim=1).values  # ordered by x, then y
    ntie = _tied_pairs(joint)
    # Within a group of equal x the y are ascending: no pair tied in x (or in y) is an inversion.
    return _inversions(joint % (1 << 31)), xtie, ytie, ntie


def correlation_rows(a: Tensor, b: Tensor, method: str) -> Tuple[Tensor, Tensor]:
    """``(value, defined)``: float64 and bool ``(n,)``; Spearman's rho (``"spearman"``, average ranks) or Kendall's
    tau-b (``"kendall"``) of each pair of rows, 0 where a row is constant (``defined`` False)."""
    num_classes = a.shape[1]
    if method == "spearman":
        ra, rb = average_ranks(a), average_ranks(b)
        sxx, syy, sxy = (ra * ra).sum(1), (rb * rb).sum(1), (ra * rb).sum(1)
        defined = (sxx > 0) & (syy > 0)
        value = sxy / torch.where(defined, sxx * syy, 1.0).sqrt()
    else:
        dis, xtie, ytie, ntie = kendall_counts(dense_ranks(a), dense_ranks(b))
        total = num_classes * (num_classes - 1) // 2
        defined = (xtie < total) & (ytie < total)
        x_pairs = torch.where(defined, total - xtie, 1).to(torch.float64)
        y_pairs = torch.where(defined, total - ytie, 1).to(torch.float64)
        value = (total - xtie - ytie + ntie - 2 * dis).to(torch.float64) / x_pairs.sqrt() / y_pairs.sqrt()
    return torch.where(defined, value.clamp(-1.0, 1.0), 0.0), defined


def top_k_mask(rows: Tensor, k: int) -> Tensor:
    """bool ``(n, C)``: the ``min(k, C)`` highest scores of each row, tied scores taken lower column first."""
    order = torch.sort(rows, dim=1, descending=True, stable=True).indices[:, : min(k, rows.shape[1])]
    return torch.zeros_like(rows, dtype=torch.bool).scatter_(1, order, True)


def distance_rows(a: Tensor, b: Tensor, k: int) -> Tensor:
    """float64 ``(n,)``: the normalized Kendall distance at ``k`` of each pair of rows (see
    :func:`torch_lwlrap.multilabel_kendall_distance_at_k`)."""
    n, num_classes = a.shape
    union = top_k_mask(a, k) | top_k_mask(b, k)
    # Labels outside the union become distinct values above every rank, in the same order in both rows: every pair
    # they are in is concordant and untied, so the counts are those of the union alone.
    outside = num_classes + torch.arange(num_classes, device=a.device)
    x = torch.where(union, dense_ranks(a), outside)
    y = torch.where(union, dense_ranks(b), outside)
    dis, xtie, ytie, ntie = kendall_counts(x, y)
    size = union.sum(1)
    pairs = size * (size - 1) // 2
    value = (dis.to(torch.float64) + (xtie + ytie - 2 * ntie).to(torch.float64) / 2) / pairs.clamp(min=1)
    return torch.where(pairs > 0, value, 0.0)


def gains(relevance: Tensor, gain: str) -> Tensor:
    """float64 gains of relevance grades: ``2**rel - 1`` (``"exponential"``) or ``rel`` (``"linear"``).

    ``exp2(rel) - 1`` is exact for whole grades and within a few ulps for grades of 1 and more, but loses the
    relative precision of a small floating grade to the subtraction (a grade of 1e-10 to 1.6e-6 of its gain, one
    under about 1e-16 to a gain of 0: a relevant label counted as irrelevant). Floating grades below 1 therefore take
    ``expm1(rel ln 2)``, within an ulp or two of ``2**rel - 1`` (grade 0 still gives exactly 0); whole grades of an
    integer dtype need neither."""
    floating = relevance.is_floating_point()
    relevance = relevance.to(torch.float64)
    if gain != "exponential":
        return relevance
    out = torch.exp2(relevance).sub_(1)
    if not floating:
        return out
    return torch.where(relevance < 1, torch.expm1(relevance * math.log(2)), out)


def ndcg_rows(
    scores: Tensor, gain: Tensor, known: Optional[Tensor], k: int, ties: str
) -> Tuple[Tensor, Tensor]:
    """``(ndcg, has_ideal)``: float64 and bool ``(n,)``. ``gain`` is float64 ``(n, C)`` (0 where not ``known``);
    labels where ``known`` is False are removed from the ranking. ``ndcg`` is 0 where the ideal DCG is 0
    (``has_ideal`` False)."""
    n, num_classes = scores.shape
    cut = min(k, num_classes)
    device = scores.device
    # Each row's gains times the power of two that brings its largest into [0.5, 1): exact, the ratio unchanged, and
    # the sums stay finite (three gains of 2**1023 - 1 would make the ideal DCG infinite and the ratio NaN).
    gain = torch.ldexp(gain, -torch.frexp(gain.amax(dim=1, keepdim=True)).exponent)
    position = torch.arange(num_classes, device=device)
    discount = torch.where(position < cut, 1.0 / torch.log2(position.to(torch.float64) + 2), 0.0)
    # Ascending order of the negated scores puts the highest first, tied scores in column order, and the unknown
    # labels (NaN) last.
    key = -scores if known is None else torch.where(known, -scores, float("nan"))
    values, order = torch.sort(key, dim=1, stable=True)
    sorted_gain = gain.gather(1, order)
    if ties == "index":
        dcg = (sorted_gain * discount).sum(1)
    else:
        start, end = _group_bounds(values)
        if ties == "max":  # every label of a tie group at the group's last position
            dcg = (sorted_gain * discount[end - 1]).sum(1)
        else:  # "expected": the group's mean gain at each of its positions
            reach = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), discount.cumsum(0)])
            share = (reach[end] - reach[start]) / (end - start).to(torch.float64)
            dcg = (sorted_gain * share).sum(1)
    ideal = (torch.sort(gain, dim=1, descending=True).values * discount).sum(1)
    has_ideal = ideal > 0
    return torch.where(has_ideal, dcg / torch.where(has_ideal, ideal, 1.0), 0.0), has_ideal
