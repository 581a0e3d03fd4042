"""Functional interface of the learning-to-rank metrics beyond binary targets: NDCG with graded relevance, and two
rankings compared label by label (rank correlation, Kendall distance at k).

Each ``_*_update`` function turns a batch into the sums the metric classes of :mod:`torch_lwlrap.metrics._ltr`
accumulate; the public functions finish the same sums. The CPU takes the compiled kernels of
:mod:`torch_lwlrap._ltr_numba` where numba is installed and the engine allows (``"auto"`` or ``"numba"``), every
other case the torch paths of :mod:`torch_lwlrap._ltr_torch`.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap import _dispatch, _ltr_numba, _ltr_torch
from torch_lwlrap._engine_config import eager_only, forced_chunk_elements, get_engine
from torch_lwlrap._checks import (
    check_empty_target,
    check_gain,
    check_graded,
    check_graded_ignore_index,
    check_k,
    check_method,
    check_pair,
    check_ties,
    flat_rows,
    flat_weights,
    graded_known,
    pair_nan_error,
    row_chunks,
)

__all__ = ["multilabel_ndcg", "multilabel_rank_correlation", "multilabel_kendall_distance_at_k"]

def _compiled(rows: Tensor) -> bool:
    return _dispatch.compiled_cpu_pass("rank_agreement", rows.device, rows.dtype)


def _compiled_pair(first, second) -> bool:
    """Whether the compiled kernels take this pair of score tensors (decided once per batch: then every chunk takes
    them, and their pass checks the scores for NaN instead of the gate)."""
    return (
        isinstance(first, Tensor) and isinstance(second, Tensor) and first.is_floating_point()
        and second.is_floating_point() and _compiled(first) and _compiled(second)
    )


def _warn_if_forced_unserved(scores: Tensor) -> None:
    """Under an engine forced to a compiled backend (``"numba"`` or ``"triton"``) that cannot take these scores, the
    warning lwlrap gives, once per cause: the torch path ranks them instead."""
    engine = get_engine()
    if engine != "auto":
        _dispatch.warn_if_unserved(engine, scores.device, scores.dtype)


def _pair_chunks(rows_a: Tensor, rows_b: Tensor, compiled: bool) -> Iterator[Tuple[int, int]]:
    """``(start, stop)`` of the chunks of rows a pair is compared in: all rows at once where the compiled kernels
    read both in place (float32 or float64 of one dtype, contiguous: no copy is made, and their outputs take a few
    bytes per row), which spares a parallel region per chunk (8% of a Spearman pass at 20,000 x 527); else chunks
    within the workspace budget (float16 rows widened, torch's sorts), as when a chunk size is forced."""
    num_rows, num_classes = rows_a.shape
    forced = forced_chunk_elements()
    in_place = (
        rows_a.dtype == rows_b.dtype and rows_a.dtype in (torch.float32, torch.float64)
        and rows_a.is_contiguous() and rows_b.is_contiguous()
    )
    if compiled and in_place and forced is None:
        return iter([(0, num_rows)])
    return row_chunks(num_rows, num_classes, forced)


def _ratio(value: Tensor, weight: Tensor) -> Tensor:
    # NaN where nothing counts; no host-device sync.
    weight = weight.to(torch.float64)
    return torch.where(weight > 0, value / torch.where(weight > 0, weight, 1.0), math.nan)


# ---------------------------------------------------------------------------------------------------------------
# NDCG with graded relevance


def _ndcg_update(
    preds: Tensor,
    relevance: Tensor,
    num_labels: Optional[int],
    k: Optional[int],
    gain: str,
    ties: str,
    ignore_index: Optional[int],
    validate_args: bool,
    sample_weight: Optional[Tensor] = None,
) -> Dict[str, Tensor]:
    """``{"ndcg_sum", "ndcg_weight", "ndcg_query_weight"}``: float64 sums over the batch's samples of the (weighted)
    NDCG, of the weights and of the weights of samples whose ideal DCG is above 0."""
    preds, relevance, sample_weight = check_graded(
        preds, relevance, num_labels, ignore_index, gain, validate_args, sample_weight
    )
    _warn_if_forced_unserved(preds)
    weights = flat_weights(sample_weight, preds)
    scores, grades = flat_rows(preds), flat_rows(relevance)
    num_rows, num_classes = scores.shape
    device = scores.device
    cut = num_classes if k is None else min(k, num_classes)
    totals = {name: torch.zeros((), dtype=torch.float64, device=device) for name in _NDCG_STATES}
    for start, stop in row_chunks(num_rows, num_classes, forced_chunk_elements()):
        chunk = scores[start:stop]
        if chunk.dtype in (torch.float16, torch.bfloat16):
            chunk = chunk.float()
        grade = grades[start:stop]
        known = graded_known(grade, ignore_index)
        gain_values = _ltr_torch.gains(grade, gain)
        if known is not None:
            gain_values = torch.where(known, gain_values, 0.0)
        value, has_ideal = _ltr_torch.ndcg_rows(chunk, gain_values, known, cut, ties)
        if weights is None:
            totals["ndcg_sum"] += value.sum()
            totals["ndcg_weight"] += stop - start
            totals["ndcg_query_weight"] += has_ideal.sum()
        else:
            weight = weights[start:stop].to(torch.float64)
            totals["ndcg_sum"] += (value * weight).sum()
            totals["ndcg_weight"] += weight.sum()
            totals["ndcg_query_weight"] += torch.where(has_ideal, weight, 0.0).sum()
    return totals


_NDCG_STATES = ("ndcg_sum", "ndcg_weight", "ndcg_query_weight")


def _ndcg_compute(state: Dict[str, Tensor], empty_target: str) -> Tensor:
    weight = state["ndcg_query_weight" if empty_target == "skip" else "ndcg_weight"]
    return _ratio(state["ndcg_sum"], weight)


@eager_only
def multilabel_ndcg(
    preds: Tensor,
    relevance: Tensor,
    k: Optional[int] = None,
    *,
    gain: str = "exponential",
    ties: str = "max",
    ignore_index: Optional[int] = None,
    empty_target: str = "zero",
    sample_weight: Optional[Tensor] = None,
    validate_args: bool = True,
) -> Tensor:
    r"""NDCG at ``k`` with graded relevance: each sample is a query over its labels, ranked by score.

    For a sample whose labels, ranked by ``preds``, have relevance grades ``rel_1, rel_2, ...`` (in ranked order),
    ``DCG@k = sum_{i <= k} g(rel_i) / log2(i + 1)`` with the gain ``g(rel) = 2**rel - 1`` (``"exponential"``) or
    ``g(rel) = rel`` (``"linear"``, scikit-learn's ``ndcg_score``), and ``NDCG@k = DCG@k / IDCG@k``, where
    ``IDCG@k`` is the DCG of the labels ordered by relevance. The score is the (weighted) mean over samples. With
    0/1 relevance both gains give the NDCG of :func:`multilabel_retrieval_at_k` (``metrics=("ndcg",)``).

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples), ranked as given.
        relevance: non-negative, finite relevance grades of the same shape (bool, integer or float).
        k: the cut-off, a positive integer (any may exceed ``C``: then every label counts, at the cost of
            ``k = C``), or None for every label.
        gain: ``"exponential"`` (``2**rel - 1``; grades below 1024) or ``"linear"`` (``rel``).
        ties: ``"max"``: every label of a tie group takes the group's last position (pessimistic, independent of
            the column order); ``"index"``: tied scores ordered by column, lower column first; ``"expected"``:
            the expectation over uniformly random orders of the tied labels, which gives each position of a tie
            group the group's mean gain (scikit-learn's ``ndcg_score(..., ignore_ties=False)``).
        ignore_index: a negative grade marking unknown labels, removed from their sample's ranking.
        empty_target: ``"zero"``: a sample whose ideal DCG is 0 (no relevant label) scores 0; ``"skip"``: it is
            left out of the mean.
        sample_weight: non-negative weights ``(N,)`` (or ``(N, ...)`` matching the extra dimensions).
        validate_args: check the values of the inputs (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar; NaN when no sample counts.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_ndcg
        >>> preds = torch.tensor([[0.9, 0.8, 0.1, 0.4]])
        >>> relevance = torch.tensor([[0, 3, 1, 2]])
        >>> multilabel_ndcg(preds, relevance, k=2)  # gains 0 then 7 against 7 then 3: (7/log2(3)) / (7 + 3/log2(3))
        tensor(0.4966, dtype=torch.float64)
        >>> multilabel_ndcg(preds, relevance, gain="linear")
        tensor(0.6979, dtype=torch.float64)
    """
    k = check_k(k, allow_none=True)
    check_gain(gain)
    check_ties(ties)
    check_empty_target(empty_target)
    ignore_index = check_graded_ignore_index(ignore_index)
    state = _ndcg_update(preds, relevance, None, k, gain, ties, ignore_index, validate_args, sample_weight)
    return _ndcg_compute(state, empty_target)


# ---------------------------------------------------------------------------------------------------------------
# Two rankings compared


def _correlation_update(
    preds: Tensor, reference: Tensor, num_labels: Optional[int], method: str, validate_args: bool
) -> Dict[str, Tensor]:
    """``{"rank_correlation_sum" float64, "rank_correlation_count" int64, "rank_correlation_constant_count"
    int64}``: the sum of the per-sample correlations, the samples that have one, and those left out (a constant
    row)."""
    names = ("preds", "reference")
    compiled = _compiled_pair(preds, reference)
    preds, reference = check_pair(preds, reference, num_labels, validate_args, names, nan_later=compiled)
    _warn_if_forced_unserved(preds)
    rows_a, rows_b = flat_rows(preds), flat_rows(reference)
    num_rows, num_classes = rows_a.shape
    device = rows_a.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.int64, device=device)
    for start, stop in _pair_chunks(rows_a, rows_b, compiled):
        a, b = rows_a[start:stop], rows_b[start:stop]
        if compiled:
            value, defined, nan_found = _ltr_numba.correlation_rows(a, b, method, check_nan=validate_args)
            if nan_found:
                raise pair_nan_error(preds, reference, names)
        else:
            value, defined = _ltr_torch.correlation_rows(_widened(a), _widened(b), method)
        total += value.sum()
        count += defined.sum()
    return {
        "rank_correlation_sum": total,
        "rank_correlation_count": count,
        "rank_correlation_constant_count": num_rows - count,
    }


def _widened(rows: Tensor) -> Tensor:
    # float16 and bfloat16 widened to float32: exact, so order and ties are kept, and every device sorts it.
    return rows.float() if rows.dtype in (torch.float16, torch.bfloat16) else rows


@eager_only
def multilabel_rank_correlation(
    preds: Tensor, reference: Tensor, *, method: str = "spearman", validate_args: bool = True
) -> Tensor:
    r"""The rank correlation between two rankings of each sample's labels, averaged over samples: a student against
    its teacher, a quantized model against the original, two checkpoints or two systems.

    Per sample ``i``, the correlation between the ranking of ``preds[i]`` and that of ``reference[i]`` over the
    ``C`` labels: ``"spearman"``, Spearman's rho, ``cov(R(x), R(y)) / (sd(R(x)) sd(R(y)))`` on the ranks, tied
    scores taking their average rank (scipy's ``spearmanr``); ``"kendall"``, Kendall's tau-b (scipy's
    ``kendalltau`` default), ``(P - Q) / sqrt((P + Q + T_x) (P + Q + T_y))`` with ``P`` concordant and ``Q``
    discordant pairs and ``T_x``, ``T_y`` the pairs tied in one row only. Each is computed exactly in
    ``O(C log C)`` per sample.

    A sample where either row is constant (every label tied, or ``C = 1``) has no correlation: it is left out of
    the mean. :class:`torch_lwlrap.MultilabelRankCorrelation` counts such samples (``constant_rows()``).

    Args:
        preds: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples).
        reference: floating scores of the same shape: the ranking compared with.
        method: ``"spearman"`` or ``"kendall"``.
        validate_args: check the scores for NaN (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar in ``[-1, 1]``; NaN when no sample has a correlation.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_rank_correlation
        >>> student = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.1, 0.3, 0.2, 0.0]])
        >>> teacher = torch.tensor([[3.0, 0.5, 1.0, -2.0], [0.0, 0.9, 0.1, 0.2]])
        >>> multilabel_rank_correlation(student, teacher)  # (0.8 + 0.4) / 2
        tensor(0.6000, dtype=torch.float64)
        >>> multilabel_rank_correlation(student, teacher, method="kendall")  # (4/6 + 2/6) / 2
        tensor(0.5000, dtype=torch.float64)
    """
    method = check_method(method)
    state = _correlation_update(preds, reference, None, method, validate_args)
    return _ratio(state["rank_correlation_sum"], state["rank_correlation_count"])


def _distance_update(
    preds_a: Tensor, preds_b: Tensor, num_labels: Optional[int], k: int, validate_args: bool
) -> Dict[str, Tensor]:
    """``{"kendall_distance_sum" float64, "kendall_distance_count" int64}`` over the batch's samples."""
    compiled = _compiled_pair(preds_a, preds_b)
    preds_a, preds_b = check_pair(preds_a, preds_b, num_labels, validate_args, nan_later=compiled)
    _warn_if_forced_unserved(preds_a)
    rows_a, rows_b = flat_rows(preds_a), flat_rows(preds_b)
    num_rows, num_classes = rows_a.shape
    total = torch.zeros((), dtype=torch.float64, device=rows_a.device)
    for start, stop in _pair_chunks(rows_a, rows_b, compiled):
        a, b = rows_a[start:stop], rows_b[start:stop]
        if compiled:
            distance, nan_found = _ltr_numba.distance_rows(a, b, k, check_nan=validate_args)
            if nan_found:
                raise pair_nan_error(preds_a, preds_b)
            total += distance.sum()
        else:
            total += _ltr_torch.distance_rows(_widened(a), _widened(b), k).sum()
    return {
        "kendall_distance_sum": total,
        "kendall_distance_count": torch.full((), num_rows, dtype=torch.int64, device=rows_a.device),  # no host copy
    }


@eager_only
def multilabel_kendall_distance_at_k(
    preds_a: Tensor, preds_b: Tensor, k: int, *, validate_args: bool = True
) -> Tensor:
    r"""The normalized Kendall tau distance at ``k`` between two rankings of each sample's labels, averaged over
    samples: how differently two models order the labels that either puts in its top ``k``.

    Per sample, ``U`` is the union of the two top-``k`` label sets (ties at the k-th place broken by the lower
    column, as ``ties="index"``) and ``n = |U|``. The distance is the number of pairs of labels in ``U`` that the
    two full rankings order oppositely, a pair tied in exactly one ranking counting 1/2 and a pair tied in both 0,
    divided by ``n (n - 1) / 2``; 0 when ``n < 2``. 0: the same order of the top labels; 1: reversed. With
    ``k >= C`` and no ties it is ``(1 - tau) / 2``.

    Args:
        preds_a: floating scores ``(N, C)`` or ``(N, C, ...)`` (extra dimensions become samples).
        preds_b: floating scores of the same shape.
        k: a positive integer (any may exceed ``C``: the cost is that of ``k = C``).
        validate_args: check the scores for NaN (one host-device sync). Shapes are always checked.

    Returns:
        A float64 scalar in ``[0, 1]``; NaN for an empty batch.

    Example:
        >>> import torch
        >>> from torch_lwlrap import multilabel_kendall_distance_at_k
        >>> student = torch.tensor([[0.9, 0.8, 0.1, 0.4, 0.0]])
        >>> teacher = torch.tensor([[0.8, 0.9, 0.3, 0.2, 0.1]])
        >>> multilabel_kendall_distance_at_k(student, teacher, k=2)  # U = {0, 1}: 1 pair, reversed
        tensor(1., dtype=torch.float64)
        >>> multilabel_kendall_distance_at_k(student, teacher, k=3)  # U = {0, 1, 2, 3}: 2 of 6 pairs
        tensor(0.3333, dtype=torch.float64)
    """
    k = check_k(k)
    state = _distance_update(preds_a, preds_b, None, k, validate_args)
    return _ratio(state["kendall_distance_sum"], state["kendall_distance_count"])
