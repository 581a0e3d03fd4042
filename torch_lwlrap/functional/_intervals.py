"""Confidence intervals and paired comparisons: lwlrap and LRAP under the Poisson bootstrap, in one pass.

A bootstrap replicate of the evaluation set draws each sample ``w ~ Poisson(1)`` times; since lwlrap and LRAP are
ratios of sums over samples, a replicate's score is the same ratio of *weighted* sums. The ``*_bootstrap_update``
functions give a batch's plain sums (as :mod:`torch_lwlrap.functional`) and its ``B`` weighted copies from one
ranking of the batch; the weights and the interval statistics live in :mod:`torch_lwlrap.stats._bootstrap`.

The interval describes the sampling variability of the evaluation set: how much the score would move on another
evaluation set drawn the same way. It says nothing of the variability of training (seeds, data order).
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from torch_lwlrap._engine_config import eager_only
from torch_lwlrap.stats import _bootstrap
from torch_lwlrap.stats._bootstrap import check_level, check_num_bootstrap, check_seed
from torch_lwlrap._checks import (
    check_average, check_batch, check_batches, check_ignore_index, check_ties, rows_per_chunk,
)
from torch_lwlrap._rank_reductions import positive_counts_chunks
from torch_lwlrap._ranking import label_counts_chunks
from torch_lwlrap._tie_rules import label_precision
from torch_lwlrap.functional._lwlrap import (
    _batch_totals,
    _lrap_compute,
    _lrap_per_sample,
    _lwlrap_compute,
)

__all__ = ["Interval", "Comparison", "multilabel_lwlrap_ci", "multilabel_lrap_ci", "compare_lwlrap"]


class Interval(NamedTuple):
    """A score and its bootstrap percentile interval (scalars, or ``(C,)`` per class)."""

    value: Tensor
    low: Tensor
    high: Tensor


class Comparison(NamedTuple):
    """Two systems scored on the same samples, and their difference ``a - b`` under paired resampling.

    Overall fields are float64 scalars (the weighted lwlrap); ``per_class_*`` fields are ``(C,)`` (NaN for a class
    without a positive label; ``per_class_low``, ``per_class_high`` and ``per_class_p_value`` NaN for a class with
    fewer than two: :data:`MIN_CLASS_POSITIVES`).
    """

    value_a: Tensor
    value_b: Tensor
    difference: Tensor  #: value_a - value_b
    low: Tensor  #: percentile interval of the difference
    high: Tensor
    p_value: Tensor  #: two-sided bootstrap p-value of "no difference"
    per_class_a: Tensor
    per_class_b: Tensor
    per_class_difference: Tensor
    per_class_low: Tensor
    per_class_high: Tensor
    per_class_p_value: Tensor


# ---------------------------------------------------------------------------------------------------------------
# Reductions of a batch


def _positive_precisions(
    preds: Tensor, target: Tensor, ignore_index: Optional[int], ties: str
) -> Iterator[Tuple[int, Tensor, Tensor]]:
    """``(first row, positive (M, C) bool, precision (M, C) float64)`` a chunk of rows at a time, from the engine's
    per-positive counts (one ranking of the batch)."""
    for first, counts in label_counts_chunks(preds, target, ignore_index):
        yield first, counts.positive, label_precision(counts, ties)


def _sparse_reduction(device: torch.device) -> bool:
    """Whether positives are reduced one by one (found compact by the engine on the CPU; a ``nonzero`` elsewhere
    would wait for the device)."""
    return device.type == "cpu"


def _lwlrap_bootstrap_update(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
    key: Tensor,
    first_sample: Union[int, Tensor],
    replicate_sum: Tensor,
    replicate_count: Tensor,
) -> Tuple[Tensor, Tensor]:
    """``(precision_sum (C,), label_count (C,))`` of a batch; its replicates are added to ``replicate_sum``
    ``(B, C)`` float64 and ``replicate_count`` ``(B, C)`` int64 in place (the metric's states: no temporary of
    their size), once the whole batch is checked.

    One ranking of the batch gives every positive's precision; the plain sums add them up, the replicates add them
    with the weights of their samples (drawn from ``key``; row ``i`` of the batch, extra dimensions flattened, is
    sample ``first_sample + i`` of the stream).
    """
    _, preds, target, _ = check_batch(preds, target, num_labels, ignore_index, validate_args)
    num_classes = preds.shape[1]
    device = preds.device
    precision_sum = torch.zeros(num_classes, dtype=torch.float64, device=device)
    label_count = torch.zeros(num_classes, dtype=torch.int64, device=device)
    if _sparse_reduction(device):
        # Positives are sparse: each one's precision is reduced against its sample's weights.
        for first, entries in positive_counts_chunks(preds, target, ignore_index):
            precision = label_precision(entries.counts, ties)
            precision_sum.index_add_(0, entries.cols, precision)
            label_count += torch.bincount(entries.cols, minlength=num_classes)
            rows = entries.rows + (first + first_sample)
            _bootstrap.add_class_sums_(replicate_sum, replicate_count, key, rows, entries.cols, precision)
            del entries, rows, precision
    else:
        # A dense product with the weights: no host-device sync.
        for first, positive, precision in _positive_precisions(preds, target, ignore_index, ties):
            precision_sum += precision.sum(0)
            label_count += positive.sum(0, dtype=torch.int64)
            pairs = [(replicate_sum, precision), (replicate_count, positive)]
            _bootstrap.add_weighted_sums_(key, first + first_sample, pairs)
            del positive, precision, pairs
    return precision_sum, label_count


def _lrap_bootstrap_update(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    sample_weight: Optional[Tensor],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
    key: Tensor,
    first_sample: Union[int, Tensor],
    replicate_lrap: Tensor,
    replicate_weight: Tensor,
) -> Tuple[Tensor, Tensor]:
    """``(lrap_sum, weight_sum)`` of a batch; its replicates are added to ``replicate_lrap`` and
    ``replicate_weight`` ``(B,)`` float64 in place (row ``i`` is sample ``first_sample + i`` of the stream)."""
    first = [0]

    def reduce(sums, weight):
        per_sample = _lrap_per_sample(sums)
        weight = torch.ones_like(per_sample) if weight is None else weight.to(torch.float64)
        values = torch.stack([per_sample * weight, weight], 1)
        pairs = [(replicate_lrap.unsqueeze(1), values[:, :1]), (replicate_weight.unsqueeze(1), values[:, 1:])]
        _bootstrap.add_weighted_sums_(key, first[0] + first_sample, pairs)
        first[0] += per_sample.numel()
        return values[:, 0].sum(), values[:, 1].sum()

    # Every check (NaN scores included) before the first chunk adds to the replicates.
    _, preds, target, sample_weight = check_batch(
        preds, target, num_labels, ignore_index, validate_args, sample_weight
    )
    return _batch_totals(preds, target, num_labels, ties, ignore_index, False, sample_weight, reduce)


# ---------------------------------------------------------------------------------------------------------------
# Replicate scores


#: Positive labels a class needs for an interval and a p-value of its own (else NaN). A class's replicate is a
#: weighted mean of its positives' precisions, each fixed by its own sample's row: with one positive, every replicate
#: that draws it is that one number, an interval of width 0 and a p-value near 0 that would say nothing. The overall
#: value needs as many samples with a positive label (samples, for LRAP), for the same reason.
MIN_CLASS_POSITIVES = 2


def _lwlrap_replicates(
    replicate_sum: Tensor, replicate_count: Tensor, average: str, precision_sum: Tensor, label_count: Tensor
) -> Tensor:
    """Each replicate's lwlrap: ``(B,)``, or ``(B, C)`` with ``average="none"`` (NaN where a replicate drew no
    positive of the class, or no positive at all). ``precision_sum``, ``label_count``: the sums of the whole set.

    ``"macro"`` averages every class with a positive label in the whole set, as its value does: a class that a
    replicate drew no positive of counts at its score on the whole set. Averaging only the classes a replicate drew
    would shift the replicates towards the classes with many positives (away from the value, by more than the
    interval's width where rare classes score differently)."""
    count = replicate_count.to(torch.float64)
    if average == "none":
        return replicate_sum / count
    if average == "weighted":
        return replicate_sum.sum(1) / count.sum(1)
    per_class = torch.where(
        replicate_count > 0, replicate_sum / count, precision_sum.to(torch.float64) / label_count.to(torch.float64)
    )
    return per_class.nanmean(1)


def _class_interval(replicates: Tensor, label_count: Tensor, level: float) -> Tuple[Tensor, Tensor]:
    """Per-class percentile bounds of ``replicates`` ``(B, C)``: NaN for a class with fewer than
    :data:`MIN_CLASS_POSITIVES` positive labels in the whole set (``label_count``)."""
    low, high = _bootstrap.percentile_interval(replicates, level)
    few = label_count < MIN_CLASS_POSITIVES
    return low.masked_fill(few, math.nan), high.masked_fill(few, math.nan)


def _overall_interval(replicates: Tensor, samples: Tensor, level: float) -> Tuple[Tensor, Tensor]:
    """Percentile bounds of ``replicates`` ``(B,)``: NaN where fewer than :data:`MIN_CLASS_POSITIVES` samples
    (``samples``, a 0-dim count: those with a positive label for lwlrap) carry the value. One sample gives every
    replicate that draws it the value itself, an interval of width 0 (and a p-value near 0) that would say nothing."""
    low, high = _bootstrap.percentile_interval(replicates, level)
    few = samples < MIN_CLASS_POSITIVES
    return low.masked_fill(few, math.nan), high.masked_fill(few, math.nan)


def _labelled_samples(target: Tensor) -> Tensor:
    """The samples of a checked ``target`` ``(N, C, ...)`` with a positive label: a 0-dim count (no sync), counted a
    chunk of rows at a time (a bool target needs no mask)."""
    if target.dtype == torch.bool:
        return target.any(dim=1).sum()
    step = rows_per_chunk(target, 1)
    count = torch.zeros((), dtype=torch.int64, device=target.device)
    for start in range(0, target.shape[0], step):
        count = count + (target[start : start + step] == 1).any(dim=1).sum()
    return count


def _lrap_replicates(replicate_lrap_sum: Tensor, replicate_weight_sum: Tensor) -> Tensor:
    return replicate_lrap_sum / replicate_weight_sum


def _replicate_states(preds: Tensor, num_bootstrap: int) -> Tuple[Tensor, Tensor]:
    """Zero ``(B, C)`` replicate sums (float64) and counts (int64) for a batch like ``preds``."""
    shape = (num_bootstrap, preds.shape[1])
    return (
        torch.zeros(shape, dtype=torch.float64, device=preds.device),
        torch.zeros(shape, dtype=torch.int64, device=preds.device),
    )


def _check_bootstrap_args(num_bootstrap: int, level: float, seed: Optional[int]) -> Tuple[int, float, int]:
    num_bootstrap = check_num_bootstrap(num_bootstrap)
    if num_bootstrap == 0:
        raise ValueError("Argument `num_bootstrap` must be positive for an interval, but got 0: use 1000 or more.")
    return num_bootstrap, check_level(level), check_seed(seed, "seed")


# ---------------------------------------------------------------------------------------------------------------
# Public functions


@eager_only
def multilabel_lwlrap_ci(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    average: Optional[str] = "weighted",
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
    num_bootstrap: int = 1000,
    level: float = 0.95,
    seed: Optional[int] = None,
) -> Interval:
    """lwlrap and its bootstrap percentile interval, from one ranking of the batch.

    Arguments as in :func:`torch_lwlrap.multilabel_lwlrap`, and:

    Args:
        num_bootstrap: the number of bootstrap replicates ``B`` (1000 gives bounds stable to about 0.1 of the
            interval's width). Their per-class sums and counts take ``16 B C`` bytes (16 MB at ``B = C = 1000``).
        level: the interval's coverage, in ``(0, 1)``.
        seed: makes the interval reproducible (None: derived from torch's default generator without advancing it,
            so seeding torch repeats it).

    Returns:
        ``Interval(value, low, high)``: float64 scalars, or ``(C,)`` tensors with ``average="none"`` (bounds NaN for
        a class with fewer than two positive labels: :data:`MIN_CLASS_POSITIVES`). With ``average="macro"``, a
        replicate that drew no positive of a class counts that class at its score on the whole set.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_lwlrap_ci
        >>> g = torch.Generator().manual_seed(0)
        >>> target = torch.rand(300, 5, generator=g) < 0.3
        >>> preds = target + torch.randn(300, 5, generator=g)
        >>> value, low, high = multilabel_lwlrap_ci(preds, target, seed=0)
        >>> bool(low < value < high)
        True
    """
    average = check_average(average)
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    num_bootstrap, level, seed = _check_bootstrap_args(num_bootstrap, level, seed)
    _, preds, target, _ = check_batch(preds, target, num_labels, ignore_index, validate_args)
    key = _bootstrap.stream_key(seed, 0, device=preds.device)
    replicate_sum, replicate_count = _replicate_states(preds, num_bootstrap)
    precision_sum, label_count = _lwlrap_bootstrap_update(
        preds, target, num_labels, ties, ignore_index, False, key, 0, replicate_sum, replicate_count
    )
    value = _lwlrap_compute(precision_sum, label_count, average)
    replicates = _lwlrap_replicates(replicate_sum, replicate_count, average, precision_sum, label_count)
    if average == "none":
        return Interval(value, *_class_interval(replicates, label_count, level))
    return Interval(value, *_overall_interval(replicates, _labelled_samples(target), level))


@eager_only
def multilabel_lrap_ci(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    sample_weight: Optional[Tensor] = None,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
    num_bootstrap: int = 1000,
    level: float = 0.95,
    seed: Optional[int] = None,
) -> Interval:
    """LRAP and its bootstrap percentile interval. Arguments as in :func:`torch_lwlrap.multilabel_lrap` and
    :func:`multilabel_lwlrap_ci`.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_lrap_ci
        >>> g = torch.Generator().manual_seed(0)
        >>> target = torch.rand(300, 5, generator=g) < 0.3
        >>> preds = target + torch.randn(300, 5, generator=g)
        >>> value, low, high = multilabel_lrap_ci(preds, target, seed=0)
        >>> bool(low < value < high)
        True
    """
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    num_bootstrap, level, seed = _check_bootstrap_args(num_bootstrap, level, seed)
    device = preds.device if isinstance(preds, Tensor) else None
    key = _bootstrap.stream_key(seed, 0, device=device)
    replicate_lrap = torch.zeros(num_bootstrap, dtype=torch.float64, device=device)
    replicate_weight = torch.zeros(num_bootstrap, dtype=torch.float64, device=device)
    lrap_sum, weight_sum = _lrap_bootstrap_update(
        preds, target, num_labels, sample_weight, ties, ignore_index, validate_args, key, 0, replicate_lrap,
        replicate_weight,
    )
    value = _lrap_compute(lrap_sum, weight_sum)
    samples = torch.tensor(target.shape[0] * math.prod(target.shape[2:]), device=device)
    if sample_weight is not None:  # (N,): each weighs its sample's frames; (N, T, ...): one weight a sample
        frames = math.prod(target.shape[2:]) if sample_weight.ndim == 1 else 1
        samples = (sample_weight != 0).sum() * frames
    low, high = _overall_interval(_lrap_replicates(replicate_lrap, replicate_weight), samples, level)
    return Interval(value, low, high)


@eager_only
def compare_lwlrap(
    preds_a: Tensor,
    preds_b: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
    num_bootstrap: int = 1000,
    level: float = 0.95,
    seed: Optional[int] = None,
) -> Comparison:
    """Compare two systems scored on the same samples: lwlrap of each, ``a - b``, its interval and p-value.

    Paired resampling: both systems' replicates use the same weights, so the sampling variability the two share
    cancels in the difference (the more alike the systems' errors, the narrower its interval next to each
    system's own). Overall values are the weighted (challenge) lwlrap; ``per_class_*`` are per class.

    Args:
        preds_a, preds_b: scores of the two systems, the same shape as ``target``.
        target, num_labels, ties, ignore_index, validate_args: as in :func:`torch_lwlrap.multilabel_lwlrap`.
        num_bootstrap, level, seed: as in :func:`multilabel_lwlrap_ci`.

    Returns:
        A :class:`Comparison`. ``p_value`` is the two-sided bootstrap p-value of "no difference"
        (:func:`torch_lwlrap.stats._bootstrap.paired_p_value`); identical systems give a difference of exactly 0, a
        zero-width interval and ``p_value`` 1.

    Example:
        >>> import torch
        >>> from torch_lwlrap import compare_lwlrap
        >>> g = torch.Generator().manual_seed(0)
        >>> target = torch.rand(300, 5, generator=g) < 0.3
        >>> noise = torch.randn(300, 5, generator=g)
        >>> result = compare_lwlrap(2 * target + noise, target + noise, target, seed=0)
        >>> bool(result.difference > 0), bool(result.low > 0), bool(result.p_value < 0.05)
        (True, True, True)
    """
    check_ties(ties)
    ignore_index = check_ignore_index(ignore_index)
    num_bootstrap, level, seed = _check_bootstrap_args(num_bootstrap, level, seed)
    if isinstance(preds_a, Tensor) and isinstance(preds_b, Tensor) and preds_a.shape != preds_b.shape:
        raise ValueError(
            f"Arguments `preds_a` and `preds_b` must score the same samples and classes, but got shapes "
            f"{tuple(preds_a.shape)} and {tuple(preds_b.shape)}: pass both systems' scores for the same rows of "
            f"`target`, in the same order."
        )
    # Both systems are checked before either is ranked: a bad one raises before any work, naming its argument.
    preds_a, preds_b, target = check_batches(
        (("preds_a", preds_a), ("preds_b", preds_b)), target, num_labels, ignore_index, validate_args
    )
    key = _bootstrap.stream_key(seed, 0, device=preds_a.device)
    results = []
    for preds in (preds_a, preds_b):
        replicates = _replicate_states(preds, num_bootstrap)
        sums = _lwlrap_bootstrap_update(preds, target, num_labels, ties, ignore_index, False, key, 0, *replicates)
        results.append(sums + replicates)
    (sum_a, count, rep_sum_a, rep_count), (sum_b, _, rep_sum_b, _) = results
    value_a = _lwlrap_compute(sum_a, count, "weighted")
    value_b = _lwlrap_compute(sum_b, count, "weighted", warn_empty=False)  # the same labels: value_a has warned
    per_class_a = _lwlrap_compute(sum_a, count, "none")
    per_class_b = _lwlrap_compute(sum_b, count, "none")
    def replicates(rep_sum: Tensor, whole_sum: Tensor, average: str) -> Tensor:
        return _lwlrap_replicates(rep_sum, rep_count, average, whole_sum, count)

    overall = replicates(rep_sum_a, sum_a, "weighted") - replicates(rep_sum_b, sum_b, "weighted")
    per_class = replicates(rep_sum_a, sum_a, "none") - replicates(rep_sum_b, sum_b, "none")
    samples = _labelled_samples(target)
    low, high = _overall_interval(overall, samples, level)
    per_class_low, per_class_high = _class_interval(per_class, count, level)
    per_class_p_value = _bootstrap.paired_p_value(per_class).masked_fill_(count < MIN_CLASS_POSITIVES, math.nan)
    return Comparison(
        value_a,
        value_b,
        value_a - value_b,
        low,
        high,
        _bootstrap.paired_p_value(overall).masked_fill_(samples < MIN_CLASS_POSITIVES, math.nan),
        per_class_a,
        per_class_b,
        per_class_a - per_class_b,
        per_class_low,
        per_class_high,
        per_class_p_value,
    )
