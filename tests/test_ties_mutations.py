"""Tie rules, the tie report and the torch ranking paths on inputs the other suites leave out, each against an
independent reference written here: scikit-learn's LRAP (the "max" rule), per-sample loops from the formulas, and
every order of tied scores enumerated (the "expected" rule and the tie report's range).

* A batch whose only tied positive ties a negative: one tied label, which the report must still flag.
* Rows with more than 16 positives: the torch paths count the positives ahead of each one by a sort of the row's
  positives there, not by comparing every pair.
* Positives scored ``-inf`` in rows with ignored labels, on the sort path.
* The torch paths' own budgets of rows (``TORCH_PATH_CPU_CHUNK_ELEMENTS``, ``TORCH_PATH_CPU_PASS_ELEMENTS``) below
  the size of a formatted chunk, as with a large batch under the default budgets: a short last block, a short pass.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score as sklearn_lrap

from tests.test_tie_report import brute_force_range, tied_positives
from tests.test_ties_expected import brute_force
from torch_lwlrap import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class, tie_report
from torch_lwlrap._ranking import use_engine

TORCH_PATHS = ["sort", "count"]


def _loop_precisions(scores, known, positives, ties):
    """{label: precision} of one row from the definitions (``"max"``: every label at or above; ``"index"``: tied
    labels in column order; ``"expected"``: the mean over the positions K in the group, hypergeometric hits)."""
    out = {}
    for j in positives:
        above = [k for k in known if scores[k] > scores[j]]
        group = [k for k in known if scores[k] == scores[j]]
        a, a_p = len(above), sum(k in positives for k in above)
        g, p = len(group), sum(k in positives for k in group)
        if ties == "max":
            out[j] = Fraction(a_p + p, a + g)
        elif ties == "index":
            before = [k for k in group if k < j]
            out[j] = Fraction(a_p + sum(k in positives for k in before) + 1, a + len(before) + 1)
        else:
            share = Fraction(p - 1, g - 1) if g > 1 else Fraction(0)
            out[j] = sum((Fraction(a_p + 1) + (q - 1) * share) / (a + q) for q in range(1, g + 1)) / g
    return out


def _loop_lwlrap_lrap(preds, target, ties, ignore_index=None):
    """(weighted lwlrap, per-class lwlrap with None where a class has no positive, LRAP) from per-sample loops."""
    num_classes = len(preds[0])
    class_sum, class_count, sample_scores = [Fraction(0)] * num_classes, [0] * num_classes, []
    for scores, labels in zip(preds, target):
        known = [k for k in range(num_classes) if ignore_index is None or labels[k] != ignore_index]
        positives = {k for k in known if labels[k] == 1}
        precisions = _loop_precisions(scores, known, positives, ties)
        for j, value in precisions.items():
            class_sum[j] += value
            class_count[j] += 1
        trivial = not positives or len(positives) == len(known)
        sample_scores.append(Fraction(1) if trivial else sum(precisions.values()) / len(positives))
    per_class = [s / c if c else None for s, c in zip(class_sum, class_count)]
    return sum(class_sum) / sum(class_count), per_class, sum(sample_scores) / len(sample_scores)


def _close(got, want, rel=1e-12):
    return abs(Fraction(float(got)) - Fraction(want)) <= abs(Fraction(want)) * Fraction(rel) + Fraction(1, 10**15)


# ---------------------------------------------------------------------------------------------------------------
# The tie report


@pytest.mark.parametrize("engine", ["auto"] + TORCH_PATHS)
def test_a_single_positive_tied_with_a_negative_is_a_tie(engine):
    """One positive ties one negative and nothing else ties: one tied label, and the rule moves the value."""
    preds = torch.tensor([[0.9, 0.5, 0.5, 0.1], [0.3, 0.8, 0.2, 0.6]])
    target = torch.tensor([[0, 1, 0, 0], [1, 0, 0, 1]])
    rows, labels = preds.tolist(), target.tolist()
    assert tied_positives(rows, labels) == (1, 3)
    low, high = brute_force_range(rows, labels)
    mean = brute_force(rows, labels)[0]
    with use_engine(engine):
        report = tie_report(preds, target)
    assert (report.label_count, report.tied_label_count) == (3, 1)
    assert report.has_ties
    assert report.tied_share == pytest.approx(1 / 3, rel=1e-15)
    assert _close(report.lwlrap_best, high) and _close(report.lwlrap_worst, low)
    assert _close(report.lwlrap_expected, mean)
    assert report.lwlrap_worst < report.lwlrap_best


# ---------------------------------------------------------------------------------------------------------------
# Infinite scores beside ignored labels


def _sklearn_lrap_without_ignored(preds, target, ignore_index):
    """scikit-learn's LRAP with each row's ignored labels removed from that row (one call per row, then the mean)."""
    scores = []
    for row_scores, labels in zip(preds, target):
        known = [k for k in range(len(labels)) if labels[k] != ignore_index]
        y = np.array([[int(labels[k] == 1) for k in known]])
        levels = sorted({row_scores[k] for k in known})  # scikit-learn refuses infinite scores: their ranks instead
        s = np.array([[levels.index(row_scores[k]) for k in known]], dtype=np.float64)
        scores.append(sklearn_lrap(y, s))
    return float(np.mean(scores))


@pytest.mark.parametrize("engine", ["auto"] + TORCH_PATHS)
@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_positives_scored_minus_infinity_beside_ignored_labels(engine, ties):
    """A positive at -inf ranks below every known label it does not tie; ignored labels, wherever their scores lie
    (-inf among them), count for nothing."""
    inf = float("inf")
    preds = torch.tensor([
        [-inf, 0.5, -inf, 0.2, -inf, 0.9],
        [0.1, -inf, -inf, -inf, 0.3, 0.3],
        [-inf, -inf, 0.7, 0.4, 0.4, -inf],
        [inf, -inf, 0.0, -inf, inf, 0.6],
    ])
    target = torch.tensor([
        [1, 0, -1, 1, -1, 0],
        [0, 1, -1, 1, 1, -1],
        [-1, 1, 0, 1, -1, 1],
        [1, -1, 0, 1, -1, 0],
    ])
    rows, labels = preds.tolist(), target.tolist()
    weighted, per_class, lrap = _loop_lwlrap_lrap(rows, labels, ties, -1)
    if ties == "max":
        assert _close(lrap, _sklearn_lrap_without_ignored(rows, labels, -1))
    with use_engine(engine):
        assert _close(multilabel_lwlrap(preds, target, ties=ties, ignore_index=-1), weighted)
        assert _close(multilabel_lrap(preds, target, ties=ties, ignore_index=-1), lrap)
        got, _ = multilabel_lwlrap_per_class(preds, target, ties=ties, ignore_index=-1)
    for value, want in zip(got.tolist(), per_class):
        assert (want is None and np.isnan(value)) or _close(value, want)


# ---------------------------------------------------------------------------------------------------------------
# The torch paths' own blocks of rows, and rows with many positives


def _tied_case(seed, rows, num_classes, levels, density, ignore):
    generator = torch.Generator().manual_seed(seed)
    preds = torch.randint(levels, (rows, num_classes), generator=generator).to(torch.float32)
    target = (torch.rand(rows, num_classes, generator=generator) < density).to(torch.int64)
    if ignore:
        target[torch.rand(rows, num_classes, generator=generator) < 0.15] = -1
    return preds, target


def _check_against_loops(preds, target, ties, ignore_index):
    rows, labels = preds.tolist(), target.tolist()
    weighted, per_class, lrap = _loop_lwlrap_lrap(rows, labels, ties, ignore_index)
    if ties == "max" and ignore_index is None:
        assert _close(lrap, sklearn_lrap(target.numpy(), preds.numpy()))
    assert _close(multilabel_lwlrap(preds, target, ties=ties, ignore_index=ignore_index), weighted)
    assert _close(multilabel_lrap(preds, target, ties=ties, ignore_index=ignore_index), lrap)
    got, _ = multilabel_lwlrap_per_class(preds, target, ties=ties, ignore_index=ignore_index)
    for value, want in zip(got.tolist(), per_class):
        assert (want is None and np.isnan(value)) or _close(value, want)


@pytest.mark.parametrize("engine", TORCH_PATHS)
@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("ignore", [False, True], ids=["all-known", "ignore"])
def test_torch_paths_with_their_own_small_blocks_of_rows(monkeypatch, engine, ties, ignore):
    """The torch paths rank a formatted chunk in blocks of rows (``TORCH_PATH_CPU_CHUNK_ELEMENTS``) and count it in
    passes of rows (``TORCH_PATH_CPU_PASS_ELEMENTS``), budgets of their own: a chunk of 11 rows in blocks of 4 (the
    last one short) and passes of 3, every row and every positive counted once."""
    from torch_lwlrap import _engine_config

    num_classes = 6
    preds, target = _tied_case(3, 11, num_classes, 3, 0.5, ignore)
    monkeypatch.setattr(_engine_config, "TORCH_PATH_CPU_CHUNK_ELEMENTS", 4 * num_classes)
    monkeypatch.setattr(_engine_config, "TORCH_PATH_CPU_PASS_ELEMENTS", 3 * num_classes)
    monkeypatch.setattr(_engine_config, "LABEL_COUNTS_CHUNK_ELEMENTS", 4 * num_classes)
    with use_engine(engine):
        _check_against_loops(preds, target, ties, -1 if ignore else None)


@pytest.mark.parametrize("engine", TORCH_PATHS)
@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("ignore", [False, True], ids=["all-known", "ignore"])
def test_torch_paths_on_rows_with_more_than_sixteen_positives(engine, ties, ignore):
    """Rows of 48 labels, most of them positive, in few score levels: more than 16 positives a row (the torch paths
    then sort the row's positives to count those ahead of each one), tie groups of about ten labels and more than
    32 labels above some positives (the "expected" rule's series)."""
    preds, target = _tied_case(5, 9, 48, 5, 0.7, ignore)
    assert ((target == 1).sum(1) > 16).all()
    for chunk in (None, 2 * 48 + 5):
        with use_engine(engine, chunk):
            _check_against_loops(preds, target, ties, -1 if ignore else None)
