"""Poisson bootstrap intervals and paired comparisons, checked against a classic bootstrap written here.

The classic bootstrap resamples rows with replacement and recomputes lwlrap from scratch, from per-label precisions
computed by the naive reference (exact fractions, plain loops): a label's precision depends on its own row only, so a
resampled set's lwlrap is the sum of its rows' precisions over the sum of their label counts.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest
import torch

from tests.reference import label_precisions, naive_lrap, naive_lwlrap
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    compare_lwlrap,
    multilabel_lrap_ci,
    multilabel_lwlrap,
    multilabel_lwlrap_ci,
)
from torch_lwlrap import _bootstrap_kernel, _engine_config
from torch_lwlrap.functional import _intervals as intervals
from torch_lwlrap.stats import _bootstrap

NUM_LABELS = 6


def _data(n=300, c=NUM_LABELS, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    target = (torch.rand(n, c, generator=g) < 0.3).long()
    target[torch.arange(n), torch.randint(0, c, (n,), generator=g)] = 1  # every row has a positive
    noise = torch.randn(n, c, generator=g, dtype=torch.float64)
    preds = target + noise
    if ties:
        preds = (preds * 2).round() / 2
    return preds, target


def _row_stats(preds, target, ignore_index=None):
    """Per row: (precision sum per class (C,), positive count per class (C,), LRAP of the row), naive."""
    preds_np, target_np = preds.numpy(), target.numpy()
    c = preds_np.shape[1]
    sums = np.zeros((len(preds_np), c))
    counts = np.zeros((len(preds_np), c))
    lrap = np.zeros(len(preds_np))
    for i, (scores, labels) in enumerate(zip(preds_np.tolist(), target_np.tolist())):
        known = [j for j in range(c) if ignore_index is None or labels[j] != ignore_index]
        positives = [j for j in known if labels[j] == 1]
        for j, q in label_precisions(scores, known, positives, "max").items():
            sums[i, j] = float(q)
            counts[i, j] = 1
        lrap[i] = 1.0 if len(positives) in (0, len(known)) else sums[i].sum() / len(positives)
    return sums, counts, lrap


def _classic(preds, target, num_bootstrap, seed=0):
    """Classic bootstrap: (B,) weighted lwlrap, (B, C) per class, (B,) LRAP of row-resampled sets."""
    sums, counts, lrap = _row_stats(preds, target)
    rng = np.random.default_rng(seed)
    n = len(sums)
    overall, per_class, lraps = [], [], []
    for _ in range(num_bootstrap):
        rows = rng.integers(0, n, n)
        s, k = sums[rows].sum(0), counts[rows].sum(0)
        overall.append(s.sum() / k.sum())
        with np.errstate(invalid="ignore"):
            per_class.append(s / k)
        lraps.append(lrap[rows].mean())
    return np.array(overall), np.array(per_class), np.array(lraps)


# ----------------------------------------------------------------------------------------------------------------
# Weights


def test_weights_are_poisson_one_and_independent():
    key = _bootstrap.stream_key(123, 0)
    weights = _bootstrap.poisson_weights(key, torch.arange(4000), 250).double()
    frequency = torch.bincount(weights.long().flatten(), minlength=6)[:6].double() / weights.numel()
    pmf = torch.tensor([math.exp(-1) / math.factorial(k) for k in range(6)], dtype=torch.float64)
    # 1e6 draws: a frequency's standard error is at most 5e-4
    assert torch.allclose(frequency, pmf, atol=3e-3), frequency
    assert abs(weights.mean() - 1) < 0.01 and abs(weights.var() - 1) < 0.02
    # neighbouring samples and replicates are uncorrelated (standard error 0.016 and 0.063 here)
    assert abs(np.corrcoef(weights[:, :-1].flatten(), weights[:, 1:].flatten())[0, 1]) < 0.01
    assert abs(np.corrcoef(weights[:-1].flatten(), weights[1:].flatten())[0, 1]) < 0.01


def test_a_weight_depends_on_seed_rank_sample_position_and_replicate_only():
    key = _bootstrap.stream_key(5, 1)
    every = _bootstrap.poisson_weights(key, torch.arange(100), 40)
    some = _bootstrap.poisson_weights(key, torch.tensor([7, 3, 99]), 40)
    assert torch.equal(some, every[:, [7, 3, 99]])
    for other in (_bootstrap.stream_key(6, 1), _bootstrap.stream_key(5, 0)):
        assert (_bootstrap.poisson_weights(other, torch.arange(100), 40) != every).float().mean() > 0.5
    shifted = _bootstrap.poisson_weights(key, torch.arange(100, 200), 40)  # other positions: other weights
    assert (shifted != every).float().mean() > 0.5


@pytest.mark.parametrize("num_bootstrap", [1, 37, 300])
def test_compiled_and_torch_reductions_agree_with_dense_weights(monkeypatch, num_bootstrap):
    g = torch.Generator().manual_seed(1)
    sample = torch.sort(torch.randint(0, 500, (900,), generator=g)).values
    group = torch.randint(0, 11, (900,), generator=g)
    value = torch.rand(900, generator=g, dtype=torch.float64)
    key = _bootstrap.stream_key(9, 0)
    weights = _bootstrap.poisson_weights(key, sample, num_bootstrap)
    expected_sum = torch.zeros(num_bootstrap, 11, dtype=torch.float64).index_add_(1, group, weights * value)
    expected_count = torch.zeros(num_bootstrap, 11, dtype=torch.int64).index_add_(1, group, weights)
    rows = torch.rand(500, 3, generator=g, dtype=torch.float64)
    expected_rows = _bootstrap.poisson_weights(key, torch.arange(40, 540), num_bootstrap).double() @ rows
    monkeypatch.setattr(_engine_config, "BOOTSTRAP_BLOCK_ELEMENTS", 97)  # many blocks of rows and replicates
    paths = [True, False] if _bootstrap_kernel.numba is not None else [False]
    for compiled in paths:
        reason = None if compiled else "switched off by the test"
        monkeypatch.setattr(_bootstrap_kernel, "unavailable_reason", lambda device, dtype=None, r=reason: r)
        total, count = _bootstrap.class_sums(key, sample, group, value, 11, num_bootstrap)
        assert torch.equal(count, expected_count)
        torch.testing.assert_close(total, expected_sum, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            _bootstrap.weighted_sums(key, 40, rows, num_bootstrap), expected_rows, rtol=1e-12, atol=1e-12
        )


def test_percentile_interval_and_p_value_from_their_definitions():
    replicates = torch.tensor([[3.0, float("nan")], [1.0, float("nan")], [2.0, 5.0], [4.0, float("nan")]])
    low, high = _bootstrap.percentile_interval(replicates, 0.5)
    # central half of 1, 2, 3, 4 by linear interpolation: quantiles 0.25 and 0.75
    assert low[0] == 1.75 and high[0] == 3.25 and low[1] == high[1] == 5.0
    d = torch.tensor([-1.0, 0.5, 2.0, 3.0, 0.0, 1.0, 4.0, 2.5, 1.5])
    below, above = int((d <= 0).sum()), int((d >= 0).sum())
    assert _bootstrap.paired_p_value(d).item() == pytest.approx(2 * (min(below, above) + 1) / 10)
    assert _bootstrap.paired_p_value(torch.zeros(50)).item() == 1.0


# ----------------------------------------------------------------------------------------------------------------
# Against the classic bootstrap


def test_poisson_and_classic_bootstrap_distributions_agree():
    preds, target = _data(n=300)
    num_bootstrap = 2000
    overall, per_class, lrap = _classic(preds, target, num_bootstrap)
    metric = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=num_bootstrap, bootstrap_seed=3, average="none")
    lwlrap_overall = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=num_bootstrap, bootstrap_seed=3)
    lrap_metric = MultilabelLRAP(NUM_LABELS, num_bootstrap=num_bootstrap, bootstrap_seed=3)
    for part in range(3):
        rows = slice(part * 100, (part + 1) * 100)
        for m in (metric, lwlrap_overall, lrap_metric):
            m.update(preds[rows], target[rows])
    pairs = [
        (lwlrap_overall.bootstrap_samples().numpy(), overall),
        (lrap_metric.bootstrap_samples().numpy(), lrap),
    ] + [(metric.bootstrap_samples()[:, j].numpy(), per_class[:, j]) for j in range(NUM_LABELS)]
    for poisson, classic in pairs:
        sd = classic.std()
        # Monte Carlo error of a mean of B draws: sd / sqrt(B); of a standard deviation: sd / sqrt(2B)
        assert abs(poisson.mean() - classic.mean()) < 4 * sd * math.sqrt(2 / num_bootstrap)
        assert abs(poisson.std() - sd) < 4 * sd * math.sqrt(2 / (2 * num_bootstrap)) + 0.02 * sd


def test_interval_functions_match_the_metric_and_the_value():
    preds, target = _data(n=200, ties=True)
    for average in ("weighted", "macro", "none"):
        value, low, high = multilabel_lwlrap_ci(preds, target, average=average, num_bootstrap=300, seed=4)
        expected = naive_lwlrap(preds.numpy(), target.numpy(), "max", None, average)
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-12)
        assert bool(((low <= value) & (value <= high)).all())
        # the metric's first update draws the weights the function draws (seed, rank 0, counter 0)
        metric = MultilabelLWLRAP(NUM_LABELS, average=average, num_bootstrap=300, bootstrap_seed=4)
        metric.update(preds, target)
        metric_low, metric_high = metric.confidence_interval()
        assert torch.equal(metric_low, low) and torch.equal(metric_high, high)
    value, low, high = multilabel_lrap_ci(preds, target, num_bootstrap=300, seed=4)
    assert value.item() == pytest.approx(naive_lrap(preds.numpy(), target.numpy(), "max", None), abs=1e-12)
    assert low < value < high


def test_sparse_and_dense_reductions_agree(monkeypatch):
    preds, target = _data(n=150, ties=True)
    target[::7, 2] = -1
    key = _bootstrap.stream_key(1, 0)
    sparse_states = intervals._replicate_states(preds, 64)
    sparse = intervals._lwlrap_bootstrap_update(preds, target, None, "index", -1, True, key, 0, *sparse_states)
    monkeypatch.setattr(intervals, "_sparse_reduction", lambda device: False)
    dense_states = intervals._replicate_states(preds, 64)
    dense = intervals._lwlrap_bootstrap_update(preds, target, None, "index", -1, True, key, 0, *dense_states)
    for a, b in zip(sparse + sparse_states, dense + dense_states):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_coverage_of_the_95_percent_interval():
    """Datasets drawn from a known population: the interval holds the population lwlrap about 95% of the time."""
    g = torch.Generator().manual_seed(11)
    population_size, num_classes = 100_000, 5
    target = (torch.rand(population_size, num_classes, generator=g) < 0.3).long()
    strength = torch.linspace(0.5, 2.0, num_classes)
    preds = target * strength + torch.randn(population_size, num_classes, generator=g)
    truth = multilabel_lwlrap(preds, target).item()
    covered = 0
    num_datasets = 300
    for i in range(num_datasets):
        rows = torch.randint(0, population_size, (300,), generator=g)
        _, low, high = multilabel_lwlrap_ci(preds[rows], target[rows], num_bootstrap=400, seed=i)
        covered += bool(low <= truth <= high)
    assert 0.92 <= covered / num_datasets <= 0.98, covered / num_datasets


# ----------------------------------------------------------------------------------------------------------------
# Paired comparison


def test_identical_systems_differ_by_exactly_zero():
    preds, target = _data(n=200, ties=True)
    result = compare_lwlrap(preds, preds.clone(), target, num_bootstrap=300, seed=0)
    assert result.difference.item() == 0 and result.low.item() == 0 and result.high.item() == 0
    assert result.p_value.item() == 1.0
    assert torch.equal(result.per_class_difference, torch.zeros(NUM_LABELS, dtype=torch.float64))
    assert torch.equal(result.per_class_low, result.per_class_high)


def test_a_strictly_better_copy_wins_and_swapping_negates():
    preds, target = _data(n=200)
    better = preds + 0.5 * target  # every positive's score raised
    result = compare_lwlrap(better, preds, target, num_bootstrap=500, seed=1)
    assert result.value_a.item() == pytest.approx(naive_lwlrap(better.numpy(), target.numpy(), "max"), abs=1e-12)
    assert result.value_b.item() == pytest.approx(naive_lwlrap(preds.numpy(), target.numpy(), "max"), abs=1e-12)
    assert result.difference > 0 and result.low > 0 and result.p_value < 0.05
    assert (result.per_class_difference >= 0).all()
    swapped = compare_lwlrap(preds, better, target, num_bootstrap=500, seed=1)
    assert swapped.difference.item() == -result.difference.item()
    assert swapped.low.item() == pytest.approx(-result.high.item(), abs=1e-12)
    assert swapped.high.item() == pytest.approx(-result.low.item(), abs=1e-12)
    assert swapped.p_value.item() == result.p_value.item()
    torch.testing.assert_close(swapped.per_class_difference, -result.per_class_difference)


def test_paired_interval_is_narrower_than_either_systems_interval():
    preds, target = _data(n=300)
    g = torch.Generator().manual_seed(3)
    other = preds + 0.3 * torch.randn(preds.shape, generator=g, dtype=torch.float64)
    result = compare_lwlrap(preds, other, target, num_bootstrap=500, seed=2)
    _, low, high = multilabel_lwlrap_ci(preds, target, num_bootstrap=500, seed=2)
    assert result.high - result.low < high - low


def _naive_replicates(preds, target, num_bootstrap, seed):
    """Replicates of per-class sums and counts from the library's weights, summed by a plain loop over samples (the
    weights are the library's; every sum and average here is the reference's own)."""
    sums, counts, _ = _row_stats(preds, target)
    weights = _bootstrap.poisson_weights(_bootstrap.stream_key(seed, 0), torch.arange(len(sums)), num_bootstrap)
    weights = weights.numpy().astype(np.float64)
    rep_sums = np.zeros((num_bootstrap, sums.shape[1]))
    rep_counts = np.zeros((num_bootstrap, sums.shape[1]))
    for b in range(num_bootstrap):
        for i in range(len(sums)):
            rep_sums[b] += weights[b, i] * sums[i]
            rep_counts[b] += weights[b, i] * counts[i]
    return sums.sum(0), counts.sum(0), rep_sums, rep_counts


def _rare_classes(n=400, common=4, rare=24, seed=0):
    """Common classes scored well and classes with a single positive scored badly: the case where a replicate that
    leaves out the classes it drew no positive of drifts away from the value."""
    g = torch.Generator().manual_seed(seed)
    target = torch.zeros(n, common + rare, dtype=torch.long)
    target[:, :common] = (torch.rand(n, common, generator=g) < 0.3).long()
    for k in range(rare):
        target[7 * k, common + k] = 1
    preds = torch.randn(n, common + rare, generator=g, dtype=torch.float64)
    preds[:, :common] += 3 * target[:, :common]
    return preds, target


def test_macro_replicates_average_every_class_of_the_whole_set():
    preds, target = _rare_classes()
    whole_sum, whole_count, rep_sums, rep_counts = _naive_replicates(preds, target, 200, seed=3)
    whole = whole_sum / whole_count
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(rep_counts > 0, rep_sums / rep_counts, whole)  # an undrawn class keeps its score
    expected = np.quantile(per_class.mean(1), [0.025, 0.975])
    value, low, high = multilabel_lwlrap_ci(preds, target, average="macro", num_bootstrap=200, seed=3)
    assert value.item() == pytest.approx(naive_lwlrap(preds.numpy(), target.numpy(), "max", None, "macro"), abs=1e-12)
    np.testing.assert_allclose([low.item(), high.item()], expected, rtol=0, atol=1e-12)
    assert low < value < high  # averaging only the drawn classes put every replicate above the value here
    metric = MultilabelLWLRAP(target.shape[1], average="macro", num_bootstrap=200, bootstrap_seed=3)
    for p, t in zip(preds.split(70), target.split(70)):
        metric.update(p, t)
    assert all(torch.equal(a, b) for a, b in zip(metric.confidence_interval(), (low, high)))


def test_a_class_with_one_positive_label_has_no_interval_or_p_value():
    preds, target = _data(n=200)
    target[:, 5] = 0
    target[17, 5] = 1  # one positive: every replicate that draws it gives the same per-class value
    target[:, 4] = 0
    target[[3, 90], 4] = 1  # two: an interval
    preds[17, 5] = 9.0  # ranked first by one system, last by the other
    other = preds.clone()
    other[17, 5] = -9.0
    result = compare_lwlrap(preds, other, target, num_bootstrap=300, seed=0)
    assert result.per_class_difference[5] > 0  # the value is still reported
    for field in (result.per_class_low, result.per_class_high, result.per_class_p_value):
        assert torch.isnan(field[5]) and not torch.isnan(field[:5]).any()
    _, low, high = multilabel_lwlrap_ci(preds, target, average="none", num_bootstrap=300, seed=0)
    assert torch.isnan(low[5]) and torch.isnan(high[5]) and not torch.isnan(low[:5]).any()
    assert low[4] < high[4]
    metric = MultilabelLWLRAP(NUM_LABELS, average="none", num_bootstrap=300, bootstrap_seed=0)
    for p, t in zip(preds.split(64), target.split(64)):
        metric.update(p, t)
    metric_low, metric_high = metric.confidence_interval()
    torch.testing.assert_close(metric_low, low, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(metric_high, high, equal_nan=True, rtol=0, atol=0)
    assert not torch.isnan(metric.bootstrap_samples()[:, 5]).all()  # the replicates themselves are kept
    # the overall interval still holds every positive label
    assert not torch.isnan(result.low) and not torch.isnan(multilabel_lwlrap_ci(preds, target, seed=0).low)


@pytest.mark.parametrize("rows", [1, 2])
def test_an_overall_interval_needs_two_samples_with_a_positive_label(rows):
    # One clip with labels (a public-leaderboard subset of one row, say): every replicate that draws it is its value,
    # an interval of width 0 and p = 0.003 for any difference. Rows without a positive label do not count.
    g = torch.Generator().manual_seed(3)
    preds = torch.rand(6, 4, generator=g)
    target = torch.zeros(6, 4, dtype=torch.long)
    target[0, [0, 2]] = 1  # two positive labels, one row
    if rows == 2:
        target[3, 1] = 1
    other = preds.flip(1)
    interval = multilabel_lwlrap_ci(preds, target, num_bootstrap=200, seed=0)
    comparison = compare_lwlrap(preds, other, target, num_bootstrap=200, seed=0)
    lrap = multilabel_lrap_ci(preds[:rows], target[:rows], num_bootstrap=200, seed=0)
    assert interval.value.item() == pytest.approx(naive_lwlrap(preds.double(), target), rel=1e-12)
    assert comparison.difference.item() != 0
    fields = (interval.low, interval.high, comparison.low, comparison.high, comparison.p_value, lrap.low, lrap.high)
    if rows == 1:
        assert all(torch.isnan(field) for field in fields)
    else:
        assert not any(torch.isnan(field) for field in fields)
        assert interval.low < interval.high and comparison.low < comparison.high
    # the same rule for frames of (N, C, T) outputs: samples are frames
    frames = multilabel_lwlrap_ci(preds.T.reshape(1, 4, 6), target.T.reshape(1, 4, 6), num_bootstrap=200, seed=0)
    assert torch.isnan(frames.low) == (rows == 1)
    weighted = multilabel_lrap_ci(preds, target, sample_weight=torch.eye(6)[0], num_bootstrap=200, seed=0)
    assert torch.isnan(weighted.low)  # one sample of non-zero weight


def test_a_drawn_seed_leaves_torch_random_numbers_alone_and_repeats_after_seeding():
    preds, target = _data(n=100)
    torch.manual_seed(0)
    plain = torch.rand(4)
    torch.manual_seed(0)
    metric = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50)  # the seed derived, not drawn from the stream
    interval = multilabel_lwlrap_ci(preds, target, num_bootstrap=50)
    assert torch.equal(torch.rand(4), plain)  # a model built after them initializes as without them
    torch.manual_seed(0)
    assert MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50).bootstrap_seed == metric.bootstrap_seed
    assert all(torch.equal(a, b) for a, b in zip(multilabel_lwlrap_ci(preds, target, num_bootstrap=50), interval))
    torch.manual_seed(1)
    assert MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50).bootstrap_seed != metric.bootstrap_seed
    with torch.device("meta"):  # a model built on the meta device: the seed still comes from the CPU generator
        assert MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50).bootstrap_seed >= 0


def test_compare_names_the_system_whose_scores_are_bad():
    preds, target = _data(n=30)
    with pytest.raises(TypeError, match=r"`preds_b` must be a floating point.*`preds_b.float\(\)`"):
        compare_lwlrap(preds, preds.long(), target)
    with pytest.raises(TypeError, match=r"`preds_a` must be a torch.Tensor"):
        compare_lwlrap(preds.tolist(), preds, target)
    with pytest.raises(ValueError, match=r"`preds_b` contains NaN \(first at index \(3, 2\)\)"):
        compare_lwlrap(preds, preds.index_put((torch.tensor(3), torch.tensor(2)), torch.tensor(math.nan,
                                                                                     dtype=preds.dtype)), target)
    with pytest.raises(ValueError, match=r"Expected 4 labels \(`num_labels`\) in dimension 1 of `preds_a`"):
        compare_lwlrap(preds, preds, target, num_labels=4)


def test_the_interval_function_checks_its_batch_first():
    with pytest.raises(ValueError, match=r"`preds` must have at least 2 dimensions.*\(4,\)"):
        multilabel_lwlrap_ci(torch.randn(4), torch.ones(4))
    with pytest.raises(TypeError, match=r"`preds` must be a torch.Tensor, but got list"):
        multilabel_lwlrap_ci([[0.1, 0.2]], torch.ones(1, 2))


def test_level_takes_any_real_number_and_the_seed_is_checked_without_replicates():
    preds, target = _data(n=100)
    assert torch.equal(multilabel_lwlrap_ci(preds, target, level=np.float32(0.9), seed=0).low,
                       multilabel_lwlrap_ci(preds, target, level=float(np.float32(0.9)), seed=0).low)
    with pytest.raises(ValueError, match=r"`level`.*pass float\(level\)"):
        multilabel_lwlrap_ci(preds, target, level=torch.tensor(0.9), seed=0)
    for bad in (-3, "abc", 2**63):
        with pytest.raises(ValueError, match="`bootstrap_seed`"):
            MultilabelLWLRAP(NUM_LABELS, bootstrap_seed=bad)
        with pytest.raises(ValueError, match="`bootstrap_seed`"):
            MultilabelLRAP(NUM_LABELS, bootstrap_seed=bad)
    assert MultilabelLWLRAP(NUM_LABELS, bootstrap_seed=5).bootstrap_seed == 5


# ----------------------------------------------------------------------------------------------------------------
# Reproducibility, forward, checkpoints


def _batches(num=4, n=60, seed=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        target = (torch.rand(n, NUM_LABELS, generator=g) < 0.3).long()
        target[:, 0] = 1
        preds = target + torch.randn(n, NUM_LABELS, generator=g)
        out.append((preds, target, torch.rand(n, generator=g) * 2))
    return out


METRICS = {
    "lwlrap": lambda **kw: MultilabelLWLRAP(NUM_LABELS, **kw),
    "lwlrap-none": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="none", **kw),
    "lwlrap-macro": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="macro", **kw),
    "lrap": lambda **kw: MultilabelLRAP(NUM_LABELS, **kw),
}


def _feed(metric, batches, forward=False):
    for preds, target, weight in batches:
        call = metric if forward else metric.update
        if isinstance(metric, MultilabelLRAP):
            call(preds, target, sample_weight=weight)
        else:
            call(preds, target)


@pytest.mark.parametrize("name", list(METRICS))
def test_same_seed_and_batches_give_identical_replicates(name):
    batches = _batches()
    runs = []
    for seed, forward in ((7, False), (7, True), (8, False)):
        metric = METRICS[name](num_bootstrap=200, bootstrap_seed=seed)
        _feed(metric, batches, forward)
        runs.append(metric.bootstrap_samples())
    assert torch.equal(runs[0], runs[1])  # forward draws what update draws
    assert not torch.equal(runs[0], runs[2])
    # plain values unchanged by the bootstrap (up to float64 rounding: sums added in another order)
    plain = METRICS[name]()
    _feed(plain, batches)
    torch.testing.assert_close(metric.compute(), plain.compute(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(METRICS))
def test_checkpoint_mid_epoch_resumes_identically(name, tmp_path):
    batches = _batches()
    uninterrupted = METRICS[name](num_bootstrap=100, bootstrap_seed=3)
    _feed(uninterrupted, batches)
    model = torch.nn.ModuleDict({"metric": METRICS[name](num_bootstrap=100, bootstrap_seed=3)})
    model["metric"].persistent(True)
    _feed(model["metric"], batches[:2])
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    resumed = torch.nn.ModuleDict({"metric": METRICS[name](num_bootstrap=100, bootstrap_seed=3)})
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    _feed(resumed["metric"], batches[2:])
    for state, value in uninterrupted.metric_state.items():
        assert torch.equal(resumed["metric"].metric_state[state], value), state
    assert all(torch.equal(a, b) for a, b in zip(resumed["metric"].confidence_interval(), uninterrupted.confidence_interval()))


def test_reset_and_float64_states():
    metric = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50, bootstrap_seed=1)
    _feed(metric, _batches(2))
    first = metric.bootstrap_samples()
    metric.reset()
    assert metric.bootstrap_label_count.sum() == 0 and metric.bootstrap_lwlrap_samples == 0
    _feed(metric, _batches(2))
    assert torch.equal(metric.bootstrap_samples(), first)  # after reset the stream starts again
    metric.to(torch.float32)
    assert metric.bootstrap_precision_sum.dtype == torch.float64


# ----------------------------------------------------------------------------------------------------------------
# Bad input


def test_more_replicates_than_the_quantile_takes_are_refused_up_front():
    # torch.nanquantile reads at most 2**24 values along a dimension: 2**24 + 1 replicates passed every check and
    # then failed inside torch with "quantile() input tensor is too large", after the whole bootstrap.
    preds, target = _data(n=20)
    too_many = 2**24 + 1
    for call in (lambda: multilabel_lwlrap_ci(preds, target, num_bootstrap=too_many, seed=0),
                 lambda: multilabel_lrap_ci(preds, target, num_bootstrap=too_many, seed=0),
                 lambda: compare_lwlrap(preds, preds, target, num_bootstrap=too_many, seed=0),
                 lambda: MultilabelLWLRAP(NUM_LABELS, num_bootstrap=too_many),
                 lambda: MultilabelLRAP(NUM_LABELS, num_bootstrap=too_many)):
        with pytest.raises(ValueError, match=r"`num_bootstrap` takes at most 2\*\*24 \(16777216\).*got 16777217"):
            call()
    # the limit itself is a bound the quantile takes (the replicates' own count is what torch checks)
    _bootstrap.check_num_bootstrap(2**24)
    low, high = _bootstrap.percentile_interval(torch.zeros(2**24, 1), 0.95)
    assert low.item() == high.item() == 0.0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_bad_num_bootstrap(bad):
    with pytest.raises(ValueError, match=r"`num_bootstrap` must be a non-negative integer.*" + str(bad)[:2]):
        MultilabelLWLRAP(NUM_LABELS, num_bootstrap=bad)
    with pytest.raises(ValueError, match="`num_bootstrap`"):
        MultilabelLRAP(NUM_LABELS, num_bootstrap=bad)
    preds, target = _data(n=20)
    with pytest.raises(ValueError, match="`num_bootstrap`"):
        multilabel_lwlrap_ci(preds, target, num_bootstrap=bad)
    with pytest.raises(ValueError, match="`num_bootstrap` must be positive"):
        compare_lwlrap(preds, preds, target, num_bootstrap=0)


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, 95, float("nan")])
def test_bad_level(level):
    metric = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=20, bootstrap_seed=0)
    _feed(metric, _batches(1))
    before = {k: v.clone() for k, v in metric.metric_state.items()}
    with pytest.raises(ValueError, match=r"`level` must be a number strictly between 0 and 1"):
        metric.confidence_interval(level)
    preds, target = _data(n=20)
    with pytest.raises(ValueError, match="`level`"):
        multilabel_lwlrap_ci(preds, target, level=level)
    assert all(torch.equal(before[k], v) for k, v in metric.metric_state.items())


def test_bad_batch_leaves_the_replicates_and_counter_untouched():
    for name, make in METRICS.items():
        metric = make(num_bootstrap=30, bootstrap_seed=0)
        _feed(metric, _batches(1))
        before = {k: v.clone() for k, v in metric.metric_state.items()}
        preds, target, _ = _batches(1)[0]
        for bad_preds, bad_target in (
            (preds[:, :3], target[:, :3]),  # wrong number of labels
            (preds.masked_fill(preds > 1, float("nan")), target),  # NaN scores
            (preds, target * 2),  # a label that is not 0/1
        ):
            with pytest.raises(ValueError):
                metric.update(bad_preds, bad_target)
            with pytest.raises(ValueError):
                metric(bad_preds, bad_target)
        assert all(torch.equal(before[k], v) for k, v in metric.metric_state.items()), name


def test_compare_rejects_systems_of_different_shapes():
    preds, target = _data(n=30)
    with pytest.raises(ValueError, match=r"`preds_a` and `preds_b` must score the same.*\(30, 6\) and \(29, 6\)"):
        compare_lwlrap(preds, preds[:-1], target)


def test_interval_without_replicates_says_how_to_get_one():
    metric = MultilabelLWLRAP(NUM_LABELS)
    with pytest.raises(ValueError, match=r"num_bootstrap=0.*num_bootstrap=1000"):
        metric.confidence_interval()


# ----------------------------------------------------------------------------------------------------------------
# No host-device sync, bounded workspace (on the meta device: no values, the code that runs on a GPU)


@pytest.mark.parametrize("name", list(METRICS))
def test_update_reads_nothing_on_the_host(name):
    from tests.test_sync import HostReads

    metric = METRICS[name](num_bootstrap=64, bootstrap_seed=0, validate_args=False).to("meta")
    preds, target, weight = (t.to("meta") for t in _batches(1)[0])
    with HostReads() as mode:
        _feed(metric, [(preds, target, weight)])
    assert mode.reads == []
    assert all(state.device.type == "meta" for state in metric.metric_state.values())


@pytest.mark.parametrize("name", ["lwlrap", "lrap"])
def test_temporaries_stay_bounded_whatever_the_batch_and_replicates(name):
    from benchmarks.bootstrap import meta_peak

    # Beyond what the plain update takes on the same path (the engine's chunks), the replicates add at most 64 MiB,
    # whatever the rows and the replicates: ten times either takes the same workspace.
    plain = {c: meta_peak(20000, c, 0, kind=name) for c in (527, 10000)}
    peaks = {case: meta_peak(*case, kind=name) for case in [(20000, 527, 1000), (200000, 527, 1000),
                                                            (20000, 527, 10000), (20000, 10000, 1000)]}
    for (n, c, b), peak in peaks.items():
        assert peak - plain[c] <= 64 * 2**20, (n, c, b, peak, plain[c])
    assert abs(peaks[200000, 527, 1000] - peaks[20000, 527, 1000]) <= 8 * 2**20
    assert abs(peaks[20000, 527, 10000] - peaks[20000, 527, 1000]) <= 16 * 2**20


# ----------------------------------------------------------------------------------------------------------------
# DDP: two gloo processes

WORLD = 2
DDP_SHARDS = {"split": {0: [0, 1], 1: [2, 3]}, "rank 1 idle": {0: [0, 1, 2, 3], 1: []}}


def _ddp_worker(rank, init_file, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    batches = _batches(4, n=80)
    results = {}
    for scenario, shards in DDP_SHARDS.items():
        for name in ("lwlrap", "lwlrap-none", "lrap"):
            metric = METRICS[name](num_bootstrap=1000, bootstrap_seed=21)
            _feed(metric, [batches[i] for i in shards[rank]])
            local = {k: v.clone() for k, v in metric.metric_state.items()}
            samples = metric.bootstrap_samples()
            low, high = metric.confidence_interval()
            after = {k: v.clone() for k, v in metric.metric_state.items()}
            results[scenario, name] = dict(local=local, after=after, samples=samples, low=low, high=high)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    out_dir = tmp_path_factory.mktemp("bootstrap_ddp")
    context = mp.start_processes(
        _ddp_worker, args=(str(out_dir / "init"), str(out_dir)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 180
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 180 s")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def _replicates_of(name, states):
    if name == "lrap":
        return intervals._lrap_replicates(states["bootstrap_lrap_sum"], states["bootstrap_weight_sum"])
    average = "none" if name == "lwlrap-none" else "weighted"
    return intervals._lwlrap_replicates(
        states["bootstrap_precision_sum"], states["bootstrap_label_count"], average, states["precision_sum"],
        states["label_count"],
    )


@pytest.mark.parametrize("name", ["lwlrap", "lwlrap-none", "lrap"])
def test_ddp_replicate_states_are_summed(ddp_results, name):
    for scenario in DDP_SHARDS:
        local = [ddp_results[r][scenario, name]["local"] for r in range(WORLD)]
        summed = {k: local[0][k] + local[1][k] for k in local[0] if k != "options_tag" and "updates" not in k}
        expected = _replicates_of(name, summed)
        for r in range(WORLD):
            got = ddp_results[r][scenario, name]
            torch.testing.assert_close(got["samples"], expected, rtol=1e-12, atol=1e-12, equal_nan=True)
            # the local state is back after the interval (torchmetrics' unsync)
            assert all(torch.equal(got["after"][k], v) for k, v in local[r].items())


@pytest.mark.parametrize("name", ["lwlrap", "lwlrap-none", "lrap"])
def test_ddp_idle_rank_changes_nothing_and_ranks_draw_independently(ddp_results, name):
    batches = _batches(4, n=80)
    single = METRICS[name](num_bootstrap=1000, bootstrap_seed=21)
    _feed(single, batches)
    idle = ddp_results[0]["rank 1 idle", name]
    assert torch.equal(idle["samples"], single.bootstrap_samples())
    idle_local = ddp_results[1]["rank 1 idle", name]["local"]
    assert all(v.abs().sum() == 0 for k, v in idle_local.items() if k != "options_tag")  # the tag is a constant
    # rank 1's weights for batches 2 and 3 are not rank 0's
    rank0_alone = METRICS[name](num_bootstrap=1000, bootstrap_seed=21)
    _feed(rank0_alone, batches[2:])
    split_rank1 = ddp_results[1]["split", name]["local"]
    key = "bootstrap_lrap_sum" if name == "lrap" else "bootstrap_precision_sum"
    assert not torch.equal(split_rank1[key], rank0_alone.metric_state[key])
    # the split run's interval is a valid one: within Monte Carlo error of the single process's
    split = ddp_results[0]["split", name]
    width = single.confidence_interval()[1] - single.confidence_interval()[0]
    for bound, expected in zip((split["low"], split["high"]), single.confidence_interval()):
        assert bool(((bound - expected).abs() < 0.25 * width).all())


# ----------------------------------------------------------------------------------------------------------------
# The user's own form: Lightning's validation_step on logits that carry gradients


@pytest.mark.filterwarnings("ignore")
def test_lightning_validation_step_logs_the_interval():
    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    features = torch.randn(96, 8, generator=g)
    target = (torch.rand(96, NUM_LABELS, generator=g) < 0.3).long()
    target[:, 1] = 1

    class Tagger(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, NUM_LABELS)
            self.val_lwlrap = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=200, bootstrap_seed=1)
            self.seen = []

        def validation_step(self, batch, batch_idx):
            x, y = batch
            with torch.enable_grad():
                logits = self.net(x)
            assert logits.requires_grad
            self.val_lwlrap.update(logits, y)
            self.seen.append((logits.detach().clone(), y))

        def on_validation_epoch_end(self):
            low, high = self.val_lwlrap.confidence_interval()
            self.log("val_lwlrap", self.val_lwlrap.compute())
            self.log("val_lwlrap_low", low)
            self.log("val_lwlrap_high", high)
            self.val_lwlrap.reset()

    model = Tagger()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, inference_mode=False,  # logits that carry gradients, as in a training loop
    )
    (logged,) = trainer.validate(model, DataLoader(TensorDataset(features, target), batch_size=32), verbose=False)
    reference = MultilabelLWLRAP(NUM_LABELS, num_bootstrap=200, bootstrap_seed=1)
    for logits, y in model.seen:
        reference.update(logits, y)
    low, high = reference.confidence_interval()
    preds = torch.cat([s[0] for s in model.seen]).double().numpy()
    labels = torch.cat([s[1] for s in model.seen]).numpy()
    assert logged["val_lwlrap"] == pytest.approx(naive_lwlrap(preds, labels, "max"), abs=1e-6)
    assert logged["val_lwlrap_low"] == pytest.approx(low.item(), abs=1e-6)
    assert logged["val_lwlrap_high"] == pytest.approx(high.item(), abs=1e-6)
    assert logged["val_lwlrap_low"] < logged["val_lwlrap"] < logged["val_lwlrap_high"]


# ----------------------------------------------------------------------------------------------------------------
# Command line: files as the challenge writes them, read back independently with pandas

pd = pytest.importorskip("pandas")
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "data")
TRUTH, SUB_A, SUB_B = (os.path.join(DATA, n) for n in ("sample_truth.csv", "sample_submission_b.csv", "sample_submission.csv"))


def _read_with_pandas(pred_path, row_order=None):
    """(fnames, classes, scores, target) of a submission and the truth, aligned by pandas; rows in ``row_order``,
    else sorted by fname, as the command line resamples them."""
    pred = pd.read_csv(pred_path)
    truth = pd.read_csv(TRUTH)
    pred = pred.set_index("fname").loc[sorted(pred["fname"]) if row_order is None else row_order].reset_index()
    classes = list(pred.columns[1:])
    labels = dict(zip(truth["fname"], truth["labels"].str.split(",")))
    target = np.array([[int(c in labels[f]) for c in classes] for f in pred["fname"]])
    return list(pred["fname"]), classes, pred[classes].to_numpy(np.float64), target


def _cli(capsys, *args):
    from torch_lwlrap.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_compare_json_matches_the_functions(capsys):
    import json

    code, out, err = _cli(capsys, "compare", TRUTH, SUB_A, SUB_B, "--json", "--bootstrap", "300", "--seed", "4")
    assert (code, err) == (0, "")
    result = json.loads(out)
    fnames, classes, scores_a, target = _read_with_pandas(SUB_A)
    _, classes_b, scores_b, _ = _read_with_pandas(SUB_B, row_order=fnames)
    assert classes_b == classes
    assert result["lwlrap_a"] == pytest.approx(naive_lwlrap(scores_a, target, "max"), abs=1e-12)
    assert result["lwlrap_b"] == pytest.approx(naive_lwlrap(scores_b, target, "max"), abs=1e-12)
    expected = compare_lwlrap(torch.from_numpy(scores_a), torch.from_numpy(scores_b), torch.from_numpy(target),
                              num_bootstrap=300, seed=4)
    assert result["difference"] == pytest.approx(float(expected.difference), abs=1e-12)
    assert result["interval"] == pytest.approx([float(expected.low), float(expected.high)], abs=1e-12)
    assert result["p_value"] == pytest.approx(float(expected.p_value), abs=1e-12)
    per_class = naive_lwlrap(scores_a, target, "max", None, "none")
    for j, name in enumerate(classes):
        assert result["per_class"][name]["lwlrap_a"] == pytest.approx(per_class[j], abs=1e-12)


def test_cli_compare_text_plot_and_identical_systems(capsys, tmp_path):
    code, out, err = _cli(capsys, "compare", TRUTH, SUB_A, SUB_A, "--bootstrap", "200")
    assert (code, err) == (0, "")
    assert "A - B        +0.000000  95% interval [+0.000000, +0.000000]  p = 1.0000" in out
    code, out, _ = _cli(capsys, "compare", TRUTH, SUB_A, SUB_B, "--per-class", "--plot", tmp_path / "d.png")
    assert code == 0 and "classes where A better most:" in out and "classes where B better most:" in out
    assert (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--bootstrap", "0"], ["--bootstrap", "0"]),
        (["--level", "1.5"], ["--level", "1.5"]),
    ],
)
def test_cli_compare_bad_arguments(capsys, args, words):
    code, out, err = _cli(capsys, "compare", TRUTH, SUB_A, SUB_B, *args)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert all(word in err for word in words)


def test_cli_compare_rejects_a_submission_with_other_rows(capsys, tmp_path):
    short = tmp_path / "short.csv"
    with open(SUB_B) as handle:
        lines = handle.read().splitlines()
    short.write_text("\n".join(lines[:-1]) + "\n")
    code, out, err = _cli(capsys, "compare", TRUTH, SUB_A, short)
    assert code == 2 and out == "" and "missing from" in err and str(short) in err


def test_cli_score_ci_matches_the_function(capsys):
    import json

    code, out, err = _cli(capsys, "score", TRUTH, SUB_B, "--ci", "300", "--seed", "2", "--json")
    assert (code, err) == (0, "")
    ci = json.loads(out)["ci"]
    _, classes, scores, target = _read_with_pandas(SUB_B)
    value, low, high = multilabel_lwlrap_ci(torch.from_numpy(scores), torch.from_numpy(target), num_bootstrap=300, seed=2)
    assert ci["lwlrap"] == pytest.approx([float(low), float(high)], abs=1e-12)
    assert (ci["num_bootstrap"], ci["seed"], ci["level"]) == (300, 2, 0.95)
    _, class_low, _ = multilabel_lwlrap_ci(
        torch.from_numpy(scores), torch.from_numpy(target), average="none", num_bootstrap=300, seed=2
    )
    assert ci["per_class"][classes[3]][0] == pytest.approx(float(class_low[3]), abs=1e-12)
    code, out, _ = _cli(capsys, "score", TRUTH, SUB_B, "--ci", "300", "--seed", "2", "--per-class")
    assert f"lwlrap       {float(value):.6f}  95% interval [{float(low):.6f}, {float(high):.6f}] (bootstrap, B=300)" in out
    assert "95% interval" in out.split("per-class lwlrap, worst first:")[1]
    code, out, err = _cli(capsys, "score", TRUTH, SUB_B, "--ci", "0")
    assert code == 2 and "--ci" in err


def test_readme_compare_output_is_current(capsys, monkeypatch):
    import re

    with open(os.path.join(os.path.dirname(DATA), "..", "README.md")) as handle:
        text = handle.read()
    shown = re.search(r"## Error bars and comparing systems.*?```text\n(.*?)```", text, flags=re.S).group(1)
    monkeypatch.chdir(os.path.dirname(os.path.dirname(DATA)))
    code, out, _ = _cli(
        capsys, "compare", "examples/data/sample_truth.csv", "examples/data/sample_submission_b.csv",
        "examples/data/sample_submission.csv", "--per-class",
    )
    assert code == 0 and out == shown


@pytest.mark.parametrize("name", list(METRICS))
def test_states_made_under_inference_mode_update_outside_it(name):
    batches = _batches(2)
    with torch.inference_mode():
        metric = METRICS[name](num_bootstrap=40, bootstrap_seed=2)
    _feed(metric, batches)
    with torch.inference_mode():
        _feed(metric, batches[:1])
    reference = METRICS[name](num_bootstrap=40, bootstrap_seed=2)
    _feed(reference, batches + batches[:1])
    torch.testing.assert_close(metric.bootstrap_samples(), reference.bootstrap_samples(), equal_nan=True)


@pytest.mark.slow
def test_bootstrap_benchmark_runs(tmp_path):
    import json

    from benchmarks.bootstrap import main

    main(["--quick", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "bootstrap-quick.json").read_text())
    row = report["timings"][0]
    assert row["lwlrap_ratio"] > 0 and row["positives"] > 0
    assert (tmp_path / "bootstrap-quick.md").read_text().startswith("# Bootstrap update cost")
