"""Bootstrap intervals and paired comparisons against references written here, for what test_bootstrap.py leaves open.

Each reference takes the library's Poisson weights (``poisson_weights`` of the stream key of ``(seed, rank 0)``, row
``i`` being sample ``i``, as the README documents) and does everything else itself: each row's precisions by plain
loops (``tests.reference.label_precisions``) or scikit-learn's LRAP, each replicate's score as a weighted sum over
rows, then numpy's percentiles and the p-value from its formula. A level other than 0.95 and a seed other than 0 are
used throughout, so that a level or seed that is not passed on shows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score

from tests.reference import label_precisions
from torch_lwlrap import (
    MultilabelLWLRAP,
    compare_lwlrap,
    multilabel_lrap_ci,
    multilabel_lwlrap_ci,
    use_engine,
)
from torch_lwlrap.stats import _bootstrap

NUM_LABELS = 6


def _data(n=120, c=NUM_LABELS, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = (torch.rand(n, c, generator=g) < 0.3).long()
    target[torch.arange(n), torch.randint(0, c, (n,), generator=g)] = 1  # every row has a positive
    preds = target + torch.randn(n, c, generator=g, dtype=torch.float64)  # continuous: no ties
    return preds, target


def _weights(seed, n, num_bootstrap):
    """(B, n) float64: the documented weights of samples 0 .. n-1 of rank 0's stream."""
    key = _bootstrap.stream_key(seed, 0)
    return _bootstrap.poisson_weights(key, torch.arange(n), num_bootstrap).numpy().astype(np.float64)


def _row_sums(preds, target):
    """Per row, per class: the precision of each positive label (0 elsewhere) and the positive indicator."""
    preds_np, target_np = preds.numpy(), target.numpy()
    sums = np.zeros(preds_np.shape)
    counts = np.zeros(preds_np.shape)
    for i, (scores, labels) in enumerate(zip(preds_np.tolist(), target_np.tolist())):
        known = list(range(len(labels)))
        positives = [j for j in known if labels[j] == 1]
        for j, q in label_precisions(scores, known, positives, "max").items():
            sums[i, j] = float(q)
            counts[i, j] = 1
    return sums, counts


def _weighted_sums(weights, rows):
    """(B, C): sum over rows of weights[b, i] * rows[i], by a plain loop over the replicates."""
    return np.stack([(w[:, None] * rows).sum(0) for w in weights])


def _p_value(d):
    """Two-sided bootstrap p-value from its formula, over the replicates that are not NaN."""
    d = d[~np.isnan(d)]
    if d.size == 0:
        return math.nan
    return min(1.0, 2 * (min((d <= 0).sum(), (d >= 0).sum()) + 1) / (d.size + 1))


# ----------------------------------------------------------------------------------------------------------------
# LRAP with sample weights, against scikit-learn


def test_lrap_interval_with_sample_weights_matches_scikit_learn_replicates():
    preds, target = _data(n=80)
    g = torch.Generator().manual_seed(1)
    sample_weight = torch.rand(80, generator=g, dtype=torch.float64) * 2
    sample_weight[::9] = 0  # a few samples left out
    num_bootstrap, seed, level = 200, 5, 0.8
    value, low, high = multilabel_lrap_ci(
        preds, target, sample_weight=sample_weight, num_bootstrap=num_bootstrap, level=level, seed=seed
    )
    y, s, sw = target.numpy(), preds.numpy(), sample_weight.numpy()
    assert value.item() == pytest.approx(label_ranking_average_precision_score(y, s, sample_weight=sw), abs=1e-12)
    weights = _weights(seed, 80, num_bootstrap)
    # a replicate is the weighted LRAP with each sample's weight times the times it is drawn
    replicates = np.array([label_ranking_average_precision_score(y, s, sample_weight=w * sw) for w in weights])
    expected = np.quantile(replicates, [(1 - level) / 2, (1 + level) / 2])
    np.testing.assert_allclose([low.item(), high.item()], expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Paired comparison, against a paired bootstrap written from the formula


def test_compare_interval_p_values_and_per_class_fields_match_a_paired_reference():
    preds_a, target = _data(n=150)
    g = torch.Generator().manual_seed(2)
    preds_b = preds_a + 0.8 * torch.randn(preds_a.shape, generator=g, dtype=torch.float64)
    target[:, 5] = 0
    target[[4, 40, 77], 5] = 1  # a rare class: many replicates draw none of it (NaN there, left out)
    num_bootstrap, seed, level = 300, 7, 0.8
    result = compare_lwlrap(preds_a, preds_b, target, num_bootstrap=num_bootstrap, level=level, seed=seed)

    sums_a, counts = _row_sums(preds_a, target)
    sums_b, _ = _row_sums(preds_b, target)
    weights = _weights(seed, len(counts), num_bootstrap)  # the same weights for both systems: paired
    rep_a, rep_b, rep_count = (_weighted_sums(weights, rows) for rows in (sums_a, sums_b, counts))
    overall = rep_a.sum(1) / rep_count.sum(1) - rep_b.sum(1) / rep_count.sum(1)
    with np.errstate(invalid="ignore"):
        per_class = rep_a / rep_count - rep_b / rep_count

    value_a = sums_a.sum() / counts.sum()
    value_b = sums_b.sum() / counts.sum()
    assert result.difference.item() == pytest.approx(value_a - value_b, abs=1e-12)
    tails = [(1 - level) / 2, (1 + level) / 2]
    np.testing.assert_allclose([result.low.item(), result.high.item()], np.quantile(overall, tails), rtol=0, atol=1e-12)
    assert result.p_value.item() == pytest.approx(_p_value(overall), abs=1e-12)
    np.testing.assert_allclose(
        result.per_class_difference.numpy(), sums_a.sum(0) / counts.sum(0) - sums_b.sum(0) / counts.sum(0),
        rtol=0, atol=1e-12,
    )
    class_bounds = np.nanquantile(per_class, tails, axis=0)
    np.testing.assert_allclose(result.per_class_low.numpy(), class_bounds[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.per_class_high.numpy(), class_bounds[1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        result.per_class_p_value.numpy(), [_p_value(per_class[:, j]) for j in range(NUM_LABELS)], rtol=0, atol=1e-12
    )


# ----------------------------------------------------------------------------------------------------------------
# Seeds


def test_seeds_that_differ_only_above_32_bits_draw_different_replicates():
    # Seeds are taken in [0, 2**63): 3 and 3 + 2**32 (or a timestamp in nanoseconds) are different seeds.
    preds, target = _data(n=100)
    for other in (3 + 2**32, 3 + 2**40, 3 + 2**62):
        first = multilabel_lwlrap_ci(preds, target, num_bootstrap=200, seed=3)
        second = multilabel_lwlrap_ci(preds, target, num_bootstrap=200, seed=other)
        assert (first.low.item(), first.high.item()) != (second.low.item(), second.high.item()), other
        metrics = [MultilabelLWLRAP(NUM_LABELS, num_bootstrap=200, bootstrap_seed=s) for s in (3, other)]
        for metric in metrics:
            metric.update(preds, target)
        assert (metrics[0].bootstrap_samples() != metrics[1].bootstrap_samples()).double().mean() > 0.5, other
    again = multilabel_lwlrap_ci(preds, target, num_bootstrap=200, seed=3)
    assert torch.equal(again.low, first.low) and torch.equal(again.high, first.high)


# ----------------------------------------------------------------------------------------------------------------
# Which samples carry the value


@pytest.mark.parametrize("labelled", [1, 2])
def test_rows_with_only_ignored_labels_are_not_labelled_samples(labelled):
    # One row with positive labels, the others only negatives and ignored labels: as with one row in all, the interval
    # and the p-value are NaN (every replicate that draws the row is its value); a second labelled row gives both.
    g = torch.Generator().manual_seed(4)
    preds = torch.rand(8, 4, generator=g, dtype=torch.float64)
    target = torch.zeros(8, 4, dtype=torch.long)
    target[0, [0, 2]] = 1
    target[1:, 3] = -1
    target[2:5, 1] = -1
    if labelled == 2:
        target[5, 1] = 1
    other = preds.flip(1)
    interval = multilabel_lwlrap_ci(preds, target, ignore_index=-1, num_bootstrap=200, seed=1)
    comparison = compare_lwlrap(preds, other, target, ignore_index=-1, num_bootstrap=200, seed=1)
    fields = (interval.low, interval.high, comparison.low, comparison.high, comparison.p_value)
    assert not torch.isnan(interval.value) and comparison.difference.item() != 0
    if labelled == 1:
        assert all(torch.isnan(field) for field in fields)
    else:
        assert not any(torch.isnan(field) for field in fields)


# ----------------------------------------------------------------------------------------------------------------
# A batch ranked in chunks: each chunk's rows keep their own weights


def test_intervals_of_a_batch_ranked_in_small_chunks_match_the_reference():
    preds, target = _data(n=90)
    num_bootstrap, seed, level = 150, 6, 0.9
    weights = _weights(seed, 90, num_bootstrap)
    sums, counts = _row_sums(preds, target)
    lwlrap_replicates = _weighted_sums(weights, sums).sum(1) / _weighted_sums(weights, counts).sum(1)
    y, s = target.numpy(), preds.numpy()
    lrap_replicates = np.array([label_ranking_average_precision_score(y, s, sample_weight=w) for w in weights])
    tails = [(1 - level) / 2, (1 + level) / 2]
    for chunk_elements in (None, 64, 7):  # 64: about ten rows a chunk; 7: about one
        with use_engine("auto", chunk_elements):
            _, low, high = multilabel_lwlrap_ci(preds, target, num_bootstrap=num_bootstrap, level=level, seed=seed)
            _, lrap_low, lrap_high = multilabel_lrap_ci(
                preds, target, num_bootstrap=num_bootstrap, level=level, seed=seed
            )
        np.testing.assert_allclose(
            [low.item(), high.item()], np.quantile(lwlrap_replicates, tails), rtol=0, atol=1e-12,
            err_msg=f"lwlrap, chunk_elements={chunk_elements}",
        )
        np.testing.assert_allclose(
            [lrap_low.item(), lrap_high.item()], np.quantile(lrap_replicates, tails), rtol=0, atol=1e-12,
            err_msg=f"lrap, chunk_elements={chunk_elements}",
        )


# ----------------------------------------------------------------------------------------------------------------
# Frames of (N, C, T) outputs are the samples


@pytest.mark.parametrize("clips", [1, 3])
def test_lrap_interval_of_frame_outputs_resamples_frames(clips):
    # A (N, C, T) output without sample weights: each frame is a sample (row-major: clip by clip, frame by frame),
    # so a single clip of 40 frames has an interval like 40 rows do.
    frames = 40
    g = torch.Generator().manual_seed(8)
    target = (torch.rand(clips, NUM_LABELS, frames, generator=g) < 0.3).long()
    preds = target + torch.randn(clips, NUM_LABELS, frames, generator=g, dtype=torch.float64)
    num_bootstrap, seed, level = 200, 9, 0.9
    value, low, high = multilabel_lrap_ci(preds, target, num_bootstrap=num_bootstrap, level=level, seed=seed)
    y = target.numpy().transpose(0, 2, 1).reshape(-1, NUM_LABELS)
    s = preds.numpy().transpose(0, 2, 1).reshape(-1, NUM_LABELS)
    assert value.item() == pytest.approx(label_ranking_average_precision_score(y, s), abs=1e-12)
    weights = _weights(seed, len(y), num_bootstrap)
    replicates = np.array([label_ranking_average_precision_score(y, s, sample_weight=w) for w in weights])
    expected = np.quantile(replicates, [(1 - level) / 2, (1 + level) / 2])
    np.testing.assert_allclose([low.item(), high.item()], expected, rtol=0, atol=1e-12)
