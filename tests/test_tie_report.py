"""``tie_report``: counts of tied positives and lwlrap's exact range over tie orders, against brute force."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from tests.conftest import ENGINE_PATHS
from tests.reference import naive_lwlrap
from tests.test_ties_expected import heavy_ties, orders_of_row
from torch_lwlrap import multilabel_lwlrap, tie_report
from torch_lwlrap._ranking import use_engine


def brute_force_range(preds, target, ignore_index=None):
    """(min, max) of weighted lwlrap over every order of tied labels, rows chosen independently, as fractions."""
    low = high = Fraction(0)
    count = 0
    for scores, labels in zip(preds, target):
        known = [k for k in range(len(scores)) if ignore_index is None or labels[k] != ignore_index]
        positives = {k for k in known if labels[k] == 1}
        count += len(positives)
        totals = []
        for order in orders_of_row(scores, known):
            hits, total = 0, Fraction(0)
            for rank, k in enumerate(order, 1):
                if k in positives:
                    hits += 1
                    total += Fraction(hits, rank)
            totals.append(total)
        low += min(totals)
        high += max(totals)
    return low / count, high / count


def tied_positives(preds, target, ignore_index=None):
    tied = count = 0
    for scores, labels in zip(preds, target):
        known = [k for k in range(len(scores)) if ignore_index is None or labels[k] != ignore_index]
        for j in known:
            if labels[j] == 1:
                count += 1
                tied += any(scores[k] == scores[j] for k in known if k != j)
    return tied, count


@pytest.mark.parametrize("engine", ENGINE_PATHS)
@pytest.mark.parametrize("seed,num_classes,levels,ignore", [(0, 7, 1, False), (1, 7, 2, True), (2, 6, 3, True),
                                                            (4, 7, 5, True)])
def test_range_counts_and_values_against_brute_force(engine, seed, num_classes, levels, ignore):
    preds, target = heavy_ties(seed, 10, num_classes, levels, ignore)
    ignore_index = -1 if ignore else None
    rows, labels = preds.tolist(), target.tolist()
    low, high = brute_force_range(rows, labels, ignore_index)
    tied, count = tied_positives(rows, labels, ignore_index)
    with use_engine(engine, 3 * num_classes):
        report = tie_report(preds, target, ignore_index=ignore_index)
    assert (report.tied_label_count, report.label_count) == (tied, count)
    assert report.tied_share == tied / count
    assert abs(Fraction(report.lwlrap_worst) - low) <= low * Fraction(1, 10**12)
    assert abs(Fraction(report.lwlrap_best) - high) <= high * Fraction(1, 10**12)
    assert report.lwlrap_max == pytest.approx(naive_lwlrap(rows, labels, "max", ignore_index), abs=1e-12)
    assert report.lwlrap_expected == pytest.approx(naive_lwlrap(rows, labels, "expected", ignore_index), abs=1e-12)
    assert report.lwlrap_worst <= report.lwlrap_expected <= report.lwlrap_best
    assert report.lwlrap_worst <= report.lwlrap_max <= report.lwlrap_best
    assert report.has_ties == (tied > 0)


@pytest.mark.parametrize("engine", ENGINE_PATHS)
def test_without_ties_every_value_is_the_same(engine):
    generator = torch.Generator().manual_seed(4)
    preds = torch.randn(40, 25, generator=generator, dtype=torch.float64)
    target = torch.randint(2, (40, 25), generator=generator)
    with use_engine(engine):
        report = tie_report(preds, target)
    assert not report.has_ties and report.tied_share == 0
    value = multilabel_lwlrap(preds, target).item()
    for got in (report.lwlrap_max, report.lwlrap_expected, report.lwlrap_best, report.lwlrap_worst):
        assert got == pytest.approx(value, rel=1e-15)


def test_saturated_sigmoid_report_and_logits():
    """The user's case: sigmoid probabilities in float32 tie at 1.0; the logits they came from do not."""
    generator = torch.Generator().manual_seed(1)
    target = (torch.rand(200, 20, generator=generator) < 0.1).long()
    logits = 30 * torch.randn(200, 20, generator=generator) + 20 * target
    report = tie_report(torch.sigmoid(logits), target)
    assert report.has_ties and report.lwlrap_worst < report.lwlrap_best
    assert not tie_report(logits, target).has_ties
    assert set(report.as_dict()) == {"label_count", "tied_label_count", "tied_share", "lwlrap_max",
                                     "lwlrap_expected", "lwlrap_best", "lwlrap_worst"}


def test_no_positive_and_bad_input():
    report = tie_report(torch.zeros(2, 3), torch.zeros(2, 3))
    assert report.label_count == 0 and math.isnan(report.tied_share) and math.isnan(report.lwlrap_best)
    with pytest.raises(ValueError, match="NaN"):
        tie_report(torch.tensor([[0.5, float("nan")]]), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="target"):
        tie_report(torch.zeros(2, 3), torch.full((2, 3), 2))
