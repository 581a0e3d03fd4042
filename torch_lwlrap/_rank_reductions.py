"""The ranking metrics beside lwlrap, as reductions over each positive label's counts.

The engine (:func:`torch_lwlrap._ranking.label_counts_chunks`) gives, for every positive label ``j`` of a sample
``i`` (ignored labels removed from the row), how many labels score strictly higher, how many tie with it, and how
many of those are positive. Each tie rule turns them into the label's rank and the positives ranked at or above it:

* ``ties="max"``: ``rank_ij = above + tied`` (every label of a tie group takes the group's last position) and
  ``L_ij = above_positive + tied_positive``;
* ``ties="index"``: ``rank_ij = above + tied_before + 1`` (tied labels ordered by column) and
  ``L_ij = above_positive + tied_positive_before + 1``.

Every metric here is a per-sample function of these ranks and of the sample's numbers of positives ``m_i`` and of
labels ``K_i`` (ignored labels not counted), summed over samples with optional weights: :func:`chunk_sums` returns
those sums for one chunk of samples, under the state names the metric classes accumulate. One pass of the engine
serves any subset of the metrics.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from torch_lwlrap import _dispatch, _numba_counts
from torch_lwlrap._checks import formatted_chunks
from torch_lwlrap._options import EMPTY_TARGET, TIES, check_names, whole_number  # noqa: F401 - EMPTY_TARGET re-exported
from torch_lwlrap._ranking import (
    LabelCounts,
    _true_indices,
    forced_chunk_elements,
    label_counts_chunks,
    label_precision,
)

#: Metrics :func:`chunk_sums` can reduce, in the order of their states.
RANKING_METRICS = ("coverage_error", "ranking_loss", "one_error", "retrieval", "lwlrap", "lrap")

#: Retrieval metrics at k, in the order of their states.
RETRIEVAL_METRICS = ("hit", "precision", "recall", "ap", "rr", "ndcg")

#: What a retrieval metric does with a sample without any positive label.

#: Devices on which :func:`positive_entries` gathers the positives (elsewhere it masks every cell).
GATHER_DEVICES = ("cpu",)

#: Tie rules of these metrics: every rule of the package (one definition, :data:`torch_lwlrap._options.TIES`).
RANK_TIES = TIES


class RankingSpec(NamedTuple):
    """What :func:`chunk_sums` reduces: a subset of :data:`RANKING_METRICS`, the k's and retrieval metrics."""

    metrics: Tuple[str, ...]
    ties: str = "max"
    ks: Tuple[int, ...] = ()
    retrieval: Tuple[str, ...] = ()


def state_shapes(spec: RankingSpec, num_labels: int) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """``{state name: (shape, dtype)}`` of the sums :func:`chunk_sums` returns for ``spec``."""
    f64 = torch.float64
    shapes: Dict[str, Tuple[Tuple[int, ...], torch.dtype]] = {}
    for name in ("coverage_error", "ranking_loss", "one_error"):
        if name in spec.metrics:
            shapes[f"{name}_sum"] = ((), f64)
            shapes[f"{name}_weight"] = ((), f64)
    if "retrieval" in spec.metrics:
        for name in spec.retrieval:
            shapes[f"retrieval_{name}_sum"] = ((len(spec.ks),), f64)
        shapes["retrieval_weight"] = ((), f64)
        shapes["retrieval_query_weight"] = ((), f64)
    if "lwlrap" in spec.metrics:
        shapes["lwlrap_precision_sum"] = ((num_labels,), f64)
        shapes["lwlrap_label_count"] = ((num_labels,), torch.int64)
    if "lrap" in spec.metrics:
        shapes["lrap_score_sum"] = ((), f64)
        shapes["lrap_weight"] = ((), f64)
    return shapes


def needs_known_count(spec: RankingSpec) -> bool:
    """Whether :func:`chunk_sums` needs each sample's number of labels (the others need only the positives)."""
    return "ranking_loss" in spec.metrics or "lrap" in spec.metrics


def ranks(counts: LabelCounts, ties: str) -> Tuple[Tensor, Tensor]:
    """``(rank, L)``: dense ``(n, C)`` int64 tensors, meaningful where ``counts.positive``."""
    if ties == "max":
        return counts.above + counts.tied, counts.above_positive + counts.tied_positive
    if ties == "index":
        return counts.above + counts.tied_before + 1, counts.above_positive + counts.tied_positive_before + 1
    raise ValueError(f"Argument `ties` must be one of {RANK_TIES} for these metrics, but got {ties!r}.")


def ideal_dcg(max_count: int, device: torch.device) -> Tensor:
    """``(max_count + 1,)`` float64: ``[0, 1, 1 + 1/log2(3), ...]``, the DCG of ``n`` positives ranked first."""
    position = torch.arange(2, max_count + 2, dtype=torch.float64, device=device)
    return torch.cat([torch.zeros(1, dtype=torch.float64, device=device), (1.0 / torch.log2(position)).cumsum(0)])


class PositiveEntries(NamedTuple):
    """The counts of a chunk's positives as flat vectors, for per-sample reductions by index."""

    counts: LabelCounts  #: every field ``(P,)``
    rows: Tensor  #: (P,) int64, sample in the chunk
    cols: Tensor  #: (P,) int64, label
    valid: Optional[Tensor]  #: (P,) bool, the entries that are positives; None when all are
    positive_count: Tensor  #: (n,) int64, positives per sample
    known_count: Optional[Tensor]  #: (n,) int64, labels per sample that are not ignored, when the engine gives them
    num_rows: int
    num_classes: int


def positive_counts_chunks(
    preds: Tensor, target: Tensor, ignore_index: Optional[int] = None
) -> Iterator[Tuple[int, PositiveEntries]]:
    """``(first row, entries)`` for each chunk of rows of a checked ``(N, C)`` batch: one pass of the engine.

    On the numba path the engine's compact counts (one entry per positive, and the known labels per row) are taken
    as they come, a block of rows at a time (at most
    :data:`~torch_lwlrap._engine_config.COMPACT_COUNTS_BLOCK_POSITIVES` positives: the memory stays bounded however
    dense the labels); elsewhere the dense counts of :func:`torch_lwlrap._ranking.label_counts_chunks`, through
    :func:`positive_entries`.
    """
    if not _dispatch.compiled_cpu_pass("counts", preds.device, preds.dtype):
        for first, counts in label_counts_chunks(preds, target, ignore_index):
            yield first, positive_entries(counts)
        return

    # Compact outputs take O(P): chunks as large as the formatting budget allows (few calls, little overhead).
    first = 0
    chunks = formatted_chunks(preds, target, ignore_index, None, forced_chunk_elements(), True)
    for scores, positive, known, _ in chunks:
        known_count, blocks = _numba_counts.label_counts_numba(scores, positive, known)
        num_classes = scores.shape[1]
        for block in blocks:
            num_rows = block.stop - block.start
            rows = block.rows - block.start
            positive_count = torch.bincount(rows, minlength=num_rows)
            yield first + block.start, PositiveEntries(
                block.counts, rows, block.cols, None, positive_count, known_count[block.start : block.stop], num_rows,
                num_classes,
            )
            del block, rows
        first += scores.shape[0]


def positive_entries(counts: LabelCounts) -> PositiveEntries:
    """The positives of a chunk's dense counts as flat vectors.

    On the CPU only the positives are gathered (labels are sparse: the reductions then cost ``O(P)``, not
    ``O(N C)``). Elsewhere every cell is kept and masked: the number of positives is not known on the host without
    a host-device sync.
    """
    positive = counts.positive
    num_rows, num_classes = positive.shape
    device = positive.device
    if device.type in GATHER_DEVICES:
        cells = _true_indices(positive)
        flat = LabelCounts(*(field.reshape(-1).index_select(0, cells) for field in counts))
        valid = None
        positive_count = torch.bincount(cells.div(max(num_classes, 1), rounding_mode="floor"), minlength=num_rows)
    else:
        cells = torch.arange(positive.numel(), device=device)
        flat = LabelCounts(*(field.reshape(-1) for field in counts))
        valid = flat.positive
        positive_count = positive.sum(1, dtype=torch.int64)
    rows = cells.div(max(num_classes, 1), rounding_mode="floor")
    return PositiveEntries(flat, rows, cells - rows * num_classes, valid, positive_count, None, num_rows, num_classes)


def chunk_sums(
    entries: PositiveEntries, known_count: Optional[Tensor], weight: Optional[Tensor], spec: RankingSpec
) -> Dict[str, Tensor]:
    """Weighted per-sample sums of the metrics of ``spec`` over one chunk of samples.

    Args:
        entries: the counts of the chunk's positives (:func:`positive_counts_chunks`).
        known_count: ``(n,)`` labels per sample that are not ignored, or None when none is (``C``); needed only
            when :func:`needs_known_count`.
        weight: ``(n,)`` non-negative sample weights, or None (each sample weighs 1).
        spec: the metrics.

    Returns:
        ``{state name: sum}`` as in :func:`state_shapes`. No host-device sync off the CPU.
    """
    num_samples, num_classes = entries.num_rows, entries.num_classes
    rows, valid, positive_count = entries.rows, entries.valid, entries.positive_count
    device = rows.device
    f64 = torch.float64
    w = None if weight is None else weight.to(f64)

    def total(values: Tensor) -> Tensor:  # (n, ...) -> weighted sum over samples
        if w is None:
            return values.sum(0)
        return (values * w.reshape((-1,) + (1,) * (values.ndim - 1))).sum(0)

    def masked(values: Tensor, fill) -> Tensor:
        if valid is None:
            return values
        return torch.where(valid.view((-1,) + (1,) * (values.ndim - 1)), values, fill)

    def per_sample(values: Tensor, how: str = "sum", init=0) -> Tensor:  # (P, ...) -> (n, ...)
        out = torch.full((num_samples,) + values.shape[1:], init, dtype=values.dtype, device=device)
        if how == "sum":
            return out.index_add_(0, rows, masked(values, 0))
        return out.scatter_reduce_(0, rows, masked(values, init), how)

    weight_sum = torch.full((), num_samples, dtype=f64, device=device) if w is None else w.sum()
    out: Dict[str, Tensor] = {}
    metrics = spec.metrics
    rank_metrics = [name for name in ("coverage_error", "ranking_loss", "one_error", "retrieval") if name in metrics]
    if rank_metrics:
        if spec.ties == "expected":
            values = _expected_values(entries.counts, positive_count, spec, num_classes, masked, per_sample)
        else:
            values = _ordered_values(entries.counts, positive_count, spec, num_classes, masked, per_sample)
    if "coverage_error" in metrics:
        out["coverage_error_sum"] = total(values["worst"])
        out["coverage_error_weight"] = weight_sum
    if "ranking_loss" in metrics:
        known = torch.full_like(positive_count, num_classes) if known_count is None else known_count
        pairs = positive_count * (known - positive_count)
        loss = torch.where(pairs > 0, values["wrong"] / pairs.clamp(min=1).to(f64), 0.0)
        out["ranking_loss_sum"] = total(loss)
        out["ranking_loss_weight"] = weight_sum
    if "one_error" in metrics:
        out["one_error_sum"] = total(1.0 - values["top"])
        out["one_error_weight"] = weight_sum
    if "retrieval" in metrics:
        out.update({f"retrieval_{name}_sum": total(values[name]) for name in spec.retrieval})
        out["retrieval_weight"] = weight_sum
        out["retrieval_query_weight"] = total((positive_count > 0).to(f64))
    if "lwlrap" in metrics or "lrap" in metrics:
        precision = masked(label_precision(entries.counts, spec.ties), 0.0)
        if "lwlrap" in metrics:
            cols = entries.cols
            out["lwlrap_precision_sum"] = torch.zeros(num_classes, dtype=f64, device=device).index_add_(
                0, cols, precision
            )
            ones = torch.ones_like(cols) if valid is None else valid.to(torch.int64)
            out["lwlrap_label_count"] = torch.zeros(num_classes, dtype=torch.int64, device=device).index_add_(
                0, cols, ones
            )
        if "lrap" in metrics:
            known = torch.full_like(positive_count, num_classes) if known_count is None else known_count
            # scikit-learn's convention: a sample with no positive, or only positives, scores 1.
            trivial = (positive_count == 0) | (positive_count == known)
            score = torch.where(trivial, 1.0, per_sample(precision) / positive_count.clamp(min=1).to(f64))
            out["lrap_score_sum"] = total(score)
            out["lrap_weight"] = weight_sum
    return out


def _k_values(ks: Sequence[int], device: torch.device) -> Tensor:
    """``(len(ks),)`` float64 tensor of ``ks``, filled on the device (no copy from host memory: no sync)."""
    out = torch.empty(len(ks), dtype=torch.float64, device=device)
    for i, k in enumerate(ks):
        out[i] = k
    return out


def _reach(k: int, num_classes: int) -> int:
    """The cut-off ``k`` as far as it reaches: no rank exceeds the number of labels, so a table or a loop over
    places never needs more than ``C`` entries, however large ``k`` is (only precision divides by ``k`` itself)."""
    return min(k, max(num_classes, 1))


def _ordered_values(
    counts: LabelCounts, positive_count, spec: RankingSpec, num_classes: int, masked, per_sample
) -> Dict[str, Tensor]:
    """Per-sample values under a rule that gives each positive one rank (``"max"``, ``"index"``): ``"worst"``
    (the largest rank, 0 without positive), ``"wrong"`` (wrong pairs), ``"top"`` (1 if a positive has rank 1) and
    ``(n, len(ks))`` retrieval values by name."""
    f64 = torch.float64
    metrics = spec.metrics
    rank, hits = ranks(counts, spec.ties)
    out = {}
    if "coverage_error" in metrics:
        out["worst"] = per_sample(rank, "amax", 0).to(f64)
    if "ranking_loss" in metrics:
        # rank - L: the negatives ranked at or above the positive ("max") or strictly ahead of it ("index").
        out["wrong"] = per_sample((rank - hits).to(torch.int64)).to(f64)  # int32 ranks: a row can pass 2**31 pairs
    wanted = spec.retrieval if "retrieval" in metrics else ()
    best = None
    if "one_error" in metrics or any(name in wanted for name in ("hit", "rr")):
        # The best rank of a positive; without positive, a rank beyond any k.
        best = per_sample(rank, "amin", torch.iinfo(rank.dtype).max)
        out["top"] = (best == 1).to(f64)
    if not wanted:
        return out
    # Cut-offs compared with ranks stop at C: a sample without positive (best rank int max) stays out of any k.
    ks = _k_values([_reach(k, num_classes) for k in spec.ks], rank.device)  # (K,)
    if best is not None:
        best_f = best.to(f64).unsqueeze(1)
        top = best_f <= ks  # (n, K): the best positive is in the top k
        if "hit" in wanted:
            out["hit"] = top.to(f64)
        if "rr" in wanted:
            out["rr"] = torch.where(top, 1.0 / best_f, 0.0)
    if not any(name in wanted for name in ("precision", "recall", "ap", "ndcg")):
        return out
    rank_f = rank.to(f64)
    in_top = (rank_f.unsqueeze(1) <= ks).to(f64)  # (P, K)
    found = per_sample(in_top)
    if "precision" in wanted:
        out["precision"] = found / _k_values(spec.ks, rank.device)
    if "recall" in wanted:
        out["recall"] = found / positive_count.to(f64).clamp(min=1).unsqueeze(1)
    cutoff = torch.minimum(positive_count.to(f64).unsqueeze(1), ks)  # min(m, k)
    if "ap" in wanted:
        precision = hits.to(f64) / rank_f
        out["ap"] = per_sample(in_top * precision.unsqueeze(1)) / cutoff.clamp(min=1)
    if "ndcg" in wanted:
        # 1 / log2(r + 1) from the table of ideal DCGs: its steps are the discounts of ranks 1, 2, ...
        table = ideal_dcg(_reach(max(spec.ks), num_classes), rank.device)
        discount = torch.diff(table)  # (max k,): discount of rank r at r - 1
        gain = discount.index_select(0, (rank.clamp(min=1, max=len(discount)) - 1).to(torch.int64))
        ideal = table.index_select(0, cutoff.to(torch.int64).reshape(-1)).view_as(cutoff)
        out["ndcg"] = per_sample(in_top * gain.unsqueeze(1)) / ideal.clamp(min=1.0)
    return out


def _expected_values(
    counts: LabelCounts, positive_count, spec: RankingSpec, num_classes: int, masked, per_sample
) -> Dict[str, Tensor]:
    """The values of :func:`_ordered_values`, each the expectation over uniformly random orders of tied labels.

    A positive with ``A`` labels above (``A_p`` positive) in a tie group of ``g`` labels (``p`` positive) takes
    position ``A + Q`` with ``Q`` uniform on ``1..g``; the positives of its group ahead of it are hypergeometric.
    Sums over positives are linear in these expectations; the largest and the best rank of a sample come from its
    lowest and its highest group of positives (the one with ``A_p = 0``), whose order statistics are closed-form.
    """
    f64 = torch.float64
    above = counts.above.to(f64)
    above_positive = counts.above_positive.to(f64)
    tied = counts.tied.to(f64).clamp(min=1)  # >= 1 at a positive; masked cells hold 0
    tied_positive = counts.tied_positive.to(f64)
    out = {
        # the last of p positives among g random places: expected place p (g + 1) / (p + 1)
        "worst": per_sample(above + tied_positive * (tied + 1) / (tied_positive + 1), "amax", 0.0),
        # each tied (positive, negative) pair is wrong in half of the orders
        "wrong": per_sample((above - above_positive) + (counts.tied - counts.tied_positive).to(f64) / 2),
        # rank 1 is a positive with probability p / g when the positives' best group is the top group
        "top": per_sample(torch.where(counts.above == 0, tied_positive / tied, 0.0), "amax", 0.0),
    }
    wanted = spec.retrieval
    if not wanted:
        return out
    best_group = counts.above_positive == 0
    count = positive_count.to(f64).clamp(min=1)
    share = (tied_positive - 1) / (tied - 1).clamp(min=1)  # of the other tied labels, the positive share
    ideal = ideal_dcg(_reach(max(spec.ks), num_classes), above.device)
    values: Dict[str, list] = {name: [] for name in wanted}
    for cut in spec.ks:
        k = _reach(cut, num_classes)  # places beyond C hold no label
        cutoff = positive_count.clamp(max=k)
        found = per_sample(((k - above) / tied).clamp(0.0, 1.0))  # P(place <= k), summed
        if "precision" in wanted:
            values["precision"].append(found / cut)
        if "recall" in wanted:
            values["recall"].append(found / count)
        if "ndcg" in wanted:
            # (1/g) sum over places A+1..A+g up to k of 1 / log2(place + 1), from the cumulative table
            last = (counts.above + counts.tied).clamp(max=k).to(torch.int64)
            first = counts.above.clamp(max=k).to(torch.int64)
            gain = (ideal.index_select(0, last.reshape(-1)) - ideal.index_select(0, first.reshape(-1))) / tied
            values["ndcg"].append(per_sample(gain) / ideal.index_select(0, cutoff).clamp(min=1.0))
        if not any(name in wanted for name in ("hit", "rr", "ap")):
            continue
        no_hit = torch.ones_like(above)  # P(none of the group's p positives in its first k - A places)
        first_at = tied_positive / tied  # P(the group's first positive is at its place y), y = 1
        rr = torch.zeros_like(above)
        ap = torch.zeros_like(above)
        for y in range(1, k + 1):
            inside = (y <= tied) & (above + y <= k)
            step = (tied - tied_positive - (y - 1)).clamp(min=0) / (tied - (y - 1))
            no_hit = torch.where(inside, no_hit * step, no_hit)
            rr = rr + torch.where(inside, first_at / (above + y), 0.0)
            first_at = first_at * (tied - y - tied_positive + 1).clamp(min=0) / (tied - y).clamp(min=1)
            # at place y of its group: A_p + 1 + (y - 1) p' positives at or above it, over A + y labels
            ap = ap + torch.where(inside, (above_positive + 1 + (y - 1) * share) / (above + y), 0.0)
        if "hit" in wanted:
            values["hit"].append(per_sample(masked(torch.where(best_group, 1.0 - no_hit, 0.0), 0.0), "amax", 0.0))
        if "rr" in wanted:
            values["rr"].append(per_sample(masked(torch.where(best_group, rr, 0.0), 0.0), "amax", 0.0))
        if "ap" in wanted:
            values["ap"].append(per_sample(ap / tied) / cutoff.clamp(min=1).to(f64))
    out.update({name: torch.stack(values[name], 1) for name in wanted})
    return out


def finish(spec: RankingSpec, state: Dict[str, Tensor], empty_target: str = "zero") -> Dict[str, Tensor]:
    """Scores from accumulated sums: ``{metric: value}`` (``"name@k"`` for retrieval); NaN where undefined."""
    out: Dict[str, Tensor] = {}
    for name in ("coverage_error", "ranking_loss", "one_error"):
        if name in spec.metrics:
            out[name] = _ratio(state[f"{name}_sum"], state[f"{name}_weight"])
    if "retrieval" in spec.metrics:
        denominator = state["retrieval_query_weight" if empty_target == "skip" else "retrieval_weight"]
        for name in spec.retrieval:
            values = _ratio(state[f"retrieval_{name}_sum"], denominator)
            for i, k in enumerate(spec.ks):
                out[f"{name}@{k}"] = values[i]
    if "lwlrap" in spec.metrics:
        count = state["lwlrap_label_count"].sum()
        out["lwlrap"] = _ratio(state["lwlrap_precision_sum"].sum(), count.to(torch.float64))
    if "lrap" in spec.metrics:
        out["lrap"] = _ratio(state["lrap_score_sum"], state["lrap_weight"])
    return out


def _ratio(value: Tensor, weight: Tensor) -> Tensor:
    # NaN where the weight is 0 (no sample, or no positive for lwlrap); no host-device sync.
    return torch.where(weight > 0, value / torch.where(weight > 0, weight, 1.0), math.nan)


def check_ks(k) -> Tuple[int, ...]:
    """``k`` (an int or a sequence of ints >= 1) as a tuple."""
    ks = (k,) if whole_number(k) is not None else k
    try:
        ks = tuple(whole_number(v) for v in ks)
    except TypeError:
        ks = None
    if not ks or any(v is None or v < 1 for v in ks):
        raise ValueError(f"Argument `k` must be a positive integer or a non-empty sequence of them, but got {k!r}.")
    if any(v >= 2**63 for v in ks):
        raise ValueError(f"Argument `k` must be below 2**63 (an int64), but got {k!r}.")
    if len(set(ks)) != len(ks):
        raise ValueError(f"Argument `k` must not repeat a value, but got {k!r}.")
    return ks


def check_retrieval_metrics(metrics: Sequence[str], name: str = "metrics") -> Tuple[str, ...]:
    return check_names(name, metrics, RETRIEVAL_METRICS)


def check_rank_ties(ties: str) -> str:
    if ties not in RANK_TIES:
        raise ValueError(f"Argument `ties` must be one of {RANK_TIES} for the ranking metrics, but got {ties!r}.")
    return ties
