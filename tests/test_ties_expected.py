"""``ties="expected"``: the expectation of lwlrap and LRAP over uniformly random orders of tied scores.

References: every order of each row's tied labels enumerated with exact fractions (small rows, heavy ties, ignored
labels), and the challenge notebook's own algorithm (written here from its code) run over many random tie-breaking
orders, whose mean must come within its standard error.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests.conftest import ENGINE_PATHS
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_lwlrap_per_class,
)
from torch_lwlrap._ranking import use_engine

RULES = ("max", "index", "expected")


def orders_of_row(scores, known):
    """Every ranking of the known labels consistent with the scores (tied labels in every order)."""
    groups = {}
    for k in known:
        groups.setdefault(scores[k], []).append(k)
    levels = [groups[value] for value in sorted(groups, reverse=True)]
    for parts in itertools.product(*(itertools.permutations(group) for group in levels)):
        yield [k for part in parts for k in part]


def brute_force(preds, target, ignore_index=None):
    """Exact expectations over every tie order: (weighted lwlrap, per-class lwlrap, LRAP), as fractions.

    Orders of different rows are independent and every quantity is linear in each row's precisions, so each row's
    mean over its own orders is enough (the joint enumeration would give the same means).
    """
    num_classes = len(preds[0])
    class_sum = [Fraction(0)] * num_classes
    class_count = [0] * num_classes
    sample_scores = []
    for scores, labels in zip(preds, target):
        known = [k for k in range(num_classes) if ignore_index is None or labels[k] != ignore_index]
        positives = {k for k in known if labels[k] == 1}
        mean = {j: Fraction(0) for j in positives}
        orders = list(orders_of_row(scores, known))
        for order in orders:
            hits = 0
            for rank, k in enumerate(order, 1):
                if k in positives:
                    hits += 1
                    mean[k] += Fraction(hits, rank) / len(orders)
        for j, value in mean.items():
            class_sum[j] += value
            class_count[j] += 1
        trivial = not positives or len(positives) == len(known)
        sample_scores.append(Fraction(1) if trivial else sum(mean.values()) / len(positives))
    total = sum(class_count)
    weighted = sum(class_sum) / total if total else None
    per_class = [s / c if c else None for s, c in zip(class_sum, class_count)]
    return weighted, per_class, sum(sample_scores) / len(sample_scores)


_brute_force_cache = {}


def cached_brute_force(key, preds, target, ignore_index):
    if key not in _brute_force_cache:
        _brute_force_cache[key] = brute_force(preds.tolist(), target.tolist(), ignore_index)
    return _brute_force_cache[key]


def close(got, want, rel=1e-12):
    return abs(Fraction(float(got)) - want) <= abs(want) * Fraction(rel)


def heavy_ties(seed, rows, num_classes, levels, ignore):
    generator = torch.Generator().manual_seed(seed)
    preds = torch.randint(levels, (rows, num_classes), generator=generator).to(torch.float64)
    target = torch.randint(2, (rows, num_classes), generator=generator)
    if ignore:
        target[torch.rand(rows, num_classes, generator=generator) < 0.2] = -1
    return preds, target


@pytest.mark.parametrize("engine", ENGINE_PATHS)
@pytest.mark.parametrize("seed,num_classes,levels,ignore", [(0, 7, 1, False), (1, 7, 2, True), (2, 6, 3, True),
                                                            (3, 5, 2, False), (4, 7, 4, True)])
def test_functions_equal_the_mean_over_every_tie_order(engine, seed, num_classes, levels, ignore):
    preds, target = heavy_ties(seed, 12, num_classes, levels, ignore)
    ignore_index = -1 if ignore else None
    weighted, per_class, lrap = cached_brute_force((seed, num_classes, levels, ignore), preds, target, ignore_index)
    for chunk in (None, 2 * num_classes + 1):
        with use_engine(engine, chunk):
            options = dict(ties="expected", ignore_index=ignore_index)
            assert close(multilabel_lwlrap(preds, target, **options), weighted)
            got, _ = multilabel_lwlrap_per_class(preds, target, **options)
            for value, want in zip(got.tolist(), per_class):
                assert (want is None and np.isnan(value)) or close(value, want)
            assert close(multilabel_lrap(preds, target, **options), lrap)
            macro = sum(v for v in per_class if v is not None) / sum(v is not None for v in per_class)
            assert close(multilabel_lwlrap(preds, target, average="macro", **options), macro)


def challenge_lwlrap(truth, scores, rng):
    """The challenge notebook's lwlrap (calculate_per_class_lwlrap), tied scores put in a random order first.

    The notebook ranks with ``np.argsort(scores)[::-1]``, whose order among tied scores is an accident of the sort;
    here the columns are shuffled before a stable sort, so every order of tied labels is equally likely.
    """
    num_samples, num_classes = scores.shape
    precisions_for_samples_by_classes = np.zeros((num_samples, num_classes))
    for sample_num in range(num_samples):
        pos_class_indices = np.flatnonzero(truth[sample_num] > 0)
        if not len(pos_class_indices):
            continue
        shuffle = rng.permutation(num_classes)
        retrieved_classes = shuffle[np.argsort(-scores[sample_num][shuffle], kind="stable")]
        class_rankings = np.zeros(num_classes, dtype=int)
        class_rankings[retrieved_classes] = range(num_classes)
        retrieved_class_true = np.zeros(num_classes, dtype=bool)
        retrieved_class_true[class_rankings[pos_class_indices]] = True
        retrieved_cumulative_hits = np.cumsum(retrieved_class_true)
        precision_at_hits = retrieved_cumulative_hits[class_rankings[pos_class_indices]] / (
            1 + class_rankings[pos_class_indices].astype(float)
        )
        precisions_for_samples_by_classes[sample_num, pos_class_indices] = precision_at_hits
    labels_per_class = np.sum(truth > 0, axis=0)
    weight_per_class = labels_per_class / float(np.sum(labels_per_class))
    per_class_lwlrap = np.sum(precisions_for_samples_by_classes, axis=0) / np.maximum(1, labels_per_class)
    return float(np.sum(per_class_lwlrap * weight_per_class))


def test_saturated_sigmoid_scores_match_the_challenge_code_over_random_tie_orders():
    """Float32 sigmoid outputs saturate at exactly 1.0: the challenge code's score then depends on how its
    sort breaks ties. Its mean over random tie orders converges to ties="expected", not to "max" or "index"."""
    generator = torch.Generator().manual_seed(11)
    truth = (torch.rand(60, 12, generator=generator) < 0.25).to(torch.int64)
    logits = 40 * torch.randn(60, 12, generator=generator) + 25 * truth
    probabilities = torch.sigmoid(logits)  # float32: many exact 1.0 and 0.0
    assert (probabilities == 1).sum() > 50
    rng = np.random.default_rng(5)
    samples = np.array([challenge_lwlrap(truth.numpy(), probabilities.numpy(), rng) for _ in range(600)])
    mean, standard_error = samples.mean(), samples.std(ddof=1) / np.sqrt(len(samples))
    assert standard_error > 0
    expected = multilabel_lwlrap(probabilities, truth, ties="expected").item()
    assert abs(mean - expected) < 4 * standard_error
    for rule in ("max", "index"):  # the other rules are off by many standard errors here
        assert abs(mean - multilabel_lwlrap(probabilities, truth, ties=rule).item()) > 5 * standard_error
    # Scoring the logits instead removes the ties: every rule gives the same value.
    values = [multilabel_lwlrap(logits, truth, ties=rule).item() for rule in RULES]
    assert values[0] == values[1] and abs(values[2] - values[0]) <= 1e-15


@pytest.mark.parametrize("engine", ENGINE_PATHS)
def test_all_rules_agree_without_ties(engine):
    generator = torch.Generator().manual_seed(2)
    preds = torch.randn(50, 40, generator=generator, dtype=torch.float64)
    target = torch.randint(3, (50, 40), generator=generator) - 1
    with use_engine(engine, 301):
        for function in (multilabel_lwlrap, multilabel_lrap):
            values = [function(preds, target, ties=rule, ignore_index=-1).item() for rule in RULES]
            assert values[0] == values[1]
            assert abs(values[2] - values[0]) <= 1e-15 * values[0]


def test_max_is_not_a_bound_over_tie_orders():
    """Two tied positives with no negative in their group score more under "max" than their average over orders
    when a negative scores higher; a positive tied with negatives scores less."""
    truth = torch.tensor([[0, 1, 1, 0]])
    above = torch.tensor([[0.9, 0.5, 0.5, 0.1]])  # a negative above, two tied positives: max gives 2/3 each
    assert multilabel_lwlrap(above, truth).item() > multilabel_lwlrap(above, truth, ties="expected").item()
    # Above every order even: (2/3 + 2/3) / 2 against (1/2 + 2/3) / 2 in either order.
    assert multilabel_lwlrap(above, truth).item() == pytest.approx(2 / 3, abs=1e-15)
    assert max(multilabel_lwlrap(above, truth, ties=rule).item() for rule in ("index", "expected")) < 2 / 3
    tied_with_negative = torch.tensor([[0.5, 0.5, 0.9, 0.1]])
    assert (
        multilabel_lwlrap(tied_with_negative, truth).item()
        < multilabel_lwlrap(tied_with_negative, truth, ties="expected").item()
    )


def test_metrics_accumulate_expected_over_batches():
    """The user's form: batches through update (and forward) equal one call on everything, and the brute force."""
    preds, target = heavy_ties(7, 30, 6, 3, True)
    weighted, _, lrap = brute_force(preds.tolist(), target.tolist(), -1)
    lwlrap_metric = MultilabelLWLRAP(6, ties="expected", ignore_index=-1)
    lrap_metric = MultilabelLRAP(6, ties="expected", ignore_index=-1)
    for start in range(0, 30, 7):
        lwlrap_metric(preds[start : start + 7], target[start : start + 7])
        lrap_metric.update(preds[start : start + 7], target[start : start + 7])
    assert close(lwlrap_metric.compute(), weighted)
    assert close(lrap_metric.compute(), lrap)


def test_unknown_rule_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"`ties` must be one of \('max', 'index', 'expected'\), but got 'mean'"):
        multilabel_lwlrap(torch.zeros(2, 3), torch.ones(2, 3), ties="mean")
    with pytest.raises(ValueError, match="but got 'mean'"):
        MultilabelLWLRAP(3, ties="mean")
