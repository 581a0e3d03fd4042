"""Naive references written straight from the formulas: plain Python loops over samples and labels.

Independent of the library's engine on purpose: no sorting, no vectorization, exact fractions.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Optional, Sequence

import numpy as np
import torch


def _rows(preds, target, ignore_index):
    preds = np.asarray(preds, dtype=np.float64)
    target = np.asarray(target)
    if preds.ndim > 2:  # (N, C, ...) -> samples
        preds = np.moveaxis(preds, 1, -1).reshape(-1, preds.shape[1])
        target = np.moveaxis(target, 1, -1).reshape(-1, target.shape[1])
    for scores, labels in zip(preds.tolist(), target.tolist()):
        known = [j for j in range(len(labels)) if ignore_index is None or labels[j] != ignore_index]
        positives = [j for j in known if labels[j] == 1]
        yield scores, known, positives


def label_precisions(scores: Sequence[float], known: Sequence[int], positives: Sequence[int], ties: str):
    """{j: Fraction(L_ij, rank_ij)} for each positive j of one sample (for "expected": its mean over tie orders)."""
    out = {}
    positive_set = set(positives)
    for j in positives:
        if ties == "expected":
            out[j] = expected_precision(scores, known, positive_set, j)
            continue
        if ties == "max":
            ahead = [k for k in known if scores[k] >= scores[j]]
        else:  # strict order; among equal scores the lower column ranks first
            ahead = [k for k in known if scores[k] > scores[j] or (scores[k] == scores[j] and k <= j)]
        hits = [k for k in ahead if k in positive_set]
        out[j] = Fraction(len(hits), len(ahead))
    return out


def expected_precision(scores, known, positives, j) -> Fraction:
    """The mean precision of positive ``j`` over the uniformly random orders of its tied labels, from the sum over
    its position ``K`` in the group (the positives ahead of it in the group are hypergeometric)."""
    above = [k for k in known if scores[k] > scores[j]]
    tied = [k for k in known if scores[k] == scores[j]]
    a, a_p, g = len(above), len(positives.intersection(above)), len(tied)
    p = len(positives.intersection(tied))
    share = Fraction(p - 1, g - 1) if g > 1 else Fraction(0)
    return sum(((a_p + 1 + (k - 1) * share) / Fraction(a + k) for k in range(1, g + 1)), Fraction(0)) / g


def _class_sums(preds, target, ties, ignore_index):
    num_classes = np.asarray(preds).shape[1]
    sums = [Fraction(0)] * num_classes
    counts = [0] * num_classes
    for scores, known, positives in _rows(preds, target, ignore_index):
        for j, precision in label_precisions(scores, known, positives, ties).items():
            sums[j] += precision
            counts[j] += 1
    return sums, counts


def naive_lwlrap_per_class(preds, target, ties="max", ignore_index=None):
    """(per_class list of float or nan, weights list, counts list)."""
    sums, counts = _class_sums(preds, target, ties, ignore_index)
    total = sum(counts)
    per_class = [float(s / c) if c else float("nan") for s, c in zip(sums, counts)]
    weights = [c / total if total else 0.0 for c in counts]
    return per_class, weights, counts


def naive_lwlrap(preds, target, ties="max", ignore_index=None, average="weighted"):
    sums, counts = _class_sums(preds, target, ties, ignore_index)
    if average == "none":
        return [float(s / c) if c else float("nan") for s, c in zip(sums, counts)]
    if sum(counts) == 0:
        return float("nan")
    if average == "weighted":
        return float(sum(sums) / sum(counts))
    per_class = [s / c for s, c in zip(sums, counts) if c]
    return float(sum(per_class) / len(per_class))


def naive_lrap(preds, target, ties="max", ignore_index=None, sample_weight: Optional[Sequence[float]] = None):
    scores_per_sample: List[Fraction] = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        if not positives or len(positives) == len(known):
            scores_per_sample.append(Fraction(1))
            continue
        precisions = label_precisions(scores, known, positives, ties)
        scores_per_sample.append(sum(precisions.values()) / len(positives))
    if sample_weight is None:
        weights = [Fraction(1)] * len(scores_per_sample)
    else:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        preds = np.asarray(preds)
        if preds.ndim > 2 and sample_weight.ndim == 1:
            sample_weight = np.broadcast_to(
                sample_weight.reshape((-1,) + (1,) * (preds.ndim - 2)), (preds.shape[0],) + preds.shape[2:]
            )
        weights = [Fraction(float(w)) for w in sample_weight.reshape(-1)]
    total = sum(weights)
    if total == 0:
        return float("nan")
    return float(sum(w * s for w, s in zip(weights, scores_per_sample)) / total)


# Cases and exact per-label sums for the engine paths' tests


def make_case(seed, n, c, *, dtype=torch.float32, levels=4, density=0.3, ignore_index=None, infinite=True):
    """Small integer scores (heavy ties), some +-inf, sparse-ish labels, and ignored labels when asked."""
    g = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, levels, (n, c), generator=g).double()
    if infinite:
        preds[torch.rand(n, c, generator=g) < 0.1] = math.inf
        preds[torch.rand(n, c, generator=g) < 0.1] = -math.inf
    target = (torch.rand(n, c, generator=g) < density).long()
    if ignore_index is not None:
        target[torch.rand(n, c, generator=g) < 0.2] = ignore_index
    return preds.to(dtype), target


def low_bit_cases():
    """(preds, target) pairs of neighbouring float32 / float64 scores and -0.0 beside 0.0, repeated over 6 rows.

    Ranking must compare exactly in the input precision.
    """
    base = torch.tensor([1.0, -1.0, 0.0, 1e-30])
    for dtype in (torch.float32, torch.float64):
        row = torch.stack([torch.nextafter(base.to(dtype), torch.tensor(math.inf, dtype=dtype)), base.to(dtype)])
        preds = torch.cat([row.flatten(), torch.tensor([-0.0, 0.0], dtype=dtype)]).repeat(6, 1)
        target = (torch.rand(preds.shape, generator=torch.Generator().manual_seed(3)) < 0.4).long()
        yield preds, target


#: Sample sums that :func:`special_rows_case` must give, by row and tie rule.
SPECIAL_ROW_SUMS = {
    "max": {0: 6.0, 1: 0.0, 3: 3 * (3 / 6)},
    "index": {0: 6.0, 1: 0.0, 3: 1 / 2 + 2 / 4 + 3 / 5},
}


def special_rows_case():
    """12 x 6 tied scores with rows every path must get right (sample sums in :data:`SPECIAL_ROW_SUMS`).

    Row 0: every label positive (precision 1 each); row 1: no positive (sum 0); row 2: a single positive in the last
    column; row 3: a fully tied row with three positives.
    """
    preds, target = make_case(11, 12, 6)
    target[0] = 1
    target[1] = 0
    target[2] = 0
    target[2, 5] = 1
    preds[3] = 2.0
    target[3] = torch.tensor([0, 1, 0, 1, 1, 0])
    return preds, target


def check_special_row_sums(sample_sums, ties):
    """Assert the per-sample sums of :func:`special_rows_case` equal :data:`SPECIAL_ROW_SUMS`."""
    for row, want in SPECIAL_ROW_SUMS[ties].items():
        got = sample_sums[row].item()
        assert abs(got - want) <= 1e-15, f"row {row}, ties={ties!r}: {got} != {want}"


def exact_sums(preds, target, ties, ignore_index=None):
    """(class sums, sample sums) as float64 tensors, from the naive per-label precisions in exact fractions."""
    scores_rows = preds.double().cpu().tolist()
    label_rows = target.cpu().tolist()
    num_classes = preds.shape[1]
    class_sums = [Fraction(0)] * num_classes
    sample_sums = []
    for scores, labels in zip(scores_rows, label_rows):
        known = [j for j in range(num_classes) if ignore_index is None or labels[j] != ignore_index]
        positives = [j for j in known if labels[j] == 1]
        precisions = label_precisions(scores, known, positives, ties)
        for j, value in precisions.items():
            class_sums[j] += value
        sample_sums.append(sum(precisions.values(), Fraction(0)))
    as_tensor = lambda values: torch.tensor([float(v) for v in values], dtype=torch.float64)  # noqa: E731
    return as_tensor(class_sums), as_tensor(sample_sums)


def run_kernel(kernel, preds, target, ties, ignore_index=None, device="cpu", **tuning):
    """(class sums, sample sums) on the CPU from a compiled path's kernel (``ranking_sums_numba`` or ``_triton``).

    Per-sample outputs start as sentinels (NaN, -1) so that a row the kernel never writes fails; the label counts
    it returns are checked here against plain counting of the targets.
    """
    preds, target = preds.to(device), target.to(device)
    num_samples, num_classes = preds.shape
    positive = target == 1
    known = None if ignore_index is None else target != ignore_index
    class_sum = torch.zeros(num_classes, dtype=torch.float64, device=device)
    class_count = torch.zeros(num_classes, dtype=torch.int64, device=device)
    sample_sum = torch.full((num_samples,), math.nan, dtype=torch.float64, device=device)
    sample_count = torch.full((num_samples,), -1, dtype=torch.int64, device=device)
    known_count = torch.full((num_samples,), -1, dtype=torch.int64, device=device)
    kernel(preds, positive, known, class_sum, class_count, sample_sum, sample_count, known_count, ties=ties, **tuning)
    labels = target.cpu().tolist()
    want_known = [sum(1 for v in row if ignore_index is None or v != ignore_index) for row in labels]
    want_positive = [sum(1 for v in row if v == 1) for row in labels]
    want_class = [sum(1 for row in labels if row[j] == 1) for j in range(num_classes)]
    assert known_count.cpu().tolist() == want_known, "known labels per sample"
    assert sample_count.cpu().tolist() == want_positive, "positive labels per sample"
    assert class_count.cpu().tolist() == want_class, "positive labels per class"
    return class_sum.cpu(), sample_sum.cpu()
