"""Functional interface: lwlrap and LRAP of one batch.

The ``*_update`` functions turn a batch into sum-only statistics (what the metric classes accumulate) and the
``*_compute`` functions turn statistics into scores; the public functions are the two chained.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap._engine_config import eager_only
from torch_lwlrap._user_frames import warn
from torch_lwlrap._checks import (
    check_average,
    check_batch_structure,
    check_batch_values,
    check_ignore_index,
    check_ties,
    formatted_chunks,
)
from torch_lwlrap._gate_messages import nan_scores_error
from torch_lwlrap._ranking import (
    RankingSums,
    ScoresContainNaN,
    forced_chunk_elements,
    ranking_sums,
    one_pass_chunks,
)

__all__ = [
    "multilabel_lwlrap",
    "multilabel_lwlrap_per_class",
    "multilabel_lrap",
]


# ---------------------------------------------------------------------------------------------------------------
# lwlrap


def _lwlrap_update(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
) -> Tuple[Tensor, Tensor]:
    """Per-class ``(precision_sum float64 (C,), label_count int64 (C,))`` of a batch."""
    return _batch_totals(
        preds,
        target,
        num_labels,
        ties,
        ignore_index,
        validate_args,
        None,
        lambda sums, _: (sums.class_precision_sum, sums.class_label_count),
    )


def _batch_totals(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
    sample_weight: Optional[Tensor],
    reduce: Callable[[RankingSums, Optional[Tensor]], Tuple[Tensor, ...]],
) -> Tuple[Tensor, ...]:
    """Checked, formatted and ranked: the sum over the chunks of a batch of ``reduce(sums, weight)``.

    ``sums`` are the :class:`RankingSums` of a chunk of samples and ``weight`` its ``(M,)`` sample weights (or
    None). The whole batch is checked before the first chunk is ranked (one host-device sync with
    ``validate_args``); chunks of samples bound the workspace whatever the batch size
    (:data:`torch_lwlrap._engine_config.INPUT_CHUNK_BYTES`). On the numba path a batch without sample weights is
    checked and ranked by one compiled pass over its rows, a chunk at a time
    (:func:`~torch_lwlrap._ranking.one_pass_chunks`): a chunk is checked as it is ranked, so ``reduce`` must return
    new values and change nothing (a caller that adds into states in place checks the batch first and passes
    ``validate_args=False``); a batch that pass hands back goes through the value checks, which raise the error.
    """
    gated = check_batch_structure(preds, target, num_labels, sample_weight, validate_args)
    numba_path, preds, target, sample_weight = gated
    if sample_weight is None:
        # On the numba path: value checks, positives and ranks in one compiled pass over each row; a chunk it hands
        # back (None) ends the chunks, and the value checks below raise the error.
        chunks = one_pass_chunks(preds, target, ignore_index, ties, validate_args, numba_path)
        if chunks is not None:
            totals = None
            for sums in chunks:
                if sums is None:
                    break
                totals = _plus(totals, reduce(sums, None))
                del sums
            else:
                return totals
    check_batch_values(*gated, ignore_index, validate_args, nan_later=True)
    # The numba path looks for NaN in its own pass over the scores: no extra read.
    engine_checks_nan = validate_args and numba_path
    totals = None
    chunks = formatted_chunks(preds, target, ignore_index, sample_weight, forced_chunk_elements(), numba_path)
    for chunk in chunks:
        scores, positive, known, weight = chunk
        try:
            sums = ranking_sums(scores, positive, known, ties=ties, check_nan=engine_checks_nan)
        except ScoresContainNaN:
            raise nan_scores_error(preds) from None
        totals = _plus(totals, reduce(sums, weight))
        # Let go of this chunk before the next one is formatted: one chunk's workspace at a time.
        del chunk, scores, positive, known, weight, sums
    return totals


def _plus(totals: Optional[Tuple[Tensor, ...]], values: Tuple[Tensor, ...]) -> Tuple[Tensor, ...]:
    """A chunk's reduced values added to the totals of the chunks before it."""
    return values if totals is None else tuple(total + value for total, value in zip(totals, values))


def _lwlrap_per_class(precision_sum: Tensor, label_count: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-class lwlrap (NaN for a class without positives) and each class's share of all positive labels."""
    count = label_count.to(torch.float64)
    per_class = precision_sum / count  # 0 / 0 = NaN for classes without a positive
    total = count.sum()
    weights = torch.where(total > 0, count / total, 0.0)  # no read of the total: no sync (and shapes on meta)
    return per_class, weights


def _lwlrap_compute(precision_sum: Tensor, label_count: Tensor, average: str, warn_empty: bool = True) -> Tensor:
    """lwlrap from the sums; NaN without a positive label, with a warning unless ``warn_empty`` is False (a second value
    of the same labels, whose first already warned)."""
    if average == "none":
        return _lwlrap_per_class(precision_sum, label_count)[0]
    if precision_sum.is_meta:  # a metric on meta (shapes, no values): the value's shape, nothing to warn of
        return torch.empty((), dtype=torch.float64, device=precision_sum.device)
    total = label_count.sum()
    if total == 0:
        if warn_empty:
            warn("lwlrap is undefined without any positive label: no target was 1 (returning NaN).")
        return torch.full((), math.nan, dtype=torch.float64, device=precision_sum.device)
    if average == "weighted":
        return precision_sum.sum() / total.to(torch.float64)
    per_class = _lwlrap_per_class(precision_sum, label_count)[0]
    return per_class[label_count > 0].mean()


@eager_only
def multilabel_lwlrap(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    average: Optional[str] = "weighted",
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""Label-weighted label-ranking average precision (lwlrap), the metric of DCASE 2019 task 2.

    For every positive label ``j`` of a sample ``i`` the precision is the share of positives among the labels
    scored at least as high: ``L_ij / rank_ij``. lwlrap averages these precisions per class; ``"weighted"``
    combines classes by their share of all positive labels, which equals the mean precision over all positive
    labels (the challenge metric).

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples). Ranked as given:
            logits, probabilities or any real value including ``inf``; no sigmoid is applied.
        target: ``0/1`` labels of the same shape, as bool, integer or float.
        num_labels: the number of classes ``C``; checked against ``preds`` when given.
        average: ``"weighted"`` (the challenge metric), ``"macro"`` (mean over classes with a positive) or
            ``"none"`` (per-class tensor ``(C,)``, NaN for a class without positive).
        ties: ``"max"``: tied scores share the lowest rank (scikit-learn's rule); ``"index"``: tied scores are
            ordered by column, lower column first; ``"expected"``: the exact expectation over uniformly random
            orders of tied scores (what sort-based code such as the challenge's gives on average).
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check the values of the inputs (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar, or a ``(C,)`` tensor with ``average="none"``. NaN with a warning when no label is
        positive.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_lwlrap
        >>> preds = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
        >>> target = torch.tensor([[1, 0, 1], [0, 1, 1]])
        >>> multilabel_lwlrap(preds, target)
        tensor(0.7917, dtype=torch.float64)
        >>> multilabel_lwlrap(preds, target, average="none")
        tensor([0.6667, 1.0000, 0.7500], dtype=torch.float64)
    """
    average = check_average(average)
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    precision_sum, label_count = _lwlrap_update(preds, target, num_labels, ties, ignore_index, validate_args)
    return _lwlrap_compute(precision_sum, label_count, average)


@eager_only
def multilabel_lwlrap_per_class(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tuple[Tensor, Tensor]:
    """Per-class lwlrap and per-class label weights.

    The weight of a class is its share of all positive labels; ``(per_class * weights).nansum()`` is the
    weighted (overall) lwlrap. Arguments as in :func:`multilabel_lwlrap`.

    Returns:
        ``(per_class, weights)``, two float64 tensors of shape ``(C,)``; ``per_class`` is NaN (and the weight 0)
        for a class without positive.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_lwlrap_per_class
        >>> preds = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
        >>> target = torch.tensor([[1, 0, 1], [0, 1, 1]])
        >>> per_class, weights = multilabel_lwlrap_per_class(preds, target)
        >>> per_class
        tensor([0.6667, 1.0000, 0.7500], dtype=torch.float64)
        >>> weights
        tensor([0.2500, 0.2500, 0.5000], dtype=torch.float64)
        >>> (per_class * weights).nansum()
        tensor(0.7917, dtype=torch.float64)
    """
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    precision_sum, label_count = _lwlrap_update(preds, target, num_labels, ties, ignore_index, validate_args)
    return _lwlrap_per_class(precision_sum, label_count)


# ---------------------------------------------------------------------------------------------------------------
# LRAP


def _lrap_update(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    sample_weight: Optional[Tensor],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
) -> Tuple[Tensor, Tensor]:
    """``(lrap_sum, weight_sum)`` of a batch, two float64 scalars: the weighted sum of per-sample scores."""
    return _batch_totals(preds, target, num_labels, ties, ignore_index, validate_args, sample_weight, _lrap_sums)


def _lrap_sums(sums: RankingSums, weight: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``(lrap_sum, weight_sum)`` of the samples of ``sums``."""
    per_sample = _lrap_per_sample(sums)
    if weight is None:
        # torch.full fills on the device; torch.tensor would copy from host memory, a sync on a GPU.
        return per_sample.sum(), torch.full((), per_sample.numel(), dtype=torch.float64, device=per_sample.device)
    weight = weight.to(torch.float64)
    return (per_sample * weight).sum(), weight.sum()


def _lrap_per_sample(sums: RankingSums) -> Tensor:
    """``(N,)`` float64 LRAP of each sample of ``sums``."""
    count = sums.sample_label_count
    # scikit-learn's convention: a sample with no positive, or only positives, scores 1.
    trivial = (count == 0) | (count == sums.sample_known_count)
    return torch.where(trivial, 1.0, sums.sample_precision_sum / count.clamp(min=1).to(torch.float64))


def _lrap_compute(lrap_sum: Tensor, weight_sum: Tensor) -> Tensor:
    if not weight_sum.is_meta and weight_sum == 0:  # on meta (shapes, no values) nothing to warn of
        warn("LRAP is undefined without samples (or with a total sample weight of 0): returning NaN.")
        return torch.full((), math.nan, dtype=torch.float64, device=lrap_sum.device)
    return lrap_sum / weight_sum


@eager_only
def multilabel_lrap(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    sample_weight: Optional[Tensor] = None,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""Label-ranking average precision (LRAP), as scikit-learn's ``label_ranking_average_precision_score``.

    Each sample scores the mean over its positive labels of ``L_ij / rank_ij``; LRAP is the (weighted) mean over
    samples. A sample with no positive label, or whose every (known) label is positive, scores 1.

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples), ranked as given.
        target: ``0/1`` labels of the same shape, as bool, integer or float.
        num_labels: the number of classes ``C``; checked against ``preds`` when given.
        sample_weight: non-negative weights of shape ``(N,)`` (or ``(N, ...)`` matching the extra dimensions).
        ties: ``"max"`` (scikit-learn's rule), ``"index"`` (lower column first among tied scores) or
            ``"expected"`` (the expectation over random orders of tied scores).
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check the values of the inputs (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar; NaN with a warning for an empty batch or a total weight of 0.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_lrap
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
        >>> multilabel_lrap(preds, torch.tensor([[1, 0, 0], [0, 0, 1]]))
        tensor(0.4167, dtype=torch.float64)
        >>> multilabel_lrap(preds, torch.tensor([[1, 0, 1], [0, 0, 1]]))
        tensor(0.6667, dtype=torch.float64)
    """
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    lrap_sum, weight_sum = _lrap_update(preds, target, num_labels, sample_weight, ties, ignore_index, validate_args)
    return _lrap_compute(lrap_sum, weight_sum)
