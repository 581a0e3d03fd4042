"""Functional interface of the ranking metrics beside lwlrap: coverage error, ranking loss, one-error and the
label-retrieval metrics at k.

Each is a reduction over the ranks of the positive labels (:mod:`torch_lwlrap._rank_reductions`), computed by one
pass of the engine per batch; :func:`_ranking_update` returns the sums the metric classes accumulate.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import torch
from torch import Tensor

from torch_lwlrap._engine_config import eager_only
from torch_lwlrap._checks import check_empty_target, _ignore_value, check_ignore_index, chunk_samples
from torch_lwlrap._rank_reductions import (
    RETRIEVAL_METRICS,
    RankingSpec,
    check_ks,
    check_rank_ties,
    check_retrieval_metrics,
    chunk_sums,
    finish,
    needs_known_count,
    positive_counts_chunks,
    state_shapes,
)
from torch_lwlrap._ranking import forced_chunk_elements
from torch_lwlrap._checks import check_batch

__all__ = [
    "multilabel_coverage_error",
    "multilabel_ranking_loss",
    "multilabel_one_error",
    "multilabel_retrieval_at_k",
]


def _ranking_update(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    sample_weight: Optional[Tensor],
    spec: RankingSpec,
    ignore_index: Optional[int],
    validate_args: bool,
) -> Dict[str, Tensor]:
    """The sums of ``spec``'s metrics over a batch (:func:`torch_lwlrap._rank_reductions.state_shapes`).

    The whole batch is checked first (nothing is summed from a bad batch); then one ranking pass, a chunk of
    samples at a time: extra dimensions ``(N, C, ...)`` become samples chunk by chunk, so the workspace stays
    bounded.
    """
    # Values only from here on: scores that carry gradients never reach autograd.
    _, preds, target, sample_weight = check_batch(preds, target, num_labels, ignore_index, validate_args, sample_weight)
    num_samples, num_classes = preds.shape[:2]
    device = preds.device
    totals = {
        name: torch.zeros(shape, dtype=dtype, device=device)
        for name, (shape, dtype) in state_shapes(spec, num_classes).items()
    }
    ignore = _ignore_value(target, ignore_index)
    known_needed = needs_known_count(spec) and ignore is not None
    step = chunk_samples(preds, target, ignore_index, forced_chunk_elements())
    for start in range(0, num_samples, step):
        scores, labels = preds[start : start + step], target[start : start + step]
        weight = None if sample_weight is None else sample_weight[start : start + step]
        if scores.ndim > 2:
            extra = scores.shape[2:]
            scores = scores.movedim(1, -1).reshape(-1, num_classes)
            labels = labels.movedim(1, -1).reshape(-1, num_classes)
            if weight is not None:
                if weight.ndim == 1:
                    weight = weight.reshape((-1,) + (1,) * len(extra)).expand((-1,) + tuple(extra))
                weight = weight.reshape(-1)
        for first, entries in positive_counts_chunks(scores, labels, ignore_index):
            rows = entries.num_rows
            known = None
            if known_needed:
                known = entries.known_count
                if known is None:
                    known = (labels[first : first + rows] != ignore).sum(1, dtype=torch.int64)
            part = None if weight is None else weight[first : first + rows]
            for name, value in chunk_sums(entries, known, part, spec).items():
                totals[name] += value
            del entries, known, part  # freed before the next block is counted
    return totals


def _scalar_metric(
    name: str,
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    sample_weight: Optional[Tensor],
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
) -> Tensor:
    spec = RankingSpec((name,), check_rank_ties(ties))
    ignore_index = check_ignore_index(ignore_index)
    state = _ranking_update(preds, target, num_labels, sample_weight, spec, ignore_index, validate_args)
    return finish(spec, state)[name]


@eager_only
def multilabel_coverage_error(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    sample_weight: Optional[Tensor] = None,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""Coverage error, as scikit-learn's ``coverage_error``: how far down its ranking a sample must go to cover all
    of its positive labels.

    Per sample, the largest rank of a positive label, ``max_j rank_ij`` (0 for a sample without positive); the
    score is the (weighted) mean over samples. Lower is better; the best value is the number of positives.

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples), ranked as given.
        target: ``0/1`` labels of the same shape, as bool, integer or float.
        num_labels: the number of classes ``C``; checked against ``preds`` when given.
        sample_weight: non-negative weights ``(N,)`` (or ``(N, ...)`` matching the extra dimensions).
        ties: ``"max"`` (scikit-learn's rule: tied labels all take the last position of their group),
            ``"index"`` (tied scores ordered by column, lower column first) or ``"expected"`` (the expectation
            over uniformly random orders of the tied labels, exact).
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check the values of the inputs (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar; NaN for an empty batch or a total weight of 0.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_coverage_error
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
        >>> target = torch.tensor([[1, 0, 0], [0, 0, 1]])
        >>> multilabel_coverage_error(preds, target)  # ranks 2 and 3
        tensor(2.5000, dtype=torch.float64)
    """
    return _scalar_metric(
        "coverage_error", preds, target, num_labels, sample_weight, ties, ignore_index, validate_args
    )


@eager_only
def multilabel_ranking_loss(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    sample_weight: Optional[Tensor] = None,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""Label ranking loss, as scikit-learn's ``label_ranking_loss``: the share of (positive, negative) label pairs
    of a sample that are ordered wrong.

    Per sample ``i`` with ``m_i`` positives among its ``K_i`` labels, ``sum_j (rank_ij - L_ij) / (m_i (K_i - m_i))``
    over its positives ``j``: with ``ties="max"`` a negative tied with a positive counts as a wrong pair (as
    scikit-learn counts it), with ``ties="index"`` only a negative strictly ahead in the column-ordered ranking
    does, with ``ties="expected"`` half a pair. A sample without positive or without negative scores 0. The score
    is the (weighted) mean over samples; lower is better.

    Arguments as in :func:`multilabel_coverage_error`.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_ranking_loss
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
        >>> target = torch.tensor([[1, 0, 0], [0, 0, 1]])
        >>> multilabel_ranking_loss(preds, target)  # 1 of 2 pairs, then 2 of 2
        tensor(0.7500, dtype=torch.float64)
    """
    return _scalar_metric("ranking_loss", preds, target, num_labels, sample_weight, ties, ignore_index, validate_args)


@eager_only
def multilabel_one_error(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    sample_weight: Optional[Tensor] = None,
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""One-error: the share of samples whose top-ranked label is not positive (``1 - hit@1``).

    A sample is right when a positive label has rank 1. With ``ties="max"`` every label of a tie group takes the
    group's last position, so a top score shared by two or more labels is never right, even when they are all
    positive (pessimistic: constant scores cannot score well). With ``ties="index"`` the lowest column among the
    top-scored labels is the top label. With ``ties="expected"`` a sample whose top score is shared by ``g``
    labels, ``p`` of them positive, is wrong with probability ``1 - p / g``. A sample without a positive label
    (after ``ignore_index``) counts as an error. The score is the (weighted) mean over samples; lower is better.

    Arguments as in :func:`multilabel_coverage_error`.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_one_error
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1], [0.5, 0.5, 0.1]])
        >>> target = torch.tensor([[0, 0, 1], [0, 0, 1], [1, 0, 0]])
        >>> multilabel_one_error(preds, target)  # right, wrong, and a tie at the top
        tensor(0.6667, dtype=torch.float64)
        >>> multilabel_one_error(preds, target, ties="index")  # column 0 comes first among the tied
        tensor(0.3333, dtype=torch.float64)
    """
    return _scalar_metric("one_error", preds, target, num_labels, sample_weight, ties, ignore_index, validate_args)


@eager_only
def multilabel_retrieval_at_k(
    preds: Tensor,
    target: Tensor,
    k: Union[int, Sequence[int]],
    num_labels: Optional[int] = None,
    *,
    metrics: Sequence[str] = RETRIEVAL_METRICS,
    sample_weight: Optional[Tensor] = None,
    empty_target: str = "zero",
    ties: str = "max",
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> Dict[str, Tensor]:
    r"""Label-retrieval metrics at ``k``: each sample is a query over its labels, ranked by score.

    For a sample with ``m`` positives among its labels and the rank ``r_j`` of each positive ``j`` (see ``ties``),
    ``T_k = #{j : r_j <= k}`` the positives in the top ``k`` and ``r*`` the best rank of a positive:

    * ``"hit"``: 1 when ``r* <= k``, else 0;
    * ``"precision"``: ``T_k / k`` (always over ``k``, also when the sample has fewer labels);
    * ``"recall"``: ``T_k / m``;
    * ``"ap"``: ``(1 / min(m, k)) * sum over positives with r_j <= k of L_j / r_j``, where ``L_j`` counts the
      positives ranked at or above ``j`` (the precision at ``j``): 1 when the top ``min(m, k)`` are all positive;
    * ``"rr"``: ``1 / r*`` when ``r* <= k``, else 0 (reciprocal rank cut at ``k``);
    * ``"ndcg"``: ``sum over r_j <= k of 1 / log2(r_j + 1)``, divided by the same for ``min(m, k)`` positives
      ranked first (binary gains).

    Each is averaged over samples (weighted by ``sample_weight``). A sample without positive scores 0 in every
    metric with ``empty_target="zero"``, and is left out of the average with ``"skip"``.

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)``, ranked as given.
        target: ``0/1`` labels of the same shape.
        k: a positive integer or a sequence of them (any may exceed ``C``).
        num_labels: the number of classes ``C``; checked against ``preds`` when given.
        metrics: a subset of ``("hit", "precision", "recall", "ap", "rr", "ndcg")``.
        sample_weight: non-negative weights ``(N,)`` (or ``(N, ...)`` matching the extra dimensions).
        empty_target: ``"zero"`` or ``"skip"``, for samples without a positive label.
        ties: ``"max"``: every label of a tie group takes the group's last position, so a group that straddles
            position ``k`` is entirely outside the top ``k`` (pessimistic and independent of the column order);
            ``"index"``: tied scores ordered by column, lower column first, and the top ``k`` is exactly ``k``
            labels; ``"expected"``: each value's expectation when the tied labels are put in a uniformly random
            order (a group straddling position ``k`` contributes the share of its orders that bring a positive
            into the top ``k``), computed exactly from the counts.
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check the values of the inputs (one host-device sync). Shapes are always checked.

    Returns:
        ``{"<metric>@<k>": float64 scalar}`` for each metric and ``k``; NaN where no sample counts.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_retrieval_at_k
        >>> preds = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.1, 0.9, 0.2, 0.3]])
        >>> target = torch.tensor([[0, 1, 0, 1], [0, 1, 0, 0]])
        >>> scores = multilabel_retrieval_at_k(preds, target, k=(1, 2), metrics=("precision", "ap"))
        >>> {name: round(value.item(), 4) for name, value in scores.items()}
        {'precision@1': 0.5, 'precision@2': 0.5, 'ap@1': 0.5, 'ap@2': 0.625}
    """
    spec = RankingSpec(("retrieval",), check_rank_ties(ties), check_ks(k), check_retrieval_metrics(metrics))
    check_empty_target(empty_target)
    ignore_index = check_ignore_index(ignore_index)
    state = _ranking_update(preds, target, num_labels, sample_weight, spec, ignore_index, validate_args)
    return finish(spec, state, empty_target)
