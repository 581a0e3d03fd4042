"""The ranking engine: the one place where ranks and precisions are computed.

For a sample ``i`` and a positive label ``j`` (ignored labels removed from the row):

* ``ties="max"`` (scikit-learn's rule): ``rank_ij = #{k : s_ik >= s_ij}`` and
  ``L_ij = #{k positive : s_ik >= s_ij}``;
* ``ties="index"`` (strict order, tied scores ordered by column, lower column first):
  ``rank_ij = #{k : s_ik > s_ij} + #{k : s_ik == s_ij, k <= j}`` and ``L_ij`` the same count over positives.

The precision of the label is ``L_ij / rank_ij``: two integer counts and one division in float64. Every public
path (functions, metrics, command line) reduces these precisions to per-class and per-sample sums through
:func:`ranking_sums`.

Two interchangeable paths compute the counts:

* ``"sort"``: a batched stable sort of each row, cumulative counts of positives, and, for ``ties="max"``, the end
  of each tie group. ``O(N C log C)`` work whatever the labels.
* ``"count"``: sort-free; for each positive, count the row's scores that are >= its score. ``O(P C)`` work for
  ``P`` positives, which wins when labels are sparse.

``"auto"`` picks per batch from the label density (see :data:`COUNT_MAX_DENSITY`). Rows are processed in chunks of
about :data:`CHUNK_ELEMENTS` scores so the workspace is bounded whatever the batch size.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, NamedTuple, Optional

import torch
from torch import Tensor

ENGINES = ("auto", "sort", "count")

#: Scores ranked per chunk: the workspace is a few dozen bytes per score, so about 100 MB on the sort path.
CHUNK_ELEMENTS = 1 << 21

#: ``"auto"`` uses the sort-free path while ``positives / (N * log2(C))`` stays below this, as measured by
#: ``benchmarks/crossover.py``: counting costs a pass over the row per positive, sorting about ``log2(C)``.
COUNT_MAX_DENSITY = 0.25

_engine = "auto"
_chunk_elements: Optional[int] = None


class RankingSums(NamedTuple):
    """Sums of label precisions ``L_ij / rank_ij`` over the positives of a batch."""

    class_precision_sum: Tensor  #: (C,) float64, summed over samples
    class_label_count: Tensor  #: (C,) int64, positives per class
    sample_precision_sum: Tensor  #: (N,) float64, summed over classes
    sample_label_count: Tensor  #: (N,) int64, positives per sample
    sample_known_count: Tensor  #: (N,) int64, labels per sample that are not ignored


def get_engine() -> str:
    """The engine in use: ``"auto"``, ``"sort"`` or ``"count"``."""
    return _engine


@contextlib.contextmanager
def use_engine(engine: str, chunk_elements: Optional[int] = None) -> Iterator[None]:
    """Force an engine path (and optionally a chunk size) inside a ``with`` block, for tests and benchmarks.

    Every path gives the same result up to float64 rounding; only the speed differs.
    """
    global _engine, _chunk_elements
    if engine not in ENGINES:
        raise ValueError(f"Argument `engine` must be one of {ENGINES}, but got {engine!r}.")
    if chunk_elements is not None and chunk_elements < 1:
        raise ValueError(f"Argument `chunk_elements` must be positive, but got {chunk_elements!r}.")
    saved = _engine, _chunk_elements
    _engine, _chunk_elements = engine, chunk_elements
    try:
        yield
    finally:
        _engine, _chunk_elements = saved


def _chunk_rows(num_classes: int) -> int:
    budget = _chunk_elements or CHUNK_ELEMENTS
    return max(1, budget // max(num_classes, 1))


def choose_engine(num_samples: int, num_classes: int, num_positives: int) -> str:
    """The path ``"auto"`` takes for a batch with these sizes."""
    if num_classes <= 2:
        return "count"
    density = num_positives / (max(num_samples, 1) * math.log2(num_classes))
    return "count" if density < COUNT_MAX_DENSITY else "sort"


def ranking_sums(preds: Tensor, positive: Tensor, known: Optional[Tensor] = None, *, ties: str = "max") -> RankingSums:
    """Per-class and per-sample sums of label precisions for a batch.

    Args:
        preds: ``(N, C)`` floating scores, ranked as given (ties in the given dtype are real ties).
        positive: ``(N, C)`` bool, the positive labels; must be False where ``known`` is False.
        known: ``(N, C)`` bool or None; labels that are False are removed from their row's ranking.
        ties: ``"max"`` or ``"index"``.
    """
    num_samples, num_classes = preds.shape
    device = preds.device
    if known is not None:
        positive = positive & known
    class_label_count = positive.sum(0, dtype=torch.int64)
    sample_label_count = positive.sum(1, dtype=torch.int64)
    if known is None:
        sample_known_count = torch.full((num_samples,), num_classes, dtype=torch.int64, device=device)
    else:
        sample_known_count = known.sum(1, dtype=torch.int64)
    class_precision_sum = torch.zeros(num_classes, dtype=torch.float64, device=device)
    sample_precision_sum = torch.zeros(num_samples, dtype=torch.float64, device=device)
    sums = RankingSums(
        class_precision_sum, class_label_count, sample_precision_sum, sample_label_count, sample_known_count
    )
    if num_samples == 0:
        return sums

    engine = _engine
    if engine == "auto":
        if device.type != "cpu":
            # The density is not known on the host without a sync; the sort path needs none.
            engine = "sort"
        else:
            engine = choose_engine(num_samples, num_classes, int(class_label_count.sum()))
    if engine == "sort":
        _sort_path(preds, positive, known, ties, sums)
    else:
        _count_path(preds, positive, known, ties, sums)
    return sums


def _sort_path(preds: Tensor, positive: Tensor, known: Optional[Tensor], ties: str, sums: RankingSums) -> None:
    num_samples, num_classes = preds.shape
    rows = _chunk_rows(num_classes)
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
    num_classes = preds.shape[1]
    pos_rows, pos_cols = positive.nonzero(as_tuple=True)
    chunk = _chunk_rows(num_classes)
    column = torch.arange(num_classes, device=preds.device)
    for start in range(0, pos_rows.numel(), chunk):
        rows = pos_rows[start : start + chunk]
        cols = pos_cols[start : start + chunk]
        row_scores = preds[rows]
        score = preds[rows, cols].unsqueeze(1)
        if ties == "max":
            ahead = row_scores >= score
        else:
            ahead = (row_scores > score) | ((row_scores == score) & (column <= cols.unsqueeze(1)))
        if known is not None:
            ahead &= known[rows]
        rank = ahead.sum(1, dtype=torch.int64)
        hits = (ahead & positive[rows]).sum(1, dtype=torch.int64)
        precision = hits.to(torch.float64) / rank.to(torch.float64)
        sums.class_precision_sum.index_add_(0, cols, precision)
        sums.sample_precision_sum.index_add_(0, rows, precision)
